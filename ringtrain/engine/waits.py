"""Wait tracking: whether this rank is *blocked*, for deadlock detection (docs/engine.md,
"Deadlocks").

A rank's *wait state*, carried in every negotiation round's control vector, is 0, or for a
blocked rank a counter that every submission and every start or end of a wait changes: a rank
with the same non-zero state in two consecutive rounds has been blocked all along.

Not thread-safe: the engine calls it under its backlog's lock. Threads are arguments (the calling
one by default), so that a test needs none.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ringtrain.engine.handle import Handle
from ringtrain.engine.request import OpKey, Request

#: A rank blocked in the same wait since the previous round asks for a deadlock check at least
#: this often, even when the members it waits for do not all look blocked.
DEADLOCK_CHECK_S = 5.0


class _ForAutograd(threading.local):
    """Set in a thread's submitting_for_autograd block (a class default: a missing attribute
    of a thread-local costs an exception on every look)."""

    active = False


class WaitTracker:
    """Which threads of this rank submit and which wait for what; this rank's wait state.
    ``enabled`` off (``--no-stall-check``), the rank is never blocked, so that nobody waiting for
    it is taken for deadlocked; ``clock`` paces deadlock checks."""

    def __init__(self, rank: int, enabled: bool, clock: Callable[[], float]):
        self._rank = rank
        self._enabled = enabled
        self._clock = clock
        self._waiters: dict[int, int] = {}  # thread id -> its waits with no timeout
        self._awaited: dict[Handle, int] = {}  # handle -> waits with no timeout on it
        self._submitters: dict[int | None, threading.Thread] = {}  # thread id -> thread
        self._for_autograd = _ForAutograd()
        self._changes = 0  # bumped by every submission and every start or end of a wait
        self._previous: list[int] | None = None  # every rank's state in the previous round
        self._last_check = float("-inf")

    @contextlib.contextmanager
    def submitting_for_autograd(self) -> Iterator[None]:
        """This thread's submissions in the block are autograd's hooks': they do not make it a
        thread whose waits decide whether the rank is blocked."""
        previous = self._for_autograd.active
        self._for_autograd.active = True
        try:
            yield
        finally:
            self._for_autograd.active = previous

    def submitted(self, thread: threading.Thread | None = None) -> None:
        """``thread`` submitted an operation."""
        self._changes += 1
        if not self._for_autograd.active:
            thread = thread or threading.current_thread()
            self._submitters[thread.ident] = thread

    def began(self, handle: Handle, ident: int | None = None) -> None:
        """Thread ``ident`` starts waiting for ``handle`` with no timeout."""
        ident = threading.get_ident() if ident is None else ident
        self._waiters[ident] = self._waiters.get(ident, 0) + 1
        self._awaited[handle] = self._awaited.get(handle, 0) + 1
        self._changes += 1

    def ended(self, handle: Handle, ident: int | None = None) -> None:
        """That wait of thread ``ident`` ended."""
        ident = threading.get_ident() if ident is None else ident
        tables: tuple[tuple[dict[Any, int], Any], ...] = (  # Any: threads' ids, or handles
            (self._waiters, ident), (self._awaited, handle))
        for table, key in tables:
            left = table.get(key, 0) - 1
            if left > 0:
                table[key] = left
            else:
                table.pop(key, None)
        self._changes += 1

    def state(self, pending: Mapping[OpKey, Request]) -> tuple[int, set[OpKey]]:
        """This rank's wait state, and the keys of the ``pending`` requests its threads wait
        for. Forgets submitters that have ended."""
        awaited = {r.key for r in pending.values() if r.handle in self._awaited}
        if not awaited or not self._enabled:
            return 0, awaited
        for ident, thread in list(self._submitters.items()):
            if not thread.is_alive():
                del self._submitters[ident]
            elif ident not in self._waiters:
                return 0, awaited
        return (self._changes & 0x3FFFFFFF) + 1, awaited  # never 0

    def wants_check(self, state: int, awaited: set[OpKey],
                    pending: Mapping[OpKey, Request]) -> bool:
        """Whether this rank asks this round for a deadlock check: it is blocked in the same
        wait as in the previous round, and every member of a set it waits on was blocked then
        too (or it has not asked for :data:`DEADLOCK_CHECK_S`)."""
        previous = self._previous
        if not state or previous is None or previous[self._rank] != state:
            return False
        now = self._clock()
        members = [pending[key].meta.set_ranks for key in awaited]
        if (any(all(previous[m] for m in ranks) for ranks in members)
                or now - self._last_check >= DEADLOCK_CHECK_S):
            self._last_check = now
            return True
        return False

    def blocked(self, states: list[int]) -> list[int]:
        """Record every rank's wait state in this round; the ranks blocked in the same wait in
        the previous round (they cannot have submitted anything in between)."""
        previous, self._previous = self._previous, states
        if previous is None:
            return []
        return [r for r, s in enumerate(states) if s and previous[r] == s]
