"""The doorbell: wakes every rank's engine for a round only when it can do something.

Round ``k`` starts when a rank rings bell ``k``; the first ring decides the bell, so every rank
reads the same one: :data:`NEGOTIATE`, or a unit's tag (see :mod:`ringtrain.engine.readiness`),
which runs exactly that unit with no negotiation. Why and when ranks ring: docs/engine.md,
"Rounds and the doorbell".
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Protocol, TypeVar

import torch.distributed as dist

from ringtrain.errors import HorovodInternalError

#: The bell of a negotiation round; every other bell names a unit.
NEGOTIATE = b"g"

_T = TypeVar("_T")


def reach_store(call: Callable[..., _T], *args: object) -> _T:
    """``call(*args)`` on the rendezvous store, whose loss means a peer (its host) died.

    Raises:
        HorovodInternalError: the store cannot be reached (or the shared-memory doorbell's own
            error, which names the rank at fault).
    """
    try:
        return call(*args)
    except HorovodInternalError:
        raise
    except Exception as exc:
        raise HorovodInternalError(
            f"cannot reach the job's rendezvous store; another rank or the launcher has "
            f"probably exited: {exc}") from exc


class Doorbell(Protocol):
    """Round-numbered wake-ups shared by all ranks."""

    def ring(self, round_: int, bell: bytes) -> bytes:
        """Ring round ``round_`` with ``bell`` unless it was rung already; return the round's
        bell (``bell``, or the one rung first)."""

    def wait(self, round_: int, timeout_s: float, claimed: bool = False) -> bytes | None:
        """Block until round ``round_`` was rung and return its bell; None after the timeout,
        or at once if the round is long past (its bell forgotten, see :meth:`claim`).
        ``claimed``: the waiter is a caller that claimed the round (see :meth:`claim`)."""

    def forget(self, round_: int) -> None:
        """Release what round ``round_`` used, once no rank can still be waiting for it."""

    def count(self, key: str) -> int:
        """Add one to the shared counter ``key``; return its new value."""

    def read(self, key: str) -> int:
        """The shared counter ``key`` (0 if nobody counted it yet)."""

    def deferring_wakes(self) -> contextlib.AbstractContextManager[None]:
        """A block whose rings by this thread wake the waiters only when it ends (re-entrant):
        a thread that rings while holding a lock the woken engine needs at once lets it go
        first, instead of waking an engine that would only block on that lock."""

    def holding(self) -> contextlib.AbstractContextManager[None]:
        """A block whose doorbell calls by this thread share one hold of the doorbell's lock
        (re-entrant; its rings wake the waiters when it ends): a count and the ring it completes
        then cost one lock round trip, not two. Other threads' calls wait for the block."""

    def claim(self, round_: int, key: str) -> None:
        """A caller of this rank runs round ``round_`` itself if its bell is a submission of
        the unit counted under ``key``: a ring of such a bell need not wake this rank's engine
        (a hint; a doorbell may wake it anyway)."""

    def unclaim(self, wake: bool) -> None:
        """End this rank's claim. ``wake``: the caller did not run the round: withdraw the
        claim and wake the engine, which a ring may have spared; otherwise the claim, of a
        round now past, may stay."""


class StoreDoorbell:
    """Bells as keys of the job's rendezvous store.

    Waiting and ringing use separate store clients: a client serialises its calls, so a ring
    from a submitting thread would otherwise queue behind the engine's blocking wait.
    """

    def __init__(self, wait_store: dist.Store, ring_store: dist.Store):
        self._wait_store = wait_store
        self._ring_store = ring_store
        self._ring_lock = threading.Lock()

    def ring(self, round_: int, bell: bytes) -> bytes:
        with self._ring_lock:
            # torch accepts bytes for the desired value; its stub says str only
            return self._ring_store.compare_set(str(round_), "", bell)  # type: ignore[arg-type]

    def wait(self, round_: int, timeout_s: float, claimed: bool = False) -> bytes | None:
        # get() blocks until the key exists and returns it in the same round trip.
        self._wait_store.set_timeout(timedelta(seconds=timeout_s))
        try:
            return self._wait_store.get(str(round_))
        except dist.DistStoreError:
            return None

    def forget(self, round_: int) -> None:
        with self._ring_lock:
            self._ring_store.delete_key(str(round_))

    def count(self, key: str) -> int:
        with self._ring_lock:
            return self._ring_store.add(f"n/{key}", 1)

    def read(self, key: str) -> int:
        with self._ring_lock:
            return self._ring_store.add(f"n/{key}", 0)

    def deferring_wakes(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # the store server wakes its waiters itself

    def holding(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # each call is a round trip of its own anyway

    def claim(self, round_: int, key: str) -> None:
        """Nothing to record: every ring wakes every waiter."""

    def unclaim(self, wake: bool) -> None:
        """Nothing to withdraw."""


class LocalDoorbell:
    """Bells in this process's memory, for every engine that shares the object: the engine of a
    world of one, or the engines of N ranks run as threads (tests/engine)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._rung: dict[int, bytes] = {}
        self._counts: dict[str, int] = {}

    def ring(self, round_: int, bell: bytes) -> bytes:
        with self._cond:
            self._cond.notify_all()
            return self._rung.setdefault(round_, bell)

    def wait(self, round_: int, timeout_s: float, claimed: bool = False) -> bytes | None:
        with self._cond:
            if not self._cond.wait_for(lambda: round_ in self._rung, timeout_s):
                return None
            return self._rung[round_]

    def forget(self, round_: int) -> None:
        with self._cond:
            self._rung.pop(round_, None)

    def count(self, key: str) -> int:
        with self._cond:
            self._counts[key] = self._counts.get(key, 0) + 1
            return self._counts[key]

    def read(self, key: str) -> int:
        with self._cond:
            return self._counts.get(key, 0)

    def deferring_wakes(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def holding(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # each call takes the condition's lock, cheaply

    def claim(self, round_: int, key: str) -> None:
        """Nothing to record: every ring wakes every waiter."""

    def unclaim(self, wake: bool) -> None:
        """Nothing to withdraw."""


class Rounds:
    """This rank's place in the sequence of rounds: the round it waits for or runs, the rounds
    it rang, the bells it may release (rank 0 releases those every rank has read). Guarded by
    the engine's lock, but :attr:`since` and :attr:`negotiating`, which the pending watch reads
    as they come."""

    def __init__(self, rank: int, doorbell: Doorbell):
        self._rank = rank
        self._doorbell = doorbell
        self.current = 0  # the round this rank waits for or runs
        self.drained = False  # ``current`` took this rank's requests: news rings the next
        self.since: float | None = None  # when the round in progress started; None between
        self.negotiating = False  # the round in progress is a negotiation
        self._negotiation = -1  # the latest round found rung as a negotiation
        self._forgotten = 0  # rounds before this one are released from the store

    def ring(self, bell: bytes) -> None:
        """Make sure a round with ``bell`` happens soon on every rank: the first round this rank
        has not drained yet whose bell is free, or (for a negotiation) already a negotiation,
        gets it. A negotiation ring for a round up to the latest negotiation found is answered
        already."""
        round_ = self.current + 1 if self.drained else self.current
        if bell == NEGOTIATE and self._negotiation >= round_:
            return
        while reach_store(self._doorbell.ring, round_, bell) != bell:
            round_ += 1  # taken by a unit, or (for a unit) by another unit or a negotiation
        if bell == NEGOTIATE:
            self._negotiation = round_

    def start(self, now: float, bell: bytes) -> None:
        """The round ``current`` starts, its bell read."""
        self.since = now
        self.negotiating = bell == NEGOTIATE

    def finish(self) -> None:
        """The round ``current`` is done: wait for the next one."""
        self.since = None
        self.negotiating = False
        self.current += 1
        self.drained = False

    def forget(self) -> None:
        """Release the bells of the rounds up to ``current``, which every rank has read (this
        rank just completed a collective of all ranks in it)."""
        if self._rank == 0:
            for round_ in range(self._forgotten, self.current + 1):
                self._doorbell.forget(round_)
        self._forgotten = self.current + 1
