"""Heartbeats, and an engine stuck in a round on a peer that stopped: it fails with an error
naming that peer after the stall shutdown time, where the collective would wait for hours."""

from __future__ import annotations

import pytest
import torch

from ringtrain.engine import watch
from ringtrain.engine.config import EngineConfig
from ringtrain.engine.doorbell import LocalDoorbell
from ringtrain.engine.engine import Engine
from ringtrain.engine.liveness import Liveness
from ringtrain.errors import StallError
from tests.clock import FakeClock
from tests.engine.calls import count_looks, errors, submit, wait_until
from tests.engine.thread_world import ThreadWorld

pytestmark = pytest.mark.timeout(20)


def test_a_peer_is_silent_once_its_heartbeat_has_not_moved_for_the_period(clock):
    doorbell = LocalDoorbell()
    mine, beating = Liveness(0, 3, doorbell, clock), Liveness(1, 3, doorbell, clock)
    assert mine.silent(2.0) == []  # the first look only starts watching; rank 2 never beats
    for second in (1, 2, 3):
        clock.advance(1.0)
        beating.beat()
        assert mine.silent(2.0) == ([2] if second >= 2 else [])
    mine.forget()
    assert mine.silent(2.0) == []


def test_a_round_stuck_on_a_stopped_peer_fails_naming_it(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(watch, "PROBE_S", 0.01)
    # rank 1 never runs an engine: a process stopped before the round, its connections open
    world = ThreadWorld(2, timeout_s=10.0)
    engine = Engine(world.backend(0), EngineConfig(stall_shutdown_s=2.0), world.doorbell,
                    clock=clock)
    try:
        looks = count_looks([engine])
        handle = submit(engine, "orphan", torch.ones(1))
        for _ in range(20):  # the watch fails it once it has watched for 2 s of the clock
            if handle.done():
                break
            seen = looks[0]
            clock.advance(0.5)
            wait_until(lambda: handle.done() or looks[0] > seen + 1,  # noqa: B023
                       "the watch looked after the clock moved")
        (error,) = errors([handle])
        assert isinstance(error, StallError)
        assert str(error).startswith("rank(s) [1] stopped responding: no heartbeat for 2 s "
                                     "while rank 0 waited")
    finally:
        world.fail(1, "stopped by the test")  # releases the collective the engine is stuck in
        engine.shutdown(timeout=5.0)
    assert not engine.running
