"""Fixtures of the in-process engine tests: N engines as threads on a :class:`ThreadWorld`,
aged by a clock the test moves, and stopped (checked) after the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from ringtrain.engine import watch
from ringtrain.engine.config import EngineConfig
from ringtrain.engine.engine import Engine
from tests.clock import FakeClock
from tests.engine.thread_world import ThreadWorld

StartEngines = Callable[..., tuple[ThreadWorld, list[Engine]]]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def start_engines(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> Iterator[StartEngines]:
    """``start_engines(size, probe_s=..., inline=..., **knobs)``: a world of ``size`` ranks and
    one engine per rank, all on ``clock`` (``inline``: callers may run their own rounds); every
    engine is shut down after the test, which fails if one does not stop.

    ``probe_s`` is the pending watch's period in real time. By default it never fires within a
    test: the watch rings for requests that wait on peers, and would hide a round that the
    engine failed to ring for itself.
    """
    started: list[Engine] = []

    def start(size: int, probe_s: float = 3600.0, inline: bool = False,
              **knobs) -> tuple[ThreadWorld, list[Engine]]:
        monkeypatch.setattr(watch, "PROBE_S", probe_s)
        world = ThreadWorld(size)
        engines = [Engine(world.backend(rank), EngineConfig(**knobs), world.doorbell, clock=clock,
                          inline=inline)
                   for rank in range(size)]
        started.extend(engines)
        return world, engines

    yield start
    for engine in started:
        engine.shutdown(timeout=5.0)
    assert not [e.rank for e in started if e.running], "engines still running after shutdown"
