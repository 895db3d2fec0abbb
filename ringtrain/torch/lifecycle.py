"""Joining and leaving the job (``init``/``shutdown``) and registering process sets.

``init()`` learns the process's place from the worker contract (``contract/env.py``), joins the
rendezvous store, creates the communicators, starts the engine and makes the result the active
:class:`~ringtrain.torch.runtime.Runtime`. A world of one uses no sockets at all.
"""

from __future__ import annotations

import atexit
import datetime
import ipaddress
import logging
import os
import platform
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace

import torch
import torch.distributed as dist

from ringtrain.backends.base import CollectiveBackend
from ringtrain.backends.hierarchical import HierarchicalBackend, RankPlace
from ringtrain.backends.local import LocalBackend
from ringtrain.backends.torch_dist import TorchDistributedBackend
from ringtrain.contract import elastic_rendezvous
from ringtrain.contract.env import WorkerEnv, read_worker_env, store_prefix
from ringtrain.engine.doorbell import Doorbell, LocalDoorbell, StoreDoorbell
from ringtrain.engine.engine import Engine
from ringtrain.engine.peers import PeerProcess
from ringtrain.engine.shm_doorbell import STORES_IN_ORDER, ShmDoorbell, bytes_needed
from ringtrain.errors import HorovodInternalError
from ringtrain.log_level import apply_log_level
from ringtrain.torch import runtime
from ringtrain.torch.process_sets import ProcessSet
from ringtrain.torch.topology import Topology, from_hostnames

log = logging.getLogger(__name__)

# Collectives may legitimately wait long (a slow rank writing a checkpoint); a dead peer is
# detected by its closed connection, not by this timeout.
_COLLECTIVE_TIMEOUT = datetime.timedelta(hours=2)
#: init() looks this often whether its peers arrived. It polls rather than waiting on the store
#: in slices: signal handlers run between looks, and a store wait that times out makes c10d
#: print a warning ("waitForInput ... timed out") for every rank that comes later.
_ARRIVAL_POLL_S = 0.05


_lock = threading.RLock()
_generation = 0
_elastic_generation: int | None = None  # the last elastic world this process joined
_stores: dict[tuple[str, int], dist.TCPStore] = {}
_atexit_registered = False


def init(comm: Sequence[int] | None = None, process_sets: Iterable | None = None) -> None:
    """Join the job: connect to every other rank and start the background engine.

    Args:
        comm: optional list of global ranks that form this world (Horovod accepts an MPI
            communicator here; ringtrain, which has no MPI, accepts the list of its ranks).
        process_sets: ``ProcessSet`` objects to register on every rank right away.

    Raises:
        ConfigError: the launcher's environment is malformed or incomplete.
        ValueError: this rank is not part of ``comm``.
    """
    global _generation, _atexit_registered
    with _lock:
        if runtime.is_initialized():
            return
        env = read_worker_env()
        apply_log_level(env.knobs.log_level)
        if env.elastic is not None:
            if comm is not None:
                raise ValueError("init(comm=...) cannot be used in an elastic launch, whose "
                                 "worlds the launcher forms")
            env = _join_elastic_world(env)
        rank, size = env.rank, env.size
        if comm is not None:
            members = sorted(set(int(r) for r in comm))
            if rank not in members:
                raise ValueError(f"rank {rank} is not in comm={members}; only the listed ranks "
                                 "may call init() with it")
            rank, size = members.index(rank), len(members)
        _generation += 1
        backend, doorbell, processes, owns = _connect(env, rank, size, comm)
        topology = _topology(env, rank, [p.host for p in processes])
        shm = isinstance(backend, HierarchicalBackend) and backend.shares_memory
        # A caller may run its own lone cached operation only where waiting for a bell is
        # cheap (the shared-memory doorbell): on the store it would be a blocking round trip.
        engine = Engine(backend, env.knobs, doorbell, backend_name="SHM" if shm else "GLOO",
                        peers=processes, inline=isinstance(doorbell, ShmDoorbell))
        if env.knobs.threads_per_rank is not None:  # --threads-per-rank (or its autotuned best)
            torch.set_num_threads(env.knobs.threads_per_rank)
        runtime.activate(runtime.Runtime(env=env, topology=topology, backend=backend,
                                         engine=engine, owns_default_group=owns,
                                         world_generation=_elastic_generation))
        if env.knobs.timeline_filename and rank == 0:
            engine.timeline.start(env.knobs.timeline_filename, env.knobs.timeline_mark_cycles)
        log.debug("rank %d of %d on %s (started by %s): engine running, %s", rank, size,
                  env.hostname, env.launcher, env.knobs)
        if not _atexit_registered:
            atexit.register(shutdown)
            _atexit_registered = True
    for process_set in process_sets or ():
        add_process_set(process_set)


def shutdown() -> None:
    """Stop the engine on every rank and release the communicators; ``init()`` may follow."""
    with _lock:
        rt = runtime.activate(None)
        if rt is None:
            return
        rt.engine.shutdown()
        log.debug("rank %d: engine stopped", rt.topology.rank)
        if rt.engine.running:
            return  # a peer is unreachable: leave the communicators to process exit
        rt.backend.close()
        if rt.owns_default_group and dist.is_initialized():
            dist.destroy_process_group()


def add_process_set(process_set: ProcessSet | Iterable[int]) -> ProcessSet:
    """Register a process set on every rank (a collective: all ranks call it in the same order).

    Args:
        process_set: a ``ProcessSet`` or a list of ranks.

    Returns:
        The registered ``ProcessSet``.

    Raises:
        ValueError: ranks out of range, or a set with the same ranks is already registered.
    """
    rt = runtime.current()
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    ranks = tuple(process_set.ranks or ())
    size = rt.topology.size
    if not ranks or ranks[0] < 0 or ranks[-1] >= size:
        raise ValueError(f"process set ranks {list(ranks)} must be non-empty and lie in "
                         f"[0, {size})")
    if ranks == tuple(range(size)) or ranks in rt.process_sets.values():
        raise ValueError(f"a process set with ranks {list(ranks)} is already registered")
    with _lock:
        rt.backend.add_set(ranks)
        process_set.process_set_id = rt.next_set_id
        rt.process_sets[rt.next_set_id] = ranks
        rt.next_set_id += 1
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set on every rank (collective). Returns whether it was registered."""
    rt = runtime.current()
    set_id = process_set.process_set_id
    if set_id == 0:
        raise ValueError("the global process set cannot be removed")
    if set_id is None:
        return False  # not registered
    with _lock:
        ranks = rt.process_sets.pop(set_id, None)
        if ranks is None:
            return False
        rt.backend.remove_set(ranks)
        process_set.process_set_id = None
    return True


def _connect(env: WorkerEnv, rank: int, size: int, comm: Sequence[int] | None
             ) -> tuple[CollectiveBackend, Doorbell, list[PeerProcess], bool]:
    """The world's backend and doorbell, every rank's process, and whether ringtrain created
    torch.distributed's default group (a world of one uses no sockets at all)."""
    if size == 1:
        return LocalBackend(), LocalDoorbell(), [PeerProcess.this(env.hostname)], False
    owns, prefix = _init_default_group(env, rank, size, comm)
    gloo = TorchDistributedBackend(use_nccl=_nccl_usable())
    doorbell: Doorbell = _store_doorbell(env, prefix)
    processes = gloo.control_allgather(PeerProcess.this(env.hostname))
    backend = _cpu_backend(gloo, env, processes)
    if isinstance(backend, HierarchicalBackend) and backend.one_host:
        # Every rank on this host: bells and counters in shared memory, the store only for
        # counters once the segment's table is full.
        doorbell = ShmDoorbell(backend.map_world_segment("bells", bytes_needed(size)),
                               fallback=doorbell)
    return backend, doorbell, processes, owns


def _init_default_group(env: WorkerEnv, rank: int, size: int,
                        comm: Sequence[int] | None) -> tuple[bool, str]:
    """Initialise torch.distributed's default group.

    Returns:
        Whether ringtrain created it (False if the user already had one), and the store prefix
        of this initialisation.
    """
    # Every member of an elastic world agrees on its generation; a process's own count of its
    # inits would differ between survivors and new workers.
    generation = _generation if env.elastic is None else _elastic_generation
    assert generation is not None  # an elastic worker has joined its world before this
    prefix = store_prefix(env.run_id, generation)
    if comm is not None:
        prefix += "comm." + ".".join(map(str, sorted(comm))) + "/"
    if dist.is_initialized():
        if dist.get_world_size() != size or comm is not None:
            raise ValueError("torch.distributed is already initialised with a different world; "
                             "call hvd.init() without comm, or destroy that process group first")
        return False, prefix
    if "GLOO_SOCKET_IFNAME" not in os.environ and _is_loopback(env.master_addr):
        # Every rank is on this host: keep Gloo's listening sockets on loopback.
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    store = dist.PrefixStore(prefix, _store(env, rank, size))
    _await_ranks(store, rank, size, env.start_timeout_s)
    backend = "cpu:gloo,cuda:nccl" if _nccl_usable() else "gloo"
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=size,
                            timeout=_COLLECTIVE_TIMEOUT)
    return True, prefix


def _await_ranks(store: dist.Store, rank: int, size: int, timeout_s: float) -> None:
    """Announce this rank and wait until every rank of the world has announced itself (in
    Python: torch.distributed's rendezvous would wait in C++, where no signal handler runs).

    Raises:
        HorovodInternalError: ranks that did not call ``init()`` within the start timeout
            (``--start-timeout``, ``HOROVOD_START_TIMEOUT``), named.
    """
    store.set(f"arrived/{rank}", b"1")  # type: ignore[arg-type]  # stub says str; bytes work
    keys = [f"arrived/{r}" for r in range(size)]
    deadline = time.monotonic() + timeout_s
    while not store.check(keys):
        if time.monotonic() >= deadline:
            missing = [r for r, key in enumerate(keys) if not store.check([key])]
            raise HorovodInternalError(
                f"rank(s) {missing} did not call hvd.init() within {timeout_s:g} s of rank "
                f"{rank} (the start timeout, --start-timeout or HOROVOD_START_TIMEOUT): they "
                "failed or are still starting")
        time.sleep(_ARRIVAL_POLL_S)


def _cpu_backend(gloo: TorchDistributedBackend, env: WorkerEnv,
                 processes: Sequence[PeerProcess]) -> CollectiveBackend:
    """Shared memory between the ranks of each host (hierarchical across hosts), unless turned
    off (``RINGTRAIN_SHM=0``) or no two ranks share a host."""
    # Ranks share memory only on one running kernel in one pid namespace, under one host name
    # unless RINGTRAIN_SHM_SCOPE=machine (docs/shared_memory.md). Without /proc nothing can be
    # told, and nothing is shared.
    by_machine = env.knobs.shared_memory_scope == "machine"
    places = [RankPlace(host=(p.machine if by_machine else f"{p.host}/{p.machine}")
                        if p.machine else f"rank{r}", pid=p.pid, start_ticks=p.start_ticks)
              for r, p in enumerate(processes)]
    if env.knobs.shared_memory is False or len({p.host for p in places}) == len(places):
        return gloo
    if env.knobs.shared_memory is None and platform.machine().lower() not in STORES_IN_ORDER:
        # The segment's flags rely on stores becoming visible in program order (x86); elsewhere
        # only when asked for (RINGTRAIN_SHM=1).
        return gloo
    return HierarchicalBackend(gloo, places, env.run_id,
                               hierarchical=env.knobs.hierarchical_allreduce is not False,
                               timeout_s=_COLLECTIVE_TIMEOUT.total_seconds(),
                               setup_timeout_s=env.start_timeout_s)


def _store_doorbell(env: WorkerEnv, prefix: str) -> StoreDoorbell:
    """A doorbell on two connections of its own: a store client blocks other calls on it while
    it waits, and the engine waits while this process's other threads ring."""
    if env.master_addr is None or env.master_port is None:
        raise ValueError("ringtrain needs the rendezvous store's address (MASTER_ADDR and "
                         "MASTER_PORT) for its engine; export them before hvd.init()")
    addr, port = env.master_addr, env.master_port

    def client() -> dist.Store:
        tcp = dist.TCPStore(addr, port, is_master=False,
                            wait_for_workers=False,
                            timeout=datetime.timedelta(seconds=env.start_timeout_s))
        return dist.PrefixStore(prefix + "bell/", tcp)

    return StoreDoorbell(wait_store=client(), ring_store=client())


def _store(env: WorkerEnv, rank: int, size: int) -> dist.Store:
    """The rendezvous store, kept across re-initialisations (each uses a fresh prefix)."""
    assert env.master_addr is not None and env.master_port is not None
    key = (env.master_addr, env.master_port)
    store = _stores.get(key)
    if store is None:
        hosts_it = not env.launcher_store and rank == 0
        store = dist.TCPStore(env.master_addr, env.master_port, world_size=size,
                              is_master=hosts_it, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=env.start_timeout_s))
        _stores[key] = store
    return store


def _topology(env: WorkerEnv, rank: int, hostnames: list[str]) -> Topology:
    computed = from_hostnames(rank, hostnames)
    if env.local_rank is None or env.local_size is None or env.size != computed.size:
        return computed
    # The launcher's own numbering wins where it gave one (torchrun on several nodes of one
    # machine, for instance, shares a hostname but not local ranks).
    return Topology(rank=rank, size=computed.size, local_rank=env.local_rank,
                    local_size=env.local_size,
                    cross_rank=computed.cross_rank if env.cross_rank is None else env.cross_rank,
                    cross_size=computed.cross_size if env.cross_size is None else env.cross_size,
                    homogeneous=computed.homogeneous)


def _nccl_usable() -> bool:
    return dist.is_nccl_available() and torch.cuda.is_available()


def _is_loopback(addr: str | None) -> bool:
    if addr in ("localhost", None):
        return addr is not None
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def _join_elastic_world(env: WorkerEnv) -> WorkerEnv:
    """Join the next elastic world (the one this worker was started for, the first time) and
    return the environment with this worker's place in it."""
    global _elastic_generation
    assert env.elastic is not None
    leaving = _elastic_generation is not None
    # torch's stub types Store.set's value as str; the store takes bytes too
    slot, _elastic_generation = elastic_rendezvous.join_world(
        _store(env, env.rank, env.size),  # type: ignore[arg-type]
        elastic_rendezvous.Keys(env.run_id), env.elastic.worker_id,
        env.elastic.generation if _elastic_generation is None else _elastic_generation, leaving,
        env.elastic.timeout_s)
    log.debug("worker %d joined world %d as rank %d of %d", env.elastic.worker_id,
              _elastic_generation, slot.rank, slot.size)
    return replace(env, rank=slot.rank, size=slot.size, local_rank=slot.local_rank,
                   local_size=slot.local_size, cross_rank=slot.cross_rank,
                   cross_size=slot.cross_size)


def elastic_host_update() -> elastic_rendezvous.HostUpdate | None:
    """Under an elastic launch, the launcher's notice that the hosts changed since this world
    formed (``None``: no change, or not elastic)."""
    rt = runtime.current()
    if rt.world_generation is None:
        return None
    assert rt.env.master_addr is not None and rt.env.master_port is not None
    # torch's stub types Store.set's value as str; the store takes bytes too
    return elastic_rendezvous.host_update(_stores[rt.env.master_addr, rt.env.master_port],  # type: ignore[arg-type]
                                          elastic_rendezvous.Keys(rt.env.run_id),
                                          rt.world_generation)
