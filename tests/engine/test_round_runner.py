"""The round runner in a world of one, its rounds run by the test's own thread: a negotiation
round decides and caches a new operation, a unit round runs a counted one with no control
collective, and a shutdown round stops the rank."""

from __future__ import annotations

import pytest
import torch

from ringtrain.engine.config import EngineConfig
from ringtrain.engine.doorbell import NEGOTIATE
from ringtrain.engine.request import Request
from ringtrain.engine.round_runner import RoundRunner
from ringtrain.errors import HorovodInternalError
from tests.clock import FakeClock
from tests.engine.calls import request
from tests.engine.thread_world import ThreadWorld


def _runner() -> tuple[ThreadWorld, RoundRunner]:
    world = ThreadWorld(1)
    return world, RoundRunner(world.backend(0), EngineConfig(), world.doorbell, "GLOO",
                              FakeClock(), (), inline=False)


def _queued(runner: RoundRunner, name: str, value: float) -> Request:
    made = request(0, (0,), name, torch.full((2,), value))
    with runner.backlog.lock:
        runner.backlog.add(made, 0.0)
        bell = runner.readiness.count([made])  # as a lone submission is: a unit of one
        runner.backlog.queue.append(made)
        runner.rounds.ring(bell or NEGOTIATE)
    return made


def _next_round(world: ThreadWorld, runner: RoundRunner) -> bool:
    bell = world.doorbell.wait(runner.rounds.current, 0)
    assert bell is not None, "nothing rang the round"
    return runner.run_round(bell)


def test_a_negotiation_round_runs_a_new_operation_and_a_unit_round_runs_it_once_cached():
    world, runner = _runner()
    first = _queued(runner, "x", 3.0)
    assert world.doorbell.bells() == [NEGOTIATE]  # the cache does not know it yet
    assert _next_round(world, runner)
    assert first.handle.wait(0).tolist() == [3.0, 3.0]
    assert runner.rounds.current == 1 and not runner.backlog.keys

    second = _queued(runner, "x", 4.0)
    assert world.doorbell.bells()[-1] != NEGOTIATE  # counted: its unit's tag
    negotiations = world.completed["control_allreduce"]
    assert _next_round(world, runner)
    assert second.handle.wait(0).tolist() == [4.0, 4.0]
    assert world.completed["control_allreduce"] == negotiations


def test_a_shutdown_round_stops_the_rank_and_fails_what_it_holds():
    world, runner = _runner()
    waiting = request(0, (0,), "late")
    with runner.backlog.lock:
        runner.backlog.add(waiting, 0.0)
        runner.backlog.queue.append(waiting)
        runner.backlog.shutdown_requested = True
        runner.rounds.ring(NEGOTIATE)
    assert not _next_round(world, runner)
    with pytest.raises(HorovodInternalError, match=r"shut down \(hvd.shutdown\(\) was called"):
        waiting.handle.wait(0)
