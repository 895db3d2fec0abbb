"""The turn: which thread runs this rank's rounds, and callers that run their own.

Whichever thread holds the turn runs the round: normally the engine thread, after reading a bell;
on one host, a caller of a synchronous cached operation while the engine is idle, if the round's
bell is its unit's tag (docs/engine.md, "A caller may run its own round"). Peers see no
difference: the bell alone decides what every rank runs in it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ringtrain.engine.doorbell import Doorbell, reach_store
from ringtrain.errors import HorovodInternalError

#: A caller waits for its claimed round's bell in slices this long (a signal handler runs
#: between them), and gives the round back to the engine after this long in all: by then the
#: pending watch has rung a negotiation for it, which the engine runs (stall reports, deadlock
#: checks).
SLICE_S = 0.2
GIVE_UP_S = 3.0


class Turn:
    """The lock that the thread running a round holds, and a caller's claim of a round.

    Args:
        callers_may_run: callers may run their own rounds (off: only the engine thread does).
        failed: whether the engine has failed (a caller then leaves its round to it).
        fail: fails the engine (a doorbell error while a caller waits for its bell).
    """

    def __init__(self, doorbell: Doorbell, callers_may_run: bool, failed: Callable[[], bool],
                 fail: Callable[[HorovodInternalError], None]):
        self.lock = threading.Lock()
        self.callers_may_run = callers_may_run
        self._doorbell = doorbell
        self._failed = failed
        self._fail = fail
        self._key = ""  # the counter key of the unit the turn's holder claimed

    def claim(self, round_: int, key: str) -> bool:
        """Take the turn if it is free (the engine is then between rounds, waiting for
        ``round_``'s bell) and claim ``round_`` for the unit counted under ``key``; whether it
        was free."""
        if not self.lock.acquire(blocking=False):
            return False
        self._key = key
        reach_store(self._doorbell.claim, round_, key)
        return True

    def claimed(self, counted: str | None) -> bool:
        """Whether a submission counted under ``counted`` is of the claimed unit."""
        return (counted or "").startswith(f"{self._key}@")

    def give_back(self, wake: bool) -> None:
        """Give the turn back; ``wake``: wake the engine, which a ring may have spared."""
        try:
            reach_store(self._doorbell.unclaim, wake)
        finally:
            self.lock.release()

    def run_claimed(self, round_: int, tag: bytes, run: Callable[[bytes], None]) -> None:
        """Run claimed round ``round_`` with ``run`` in this thread if its bell is ``tag``;
        give the turn back either way (waking the engine to run it if this thread did not)."""
        ran = False
        try:
            if self._bell_is(round_, tag):
                ran = True
                run(tag)
        except HorovodInternalError as exc:  # the doorbell's (its lock held by a stopped rank)
            self._fail(exc)  # as on the engine thread; the handle now holds the error
        finally:
            self.give_back(wake=not ran)

    def _bell_is(self, round_: int, tag: bytes) -> bool:
        """Wait for ``round_``'s bell: whether it is ``tag`` (False when another bell came, the
        engine failed, or the wait went on too long)."""
        give_up = time.monotonic() + GIVE_UP_S
        while not self._failed():
            left = give_up - time.monotonic()
            if left <= 0:
                break
            bell = self._doorbell.wait(round_, min(SLICE_S, left), claimed=True)
            if bell is not None:
                return bell == tag
        return False
