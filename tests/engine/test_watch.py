"""The pending watch, one look at a time without its thread: when it rings for waiting requests,
when it beats, and a round stuck on a silent peer."""

from __future__ import annotations

import threading

import pytest

from ringtrain.engine.backlog import Backlog
from ringtrain.engine.doorbell import NEGOTIATE, Rounds
from ringtrain.engine.liveness import Liveness
from ringtrain.engine.watch import PROBE_S, PendingWatch
from ringtrain.errors import StallError
from tests.clock import FakeClock
from tests.engine.calls import request
from tests.engine.thread_world import RecordingDoorbell


class _Watched:
    """A watch of rank 0 of 2 over a backlog and rounds the test changes by hand."""

    def __init__(self, stuck_after_s: float = 0.0):
        self.clock = FakeClock()
        self.doorbell = RecordingDoorbell()
        self.backlog = Backlog()
        self.rounds = Rounds(0, self.doorbell)
        self.watch = PendingWatch(0, self.backlog, self.rounds,
                                  Liveness(0, 2, self.doorbell, self.clock), self.clock,
                                  stuck_after_s, threading.Event())

    def pending(self, name: str):
        made = request(0, (0, 1), name)
        self.backlog.add(made, self.clock())
        self.backlog.pending[name] = made
        return made


def test_an_idle_engine_is_left_alone():
    watched = _Watched()
    assert watched.watch.look()
    assert watched.doorbell.bells() == [] and watched.doorbell.read("alive.0") == 0


def test_a_request_waiting_on_peers_rings_a_negotiation_once_it_is_old_and_beats_meanwhile():
    watched = _Watched()
    watched.pending("a")
    assert watched.watch.look()
    assert watched.doorbell.bells() == []  # young: its round may still come
    watched.clock.advance(PROBE_S * 1.5)
    assert watched.watch.look()
    assert watched.doorbell.bells() == [NEGOTIATE]
    assert watched.doorbell.read("alive.0") == 2


def test_no_ring_while_a_negotiation_round_that_took_every_waiting_request_runs():
    watched = _Watched()
    watched.pending("a")
    watched.clock.advance(PROBE_S * 1.5)
    watched.rounds.start(watched.clock(), NEGOTIATE)
    watched.rounds.drained = True
    assert watched.watch.look()
    assert watched.doorbell.bells() == []  # that round decides it
    watched.backlog.queue.append(request(0, (0, 1), "b"))  # submitted since: it rings
    assert watched.watch.look()
    assert watched.doorbell.bells() == [NEGOTIATE]


def test_a_round_stuck_on_a_silent_peer_past_the_stall_shutdown_time_fails_everything():
    watched = _Watched(stuck_after_s=2.0)
    waiting = watched.pending("a")
    watched.rounds.start(watched.clock(), NEGOTIATE)
    for _ in range(3):  # from the second look on, it watches rank 1's heartbeat: it never moves
        assert watched.watch.look()
        watched.clock.advance(1.0)
    assert not watched.watch.look()  # the watch's work is done
    with pytest.raises(StallError, match=r"rank\(s\) \[1\] stopped responding: no heartbeat "
                       r"for 2 s while rank 0 waited 3\.0 s"):
        waiting.handle.wait(0)
