"""The doorbell: wakes every rank's engine for a negotiation round only when it can do something.

A negotiation round is a collective, so all ranks must enter it together. Polling for rounds
every cycle would make idle ranks burn the CPU that training needs; instead, round ``k`` starts
when any rank rings bell ``k`` (a key in the rendezvous store, which every engine waits on with a
blocking read). A rank rings when it submits an operation, wants to shut down, or must report a
stall; for a unit of operations submitted together (a gradient bucket), only once the unit is
known to be submitted on every member (its shared counter, see :meth:`Doorbell.count`, reached
the member count), since a round rung earlier is one the slower ranks cannot take part in yet.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Protocol

import torch.distributed as dist


class Doorbell(Protocol):
    """Round-numbered wake-ups shared by all ranks."""

    def ring(self, round_: int, gather: bool = True) -> None:
        """Ask every rank to run round ``round_`` (idempotent).

        ``gather``: engines should wait one cycle time before the round, for what peers are about
        to submit; False when the ringer knows the round's work is all submitted already.
        """

    def wait(self, round_: int, timeout_s: float) -> bool | None:
        """Block until round ``round_`` was rung (return its ``gather`` flag) or the timeout
        passed (return None)."""

    def forget(self, round_: int) -> None:
        """Release what round ``round_`` used, once no rank can still be waiting for it."""

    def count(self, key: str) -> int:
        """Add one to the shared counter ``key``; return its new value."""


class StoreDoorbell:
    """Bells as keys of the job's rendezvous store.

    Waiting and ringing use separate store clients: a client serialises its calls, so a ring
    from a submitting thread would otherwise queue behind the engine's blocking wait.
    """

    def __init__(self, wait_store: dist.Store, ring_store: dist.Store):
        self._wait_store = wait_store
        self._ring_store = ring_store
        self._ring_lock = threading.Lock()

    def ring(self, round_: int, gather: bool = True) -> None:
        with self._ring_lock:
            self._ring_store.set(str(round_), b"g" if gather else b"n")

    def wait(self, round_: int, timeout_s: float) -> bool | None:
        # get() blocks until the key exists and returns it in the same round trip.
        self._wait_store.set_timeout(timedelta(seconds=timeout_s))
        try:
            return self._wait_store.get(str(round_)) == b"g"
        except dist.DistStoreError:
            return None

    def forget(self, round_: int) -> None:
        with self._ring_lock:
            self._ring_store.delete_key(str(round_))

    def count(self, key: str) -> int:
        with self._ring_lock:
            return self._ring_store.add(f"n/{key}", 1)


class LocalDoorbell:
    """Bells for a world of one process."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._rung: dict[int, bool] = {}
        self._counts: dict[str, int] = {}

    def ring(self, round_: int, gather: bool = True) -> None:
        with self._cond:
            self._rung[round_] = gather
            self._cond.notify_all()

    def wait(self, round_: int, timeout_s: float) -> bool | None:
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
