"""The doorbell: wakes every rank's engine for a negotiation round only when someone has news.

A negotiation round is a collective, so all ranks must enter it together. Polling for rounds
every cycle would make idle ranks burn the CPU that training needs; instead, round ``k`` starts
when any rank rings bell ``k`` (a key in the rendezvous store, which every engine waits on with a
blocking read) because it has a new request, wants to shut down, or must report a stall.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Protocol

import torch.distributed as dist


class Doorbell(Protocol):
    """Round-numbered wake-ups shared by all ranks."""

    def ring(self, round_: int) -> None:
        """Ask every rank to run round ``round_`` (idempotent)."""

    def wait(self, round_: int, timeout_s: float) -> bool:
        """Block until round ``round_`` was rung or the timeout passed; True if rung."""

    def forget(self, round_: int) -> None:
        """Release what round ``round_`` used, once no rank can still be waiting for it."""


class StoreDoorbell:
    """Bells as keys of the job's rendezvous store.

    Waiting and ringing use separate store clients: a client serialises its calls, so a ring
    from a submitting thread would otherwise queue behind the engine's blocking wait.
    """

    def __init__(self, wait_store: dist.Store, ring_store: dist.Store):
        self._wait_store = wait_store
        self._ring_store = ring_store
        self._ring_lock = threading.Lock()

    def ring(self, round_: int) -> None:
        with self._ring_lock:
            self._ring_store.set(str(round_), b"1")

    def wait(self, round_: int, timeout_s: float) -> bool:
        try:
            self._wait_store.wait([str(round_)], timedelta(seconds=timeout_s))
        except dist.DistStoreError:
            return False
        return True

    def forget(self, round_: int) -> None:
        with self._ring_lock:
            self._ring_store.delete_key(str(round_))


class LocalDoorbell:
    """Bells for a world of one process."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._rung: set[int] = set()

    def ring(self, round_: int) -> None:
        with self._cond:
            self._rung.add(round_)
            self._cond.notify_all()

    def wait(self, round_: int, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: round_ in self._rung, timeout_s)

    def forget(self, round_: int) -> None:
        with self._cond:
            self._rung.discard(round_)
