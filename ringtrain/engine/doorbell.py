"""The doorbell: wakes every rank's engine for a round only when it can do something.

A round is collective, so all ranks must enter it together and agree on what it does. Polling
every cycle would make idle ranks burn the CPU that training needs; instead, round ``k`` starts
when a rank rings bell ``k`` (a key in the rendezvous store, which every engine waits on with a
blocking read). The first ring of a round decides its bell and later rings find it taken, so
every rank reads the same bell:

* :data:`NEGOTIATE`: a negotiation round (a rank submitted an operation one by one, wants to shut
  down, or must report a stall);
* a unit's tag (see :mod:`ringtrain.engine.readiness`): run exactly that unit of cached
  operations, known to be submitted on every member, with no negotiation at all. Only the last
  member to count a unit rings its tag.
"""

from __future__ import annotations

import contextlib
import threading
from datetime import timedelta
from typing import Protocol

import torch.distributed as dist

#: The bell of a negotiation round; every other bell names a unit.
NEGOTIATE = b"g"


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

    def claim(self, round_: int, key: str) -> None:
        """Nothing to record: every ring wakes every waiter."""

    def unclaim(self, wake: bool) -> None:
        """Nothing to withdraw."""
