"""The pending watch: a thread that rings while requests wait on peers, and beats the heart.

A round rung once a :data:`PROBE_S` while requests wait reports stalls, checks for deadlocks and
fails a collective whose peer died, instead of waiting for a bell nobody rings. With a stall
shutdown time set, a round stuck that long on peers whose hearts stopped fails everything (see
:mod:`ringtrain.engine.liveness`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ringtrain.engine.backlog import Backlog
from ringtrain.engine.doorbell import NEGOTIATE, Rounds, reach_store
from ringtrain.engine.liveness import Liveness
from ringtrain.errors import HorovodInternalError, StallError

#: How often requests waiting on peers trigger a round (liveness and stall checks).
PROBE_S = 1.0


class PendingWatch:
    """Looks at an engine's backlog once a :data:`PROBE_S` until ``stopped`` is set;
    ``stuck_after_s``: the stall shutdown time (0: off)."""

    def __init__(self, rank: int, backlog: Backlog, rounds: Rounds, liveness: Liveness,
                 clock: Callable[[], float], stuck_after_s: float, stopped: threading.Event):
        self._rank = rank
        self._backlog = backlog
        self._rounds = rounds
        self._liveness = liveness
        self._clock = clock
        self._stuck_after_s = stuck_after_s
        self._stopped = stopped

    def run(self) -> None:
        """The watch's thread: look until the engine stops or fails."""
        while not self._stopped.wait(PROBE_S) and self.look():
            pass

    def look(self) -> bool:
        """Ring for requests that wait on peers, beat, fail a round stuck on silent peers;
        whether to go on looking."""
        backlog, rounds = self._backlog, self._rounds
        try:
            with backlog.lock:
                waiting = list(backlog.pending.values()) + list(backlog.queue)
                # Not while a negotiation round that took every waiting request runs: it
                # decides them, and a ring now would add a round after it in which this
                # rank might offer its peers' next submissions before they make them (a
                # round that splits what one round would have fused); the next look rings
                # for whatever still waits.
                decided_now = rounds.negotiating and rounds.drained and not backlog.queue
                if (waiting and not decided_now
                        and self._clock() - min(r.submitted_at for r in waiting) > PROBE_S):
                    rounds.ring(NEGOTIATE)
            if waiting or rounds.since is not None:
                reach_store(self._liveness.beat)
            return not self._stuck_on_silent_peers()
        except HorovodInternalError:
            return False

    def _stuck_on_silent_peers(self) -> bool:
        """Fail everything if the round in progress has waited past the stall shutdown time on
        peers that show no sign of life; whether it did."""
        since = self._rounds.since
        if since is None or self._stuck_after_s <= 0:
            self._liveness.forget()
            return False
        waited = self._clock() - since
        if waited < PROBE_S:
            return False
        silent = reach_store(self._liveness.silent, self._stuck_after_s)
        if not silent:
            return False
        self._backlog.fail(StallError(
            f"rank(s) {silent} stopped responding: no heartbeat for {self._stuck_after_s:g} s "
            f"while rank {self._rank} waited {waited:.1f} s for them in a collective (a process "
            "stopped or frozen, or its host lost); shutting down"))
        return True
