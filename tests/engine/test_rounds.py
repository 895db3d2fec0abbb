"""A rank's rounds, without threads: which round a ring targets, when a negotiation needs no ring,
and which bells rank 0 releases."""

from __future__ import annotations

from ringtrain.engine.doorbell import NEGOTIATE, Rounds
from tests.engine.thread_world import RecordingDoorbell


def test_a_ring_targets_the_current_round_until_it_took_this_ranks_requests():
    doorbell = RecordingDoorbell()
    rounds = Rounds(0, doorbell)
    rounds.ring(b"unit@1")
    rounds.drained = True
    rounds.ring(b"other@1")
    assert [doorbell.wait(r, 0) for r in (0, 1)] == [b"unit@1", b"other@1"]


def test_a_negotiation_is_rung_once_per_round_and_a_taken_round_passes_a_ring_on():
    doorbell = RecordingDoorbell()
    peer, rounds = Rounds(1, doorbell), Rounds(0, doorbell)
    peer.ring(b"unit@1")  # a peer took round 0 for a unit
    rounds.ring(NEGOTIATE)
    rounds.ring(NEGOTIATE)  # rung already, for a round this rank has not started
    peer.ring(NEGOTIATE)  # finds round 1 a negotiation: nothing more to ring
    assert doorbell.bells() == [b"unit@1", NEGOTIATE]
    rounds.start(3.0, doorbell.wait(0, 0))
    assert (rounds.since, rounds.negotiating) == (3.0, False)
    rounds.finish()
    rounds.start(4.0, doorbell.wait(1, 0))
    assert (rounds.current, rounds.negotiating) == (1, True)
    rounds.drained = True
    rounds.ring(NEGOTIATE)  # the news must wait for the next round
    assert doorbell.bells() == [b"unit@1", NEGOTIATE, NEGOTIATE]


def test_rank_0_releases_the_bells_of_the_rounds_every_rank_is_past():
    doorbell = RecordingDoorbell()
    first, other = Rounds(0, doorbell), Rounds(1, doorbell)
    for rounds in (first, other):
        rounds.ring(NEGOTIATE)
    other.forget()  # only rank 0 releases
    assert doorbell.wait(0, 0) == NEGOTIATE
    first.finish()
    first.ring(b"unit@1")
    first.forget()
    assert doorbell.wait(0, 0) is None and doorbell.wait(1, 0) is None
    assert not first.drained and first.since is None
