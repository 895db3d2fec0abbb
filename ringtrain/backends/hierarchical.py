"""Shared memory within a host, Gloo across hosts: the CPU backend when ranks share a machine.

For each process set, the members on one host share a segment (see
:mod:`ringtrain.backends.shm`); a set on one host runs every collective through it. A set spread
over hosts allreduces and allgathers hierarchically (within each host, between one leader per
host on Gloo, then from each leader to its host; docs/shared_memory.md); its other collectives,
and every CUDA tensor, go through the wrapped :class:`TorchDistributedBackend`.
"""

from __future__ import annotations

import logging
import pickle
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ringtrain.backends.shm import ShmGroup
from ringtrain.backends.shm_segment import (
    MIN_SLOT_BYTES,
    Member,
    Segment,
    align,
    check_space,
    choose_slot_bytes,
    free_bytes,
    segment_bytes,
)
from ringtrain.backends.torch_dist import (
    TorchDistributedBackend,
    allgather_on,
    start_allreduce_on,
)
from ringtrain.op_types import ReduceOp
from ringtrain.shm_names import SHM_DIR, segment_path

log = logging.getLogger(__name__)

#: The control segment's slots: negotiation's counts and pickled metas are small.
CONTROL_SLOT_BYTES = 64 << 10


@dataclass(frozen=True)
class RankPlace:
    """Where a rank runs, as this backend groups ranks.

    Attributes:
        host: ranks with equal ``host`` share memory (a host name with the machine's boot id,
            say); each rank that must not share any gets a unique one.
        pid: its process id (its peers check that it lives while they wait for it).
        start_ticks: its start time in clock ticks since boot (-1: unknown).
    """

    host: str
    pid: int
    start_ticks: int


@dataclass
class _SetComm:
    local: tuple[int, ...]  # the set's members on this rank's host, in rank order
    hosts: tuple[tuple[int, ...], ...]  # the set's members by host, hosts in leader order
    shm: ShmGroup | None  # None: this rank alone on its host in the set
    whole: bool  # every member of the set is on this host
    cross: Any  # the Gloo group of the hosts' leaders (hierarchical allreduce), or None
    leader: bool

    def close(self) -> None:
        if self.shm is not None:
            self.shm.close()
        if self.cross is not None:
            dist.destroy_process_group(self.cross)


class HierarchicalBackend:
    """The :class:`~ringtrain.backends.base.CollectiveBackend` of CPU ranks that share hosts.

    Construct it on every rank right after the wrapped backend, before anything else runs
    collectives (it agrees on a token over the control channel).

    Args:
        gloo: the torch.distributed backend (control channel, cross-host traffic, CUDA).
        run_id: the launch's id (segments are named after it, for the launcher's sweep).
        hierarchical: allreduce sets that span hosts hierarchically (otherwise flat on Gloo).
        slot_bytes: bytes per member per buffer of each data segment (a multiple of 64);
            default: ``shm_segment.choose_slot_bytes``.
        timeout_s: how long a collective waits for a live peer before failing.
        setup_timeout_s: how long a rank waits for its host's first rank to create a segment.

    Raises:
        SharedMemorySpaceError: ``directory`` cannot hold this rank's world segment.
    """

    def __init__(self, gloo: TorchDistributedBackend, places: Sequence[RankPlace], run_id: str,
                 hierarchical: bool = True, slot_bytes: int | None = None,
                 timeout_s: float = 7200.0, setup_timeout_s: float = 30.0,
                 directory: Path = SHM_DIR):
        if slot_bytes is not None and (slot_bytes <= 0 or slot_bytes % 64):
            raise ValueError(f"slot_bytes={slot_bytes} must be a positive multiple of 64")
        self.rank = gloo.rank
        self.size = gloo.size
        self._gloo = gloo
        self._places = tuple(places)
        self._run_id = run_id
        self._hierarchical = hierarchical
        self._slot_bytes = slot_bytes
        self._timeout_s = timeout_s
        self._setup_timeout_s = setup_timeout_s
        self._directory = directory
        # The ranks of a host agree on the space free in their /dev/shm (the least any saw),
        # from which every segment's slot size follows alike on each.
        gathered = gloo.control_allgather((secrets.token_hex(4), free_bytes(directory)))
        self._token = gathered[0][0]
        host = self._places[self.rank].host
        self._host_free = min(free for (_, free), place in zip(gathered, self._places)
                              if place.host == host)
        # Every rank checks the space (all of a host see the same /dev/shm), so a host's ranks
        # all fail init() with the same message instead of waiting for a segment never made.
        mates = sum(p.host == host for p in self._places)
        if mates > 1:
            check_space(directory, segment_bytes(mates, self._slot_for(mates)))
        self._added = 0
        self._sets: dict[tuple[int, ...], _SetComm] = {}
        world = tuple(range(self.size))
        # With every rank on this host, negotiation goes through a segment of its own too (only
        # the engine thread calls the control channel, in the same order on every rank).
        self._control: ShmGroup | None = None
        self._raw: list[Segment] = []  # segments mapped for others (the engine's doorbell)
        if len({p.host for p in self._places}) == 1:
            self._control = ShmGroup(self._map_segment(world, "control", CONTROL_SLOT_BYTES))
        self._add_shm(world)

    @property
    def one_host(self) -> bool:
        """Whether every rank of the world is on this host (its control plane may then go
        through shared memory)."""
        return self._control is not None

    def map_world_segment(self, key: str, data_bytes: int) -> Segment:
        """Map a segment of every rank of the world with at least ``data_bytes`` of data and its
        file descriptor kept open (collective: every rank calls it, in the same order). Closed
        with the backend.

        Raises:
            ValueError: the world is not on one host (see :attr:`one_host`).
            SharedMemorySpaceError: ``/dev/shm`` cannot hold it.
        """
        if not self.one_host:
            raise ValueError("a world segment needs every rank on this host")
        slot_bytes = align(-(-data_bytes // (2 * self.size)))
        check_space(self._directory, segment_bytes(self.size, slot_bytes))
        segment = self._map_segment(tuple(range(self.size)), key, slot_bytes, keep_fd=True)
        self._raw.append(segment)
        return segment

    @property
    def shares_memory(self) -> bool:
        """Whether any of this rank's sets moves data through shared memory."""
        return any(s.shm is not None for s in self._sets.values())

    # -- sets ------------------------------------------------------------------------------------

    def add_set(self, ranks: tuple[int, ...]) -> None:
        self._gloo.add_set(ranks)
        self._add_shm(ranks)

    def _add_shm(self, ranks: tuple[int, ...]) -> None:
        """Map this rank's segment of the set (collective over the whole world)."""
        self._added += 1
        hosts: dict[str, list[int]] = {}
        for r in ranks:
            hosts.setdefault(self._places[r].host, []).append(r)
        leaders = [members[0] for members in hosts.values()]
        cross = None
        if len(hosts) > 1 and self._hierarchical:
            cross = dist.new_group(leaders, backend="gloo")  # every rank of the world calls it
        if self.rank not in ranks:
            return
        local = tuple(hosts[self._places[self.rank].host])
        shm = None
        if len(local) > 1:
            shm = ShmGroup(self._map_segment(local, f"s{self._added}-r{local[0]}"))
            slot = shm.segment.slot_bytes
            if self._slot_bytes is None and slot > MIN_SLOT_BYTES:
                step = shm.choose_step([MIN_SLOT_BYTES, slot])
                log.debug("shared-memory set %s: steps of %d MiB", local, step >> 20)
        self._sets[ranks] = _SetComm(local=local, hosts=tuple(map(tuple, hosts.values())),
                                     shm=shm, whole=len(hosts) == 1,
                                     cross=cross if self.rank in leaders else None,
                                     leader=self.rank in leaders)

    def _map_segment(self, local: tuple[int, ...], key: str, slot_bytes: int | None = None,
                     keep_fd: bool = False) -> Segment:
        members = [Member(r, self._places[r].pid, self._places[r].start_ticks) for r in local]
        path = segment_path(self._run_id, self._token, key, self._directory)
        me = local.index(self.rank)
        slot_bytes = slot_bytes or self._slot_for(len(local))
        if me == 0:
            segment = Segment.create(path, members, slot_bytes, self._timeout_s, keep_fd)
        else:
            segment = Segment.attach(path, members, me, slot_bytes, self._timeout_s,
                                     self._setup_timeout_s, keep_fd)
        segment.mark_attached()
        if me == 0:
            try:
                segment.wait_attached()
            finally:
                segment.unlink()  # mapped everywhere (or never will be): no file to leak
        return segment

    def _slot_for(self, members: int) -> int:
        """The slot size of a data segment of ``members`` ranks of this host."""
        if self._slot_bytes is not None:
            return self._slot_bytes
        return choose_slot_bytes(members, self._host_free)

    def remove_set(self, ranks: tuple[int, ...]) -> None:
        comm = self._sets.pop(ranks, None)
        if comm is not None:
            comm.close()
        self._gloo.remove_set(ranks)

    def close(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
        for segment in self._raw:
            segment.close()
        self._raw.clear()
        for ranks in list(self._sets):
            self._sets.pop(ranks).close()
        self._gloo.close()

    # -- the control channel ---------------------------------------------------------------------

    def control_allreduce(self, counts: torch.Tensor) -> None:
        if self._control is None:
            return self._gloo.control_allreduce(counts)
        _guarded(self._control, self._control.allreduce_, counts, ReduceOp.SUM)

    def control_allgather(self, obj: Any) -> list[Any]:
        if self._control is None:
            return self._gloo.control_allgather(obj)
        return _allgather_pickled(self._control, obj, self.size)

    # -- collectives -----------------------------------------------------------------------------

    def _local(self, tensor: torch.Tensor, ranks: tuple[int, ...]
               ) -> tuple[_SetComm, ShmGroup] | None:
        """The set's communicators and segment if this collective can use shared memory on
        the whole set."""
        comm = self._sets.get(ranks)
        if comm is None or comm.shm is None or tensor.is_cuda or not comm.whole:
            return None
        return comm, comm.shm

    def start_allreduce(self, tensor: torch.Tensor, op: ReduceOp,
                        ranks: tuple[int, ...]) -> Callable[[], None]:
        comm = self._sets.get(ranks)
        if comm is None or tensor.is_cuda or (comm.whole and comm.shm is None):
            return self._gloo.start_allreduce(tensor, op, ranks)
        shm = comm.shm
        if comm.whole:
            assert shm is not None  # a whole set without a segment went to Gloo above
            _guarded(shm, shm.allreduce_, tensor, op)
            return _done
        if not self._hierarchical:  # flat on Gloo across hosts
            return self._gloo.start_allreduce(tensor, op, ranks)
        # Across hosts: each host's sum on shared memory, the leaders' on Gloo, handed out.
        if shm is not None:
            _guarded(shm, shm.allreduce_, tensor, op)
        cross_wait = start_allreduce_on(comm.cross, tensor, op) if comm.leader else _done

        def wait() -> None:
            cross_wait()
            if shm is not None:
                _guarded(shm, shm.broadcast_, tensor, 0)

        return wait

    def allreduces_in_place(self, ranks: tuple[int, ...], device: str) -> bool:
        # Only a set within this host copies straight between tensors and its segment; a set
        # spanning hosts sends a flat buffer to the other leaders, and CUDA goes to NCCL.
        comm = self._sets.get(ranks)
        return device == "cpu" and comm is not None and comm.whole and comm.shm is not None

    def start_allreduce_list(self, tensors: Sequence[torch.Tensor], op: ReduceOp,
                             ranks: tuple[int, ...]) -> Callable[[], None]:
        if not self.allreduces_in_place(ranks, tensors[0].device.type if tensors else "cpu"):
            raise NotImplementedError(f"the set {list(ranks)} reduces one flat tensor at a time "
                                      "here (it spans hosts, or its tensors are on a GPU)")
        shm = self._sets[ranks].shm
        assert shm is not None  # (allreduces_in_place holds)
        _guarded(shm, shm.allreduce_list_, tensors, op)
        return _done

    def allgather(self, output: torch.Tensor, tensor: torch.Tensor,
                  ranks: tuple[int, ...]) -> None:
        local = self._local(tensor, ranks)
        if local is not None:
            shm = local[1]
            _guarded(shm, shm.allgather, output, tensor)
            return
        comm = self._sets.get(ranks)
        if comm is None or tensor.is_cuda or comm.whole or not self._hierarchical:
            return self._gloo.allgather(output, tensor, ranks)
        self._allgather_across(comm, output, tensor, ranks)

    def _allgather_across(self, comm: _SetComm, output: torch.Tensor, tensor: torch.Tensor,
                          ranks: tuple[int, ...]) -> None:
        """Allgather over hosts: each host's inputs through its segment, the hosts' blocks
        between the leaders on Gloo (padded to the largest host), all of it from each leader to
        its host, then into set order (a host's members need not be consecutive ranks)."""
        flat = tensor.reshape(-1)
        length = flat.numel()
        widest = max(len(members) for members in comm.hosts)
        block = torch.empty(widest * length, dtype=flat.dtype)
        if comm.shm is not None:
            _guarded(comm.shm, comm.shm.allgather, block[:len(comm.local) * length], flat)
        else:
            block[:length].copy_(flat)
        everything = torch.empty(len(comm.hosts) * widest * length, dtype=flat.dtype)
        if comm.leader:
            allgather_on(comm.cross, everything, block)
        if comm.shm is not None:
            _guarded(comm.shm, comm.shm.broadcast_, everything, 0)
        out = output.view(-1)
        index = {rank: i for i, rank in enumerate(ranks)}
        for h, members in enumerate(comm.hosts):
            for i, rank in enumerate(members):
                at = index[rank] * length
                out[at:at + length].copy_(everything[(h * widest + i) * length:][:length])

    def broadcast_(self, tensor: torch.Tensor, root: int, ranks: tuple[int, ...]) -> None:
        local = self._local(tensor, ranks)
        if local is None:
            return self._gloo.broadcast_(tensor, root, ranks)
        comm, shm = local
        # (the path may not depend on this rank's layout: every member must take the same one)
        wire = tensor if tensor.is_contiguous() else tensor.contiguous()
        _guarded(shm, shm.broadcast_, wire, comm.local.index(root))
        if wire is not tensor:
            tensor.copy_(wire)

    def alltoall(self, output: torch.Tensor, tensor: torch.Tensor, output_splits: Sequence[int],
                 input_splits: Sequence[int], ranks: tuple[int, ...]) -> None:
        local = self._local(tensor, ranks)
        if local is None:
            return self._gloo.alltoall(output, tensor, output_splits, input_splits, ranks)
        shm = local[1]
        _guarded(shm, shm.alltoall, output, tensor.contiguous(), output_splits, input_splits)

    def reducescatter(self, output: torch.Tensor, tensor: torch.Tensor, op: ReduceOp,
                      ranks: tuple[int, ...]) -> None:
        local = self._local(tensor, ranks)
        if local is None:
            return self._gloo.reducescatter(output, tensor, op, ranks)
        shm = local[1]
        _guarded(shm, shm.reducescatter, output, tensor, op)


def _allgather_pickled(control: ShmGroup, obj: Any, size: int) -> list[Any]:
    """Every rank's ``obj``, pickled through the control segment: the lengths first, then the
    pickles padded to the longest."""
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    sizes = torch.empty(size, dtype=torch.int64)
    _guarded(control, control.allgather, sizes, torch.tensor([data.numel()]))
    longest = int(sizes.max())
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[:data.numel()] = data
    gathered = torch.empty(size * longest, dtype=torch.uint8)
    _guarded(control, control.allgather, gathered, padded)
    return [pickle.loads(gathered[r * longest:r * longest + int(sizes[r])].numpy().tobytes())
            for r in range(size)]


def _guarded(shm: ShmGroup | None, call: Callable[..., None], *args: Any) -> None:
    """Run a shared-memory collective; if it fails here, tell the peers so they fail too
    instead of waiting for this rank."""
    assert shm is not None
    try:
        call(*args)
    except BaseException:
        shm.segment.abort()
        raise


def _done() -> None:
    pass
