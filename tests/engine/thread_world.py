"""N ranks as threads of one process: a collective backend and a doorbell to test engines on.

``ThreadWorld(size)`` is the hub. ``world.backend(rank)`` is rank ``rank``'s
:class:`~ringtrain.backends.base.CollectiveBackend`, with each collective's real semantics;
``world.doorbell`` is one :class:`~ringtrain.engine.doorbell.LocalDoorbell` that every rank
shares, which gives the store doorbell's semantics in memory (the first ring of a round decides
its bell, counters are shared, waits are bounded) and remembers every round's bell so that a
test can count rounds.

Every collective is a rendezvous of its members: each rank deposits its contribution, the last
to arrive combines them, and every member takes its result. Members call a process set's
collectives in the same order, so the n-th call on a set is one meeting. Nothing waits forever:

* a member that does not arrive within ``timeout_s`` makes the others raise, naming it;
* members that call different collectives at the same point raise, naming both (an engine bug
  that Gloo would report far less clearly);
* :meth:`ThreadWorld.fail` breaks a rank as a crash would: its collectives raise from then on,
  and so, at once, do its peers' collectives that include it (Gloo sees the connection close).

``add_set`` registers the set on the calling rank only: ``torch.distributed`` needs every rank
to create a group, but nothing in the engine depends on that, and a test registers a set on
each rank in turn from one thread.

A test harness, not a product backend: the frontend holds one runtime per process
(``ringtrain.torch.runtime``), so threads cannot run N ranks of a user's script, and a world of
one already has :class:`~ringtrain.backends.local.LocalBackend`.
"""

from __future__ import annotations

import collections
import pickle
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ringtrain.engine.doorbell import LocalDoorbell
from ringtrain.op_types import ReduceOp

_CONTROL, _DATA = "control", "data"
_REDUCTIONS: dict[ReduceOp, Callable[[torch.Tensor], torch.Tensor]] = {
    ReduceOp.SUM: lambda stacked: stacked.sum(0),
    ReduceOp.MIN: lambda stacked: stacked.amin(0),
    ReduceOp.MAX: lambda stacked: stacked.amax(0),
    ReduceOp.PRODUCT: lambda stacked: stacked.prod(0),
}


class RendezvousError(RuntimeError):
    """A collective of the thread world cannot complete (a member failed, never came, or called
    another collective)."""


class RecordingDoorbell(LocalDoorbell):
    """A shared in-memory doorbell that also remembers each round's bell after it is forgotten."""

    def __init__(self) -> None:
        super().__init__()
        self._bells: dict[int, bytes] = {}

    def ring(self, round_: int, bell: bytes) -> bytes:
        rung = super().ring(round_, bell)
        self._bells.setdefault(round_, rung)
        return rung

    def bells(self) -> list[bytes]:
        """The bell of every round rung so far, in round order."""
        return [self._bells[r] for r in sorted(self._bells)]


@dataclass
class _Meeting:
    """One collective on its way: what the members brought, and what they take away."""

    kind: str
    members: tuple[int, ...]
    contributions: dict[int, Any] = field(default_factory=dict)
    done: bool = False
    result: Any = None
    error: str | None = None
    taken: int = 0


class ThreadWorld:
    """The collectives and doorbell of ``size`` ranks that run as threads of this process.

    Args:
        size: the number of ranks.
        timeout_s: how long a member waits for the others in one collective before raising.

    Attributes:
        doorbell: the bells every rank's engine shares.
        completed: how many collectives of each kind (``"allreduce"``, ``"control_allreduce"``,
            ...) completed, counted once per collective rather than once per member.
    """

    def __init__(self, size: int, timeout_s: float = 5.0):
        if size < 1:
            raise ValueError(f"a world needs at least one rank, got size={size}")
        self.size = size
        self.timeout_s = timeout_s
        self.doorbell = RecordingDoorbell()
        self.completed: collections.Counter[str] = collections.Counter()
        self._cond = threading.Condition()
        self._meetings: dict[tuple[str, tuple[int, ...], int], _Meeting] = {}
        self._failed: dict[int, str] = {}
        self._backends = [ThreadBackend(self, rank) for rank in range(size)]

    def backend(self, rank: int) -> ThreadBackend:
        """Rank ``rank``'s backend."""
        return self._backends[rank]

    def fail(self, rank: int, reason: str) -> None:
        """Break ``rank`` as a crash would (see the module docstring)."""
        with self._cond:
            self._failed[rank] = reason
            self._cond.notify_all()

    def meet(self, rank: int, channel: str, members: tuple[int, ...], seq: int, kind: str,
             contribution: Any, combine: Callable[[list[Any]], Any]) -> Callable[[], Any]:
        """Deposit ``rank``'s contribution to the ``seq``-th collective of ``members`` on
        ``channel``; the last member's deposit runs ``combine`` on every contribution, in member
        order.

        Returns:
            The wait: blocks until the result is there and returns it.

        Raises:
            RendezvousError: a member failed or called another collective here.
        """
        key = (channel, members, seq)
        with self._cond:
            self._raise_if_failed(rank, kind, members)
            meeting = self._meetings.setdefault(key, _Meeting(kind, members))
            if meeting.kind != kind and meeting.error is None:
                meeting.error = (f"ranks called different collectives over ranks {list(members)}: "
                                 f"rank {rank} called {kind}, rank(s) "
                                 f"{sorted(meeting.contributions)} called {meeting.kind}")
                self._cond.notify_all()
            if meeting.error is not None:
                raise RendezvousError(meeting.error)
            meeting.contributions[rank] = contribution
            if len(meeting.contributions) == len(members):
                try:
                    meeting.result = combine([meeting.contributions[r] for r in members])
                except Exception as exc:  # bad arguments: every member must hear of it
                    meeting.error = f"{kind} over ranks {list(members)} failed: {exc}"
                    self._cond.notify_all()
                    raise RendezvousError(meeting.error) from exc
                meeting.done = True
                self.completed[kind] += 1
                self._cond.notify_all()
        return lambda: self._take(rank, key, meeting)

    def _take(self, rank: int, key: tuple, meeting: _Meeting) -> Any:
        with self._cond:
            members = meeting.members
            self._cond.wait_for(lambda: meeting.done or meeting.error is not None
                                or self._failed_member(members) is not None, self.timeout_s)
            if not meeting.done:
                if meeting.error is not None:
                    raise RendezvousError(meeting.error)
                self._raise_if_failed(rank, meeting.kind, members)
                missing = [r for r in members if r not in meeting.contributions]
                raise RendezvousError(
                    f"rank {rank} waited {self.timeout_s:g} s in {meeting.kind} over ranks "
                    f"{list(members)} for rank(s) {missing}, which never called it")
            meeting.taken += 1
            if meeting.taken == len(members):
                del self._meetings[key]
            return meeting.result

    def _failed_member(self, members: tuple[int, ...]) -> int | None:
        return next((r for r in members if r in self._failed), None)

    def _raise_if_failed(self, rank: int, kind: str, members: tuple[int, ...]) -> None:
        if rank in self._failed:
            raise RendezvousError(f"rank {rank}'s backend failed: {self._failed[rank]}")
        dead = self._failed_member(members)
        if dead is not None:
            raise RendezvousError(f"rank {rank}: {kind} over ranks {list(members)} cannot "
                                  f"complete: rank {dead} failed ({self._failed[dead]})")


class ThreadBackend:
    """One rank's collectives in a :class:`ThreadWorld` (the ``CollectiveBackend`` protocol)."""

    def __init__(self, world: ThreadWorld, rank: int):
        self.rank = rank
        self.size = world.size
        self._world = world
        self._everyone = tuple(range(world.size))
        self._sets = {self._everyone}
        self._calls: collections.Counter[tuple[str, tuple[int, ...]]] = collections.Counter()
        self._closed = False

    def add_set(self, ranks: tuple[int, ...]) -> None:
        self._sets.add(tuple(ranks))

    def remove_set(self, ranks: tuple[int, ...]) -> None:
        self._sets.discard(tuple(ranks))

    def control_allreduce(self, counts: torch.Tensor) -> None:
        total = self._meet(_CONTROL, self._everyone, "control_allreduce", counts.clone(),
                           lambda values: _reduce(ReduceOp.SUM, values))()
        counts.copy_(total)

    def control_allgather(self, obj: Any) -> list[Any]:
        # Pickled as Gloo's all_gather_object would: each rank gets copies of its own.
        gathered = self._meet(_CONTROL, self._everyone, "control_allgather", pickle.dumps(obj),
                              list)()
        return [pickle.loads(blob) for blob in gathered]

    def start_allreduce(self, tensor: torch.Tensor, op: ReduceOp,
                        ranks: tuple[int, ...]) -> Callable[[], None]:
        _check_wire_op(op)
        reduced = self._meet(_DATA, ranks, "allreduce", tensor.clone(),
                             lambda values: _reduce(op, values))

        def wait() -> None:
            tensor.copy_(reduced())

        return wait

    def allreduces_in_place(self, ranks: tuple[int, ...], device: str) -> bool:
        return False  # as Gloo: the engine packs batches into its fusion buffer

    def start_allreduce_list(self, tensors: Sequence[torch.Tensor], op: ReduceOp,
                             ranks: tuple[int, ...]) -> Callable[[], None]:
        raise NotImplementedError("the thread world reduces one flat tensor at a time")

    def allgather(self, output: torch.Tensor, tensor: torch.Tensor,
                  ranks: tuple[int, ...]) -> None:
        gathered = self._meet(_DATA, ranks, "allgather", tensor.clone(), torch.cat)()
        output.copy_(gathered.reshape(output.shape))

    def broadcast_(self, tensor: torch.Tensor, root: int, ranks: tuple[int, ...]) -> None:
        if root not in ranks:
            raise RendezvousError(f"broadcast root {root} is not a member of {list(ranks)}")
        tensor.copy_(self._meet(_DATA, ranks, "broadcast", tensor.clone(),
                                lambda values: values[ranks.index(root)])())

    def alltoall(self, output: torch.Tensor, tensor: torch.Tensor, output_splits: Sequence[int],
                 input_splits: Sequence[int], ranks: tuple[int, ...]) -> None:
        sent = self._meet(_DATA, ranks, "alltoall", (tensor.clone(), list(input_splits)), list)()
        me = ranks.index(self.rank)
        pieces = [t.split(splits)[me] for t, splits in sent]
        received = [len(p) for p in pieces]
        if received != list(output_splits):
            raise RendezvousError(f"alltoall on rank {self.rank}: expected {list(output_splits)} "
                                  f"rows from ranks {list(ranks)}, they sent {received}")
        output.copy_(torch.cat(pieces))

    def reducescatter(self, output: torch.Tensor, tensor: torch.Tensor, op: ReduceOp,
                      ranks: tuple[int, ...]) -> None:
        _check_wire_op(op)
        reduced = self._meet(_DATA, ranks, "reducescatter", tensor.clone(),
                             lambda values: _reduce(op, values))()
        rows, me = output.shape[0], ranks.index(self.rank)
        output.copy_(reduced[me * rows:(me + 1) * rows])

    def close(self) -> None:
        self._closed = True

    def _meet(self, channel: str, ranks: tuple[int, ...], kind: str, contribution: Any,
              combine: Callable[[list[Any]], Any]) -> Callable[[], Any]:
        ranks = tuple(ranks)
        if self._closed:
            raise RendezvousError(f"rank {self.rank}'s backend is closed; {kind} cannot run")
        if ranks not in self._sets:
            raise RendezvousError(f"rank {self.rank} has no process set {list(ranks)}; "
                                  "add_set() it first")
        if self.rank not in ranks:
            raise RendezvousError(f"rank {self.rank} is not a member of {list(ranks)}")
        seq = self._calls[channel, ranks]
        self._calls[channel, ranks] += 1
        return self._world.meet(self.rank, channel, ranks, seq, kind, contribution, combine)


def _check_wire_op(op: ReduceOp) -> None:
    if op not in _REDUCTIONS:
        raise ValueError(f"{op!r} is not a reduction a backend runs; the engine turns Average "
                         "into Sum and runs Adasum itself")


def _reduce(op: ReduceOp, values: list[torch.Tensor]) -> torch.Tensor:
    """Reduce in the tensors' own dtype; booleans come out as any (Sum, Max) or all (Min,
    Product), as on Gloo and NCCL.

    Raises:
        ValueError: the members' tensors differ in shape or dtype (their engines disagree on
            what this collective is).
    """
    kinds = [(tuple(v.shape), v.dtype) for v in values]
    if len(set(kinds)) > 1:
        raise ValueError(f"members reduce different tensors (shape, dtype in member order): "
                         f"{kinds}")
    return _REDUCTIONS[op](torch.stack(values)).to(values[0].dtype)
