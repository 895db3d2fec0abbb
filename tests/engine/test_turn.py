"""The turn, without threads: a caller claims a round only while the turn is free, runs it only
if its bell is the claimed unit's, and gives the turn back (waking the engine when it did not
run the round) whatever happens."""

from __future__ import annotations

import pytest

from ringtrain.engine import turn as turn_module
from ringtrain.engine.doorbell import NEGOTIATE, LocalDoorbell
from ringtrain.engine.turn import Turn
from ringtrain.errors import HorovodInternalError


class _Doorbell(LocalDoorbell):
    """Records claims and their ends; fails waits once told to."""

    def __init__(self) -> None:
        super().__init__()
        self.claims: list[tuple[int, str]] = []
        self.unclaims: list[bool] = []
        self.broken = False

    def claim(self, round_: int, key: str) -> None:
        self.claims.append((round_, key))

    def unclaim(self, wake: bool) -> None:
        self.unclaims.append(wake)

    def wait(self, round_: int, timeout_s: float, claimed: bool = False) -> bytes | None:
        if self.broken:
            raise HorovodInternalError("rank 1 has held the doorbell's lock")
        return super().wait(round_, timeout_s, claimed)


class _Engine:
    """What the turn needs of its engine: whether it failed, and how to fail it."""

    def __init__(self) -> None:
        self.failure: HorovodInternalError | None = None

    def failed(self) -> bool:
        return self.failure is not None

    def fail(self, error: HorovodInternalError) -> None:
        self.failure = error


def _turn(doorbell: _Doorbell, engine: _Engine | None = None) -> Turn:
    engine = engine or _Engine()
    return Turn(doorbell, True, engine.failed, engine.fail)


def test_a_caller_claims_a_round_only_while_the_turn_is_free():
    doorbell = _Doorbell()
    turn = _turn(doorbell)
    assert turn.claim(4, "7.0")
    assert turn.claimed("7.0@3") and not turn.claimed("7.01@3") and not turn.claimed(None)
    assert not turn.claim(4, "8.0")  # held: by this caller here, or by the engine thread
    assert doorbell.claims == [(4, "7.0")]
    turn.give_back(wake=True)
    assert not turn.lock.locked() and doorbell.unclaims == [True]


def test_the_claimed_units_bell_runs_the_round_in_the_callers_thread():
    doorbell = _Doorbell()
    turn = _turn(doorbell)
    ran: list[bytes] = []
    assert turn.claim(0, "7.0")
    doorbell.ring(0, b"7.0@1")
    turn.run_claimed(0, b"7.0@1", ran.append)
    assert ran == [b"7.0@1"]
    assert not turn.lock.locked() and doorbell.unclaims == [False]  # the engine need not wake


def test_another_bell_leaves_the_round_to_the_engine_and_wakes_it():
    doorbell = _Doorbell()
    turn = _turn(doorbell)
    ran: list[bytes] = []
    assert turn.claim(0, "7.0")
    doorbell.ring(0, NEGOTIATE)
    turn.run_claimed(0, b"7.0@1", ran.append)
    assert ran == [] and not turn.lock.locked() and doorbell.unclaims == [True]


def test_a_caller_gives_up_on_a_bell_that_does_not_come_or_an_engine_that_failed(monkeypatch):
    monkeypatch.setattr(turn_module, "GIVE_UP_S", 0.0)
    doorbell, engine = _Doorbell(), _Engine()
    turn = _turn(doorbell, engine)
    ran: list[bytes] = []
    for failure in (None, HorovodInternalError("a peer died")):
        engine.failure = failure
        assert turn.claim(0, "7.0")
        turn.run_claimed(0, b"7.0@1", ran.append)
    assert ran == [] and not turn.lock.locked() and doorbell.unclaims == [True, True]


def test_a_doorbell_error_while_waiting_fails_the_engine_and_gives_the_turn_back():
    doorbell, engine = _Doorbell(), _Engine()
    turn = _turn(doorbell, engine)
    doorbell.broken = True
    assert turn.claim(0, "7.0")
    turn.run_claimed(0, b"7.0@1", pytest.fail)
    assert "held the doorbell's lock" in str(engine.failure)
    assert not turn.lock.locked() and doorbell.unclaims == [True]
