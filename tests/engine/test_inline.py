"""Callers that run their own rounds (the engine's ``inline`` mode): a synchronous lone cached
operation runs in the thread that submitted it, in the order every rank's engine would run it;
any other bell gives the round back to the engine thread.

N ranks run as threads of this process (see thread_world); every wait is bounded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from ringtrain.engine.doorbell import NEGOTIATE
from ringtrain.engine.engine import Engine
from ringtrain.errors import HorovodInternalError
from tests.engine.calls import WAIT_S, results, submit, wait_until
from tests.engine.thread_world import ThreadWorld

pytestmark = pytest.mark.timeout(30)

_ENGINE_THREAD = "ringtrain-engine"


def _record_allreduce_threads(world: ThreadWorld, engines: list[Engine]) -> list[list[str]]:
    """Per rank, the name of the thread that ran each of its data allreduces, in order."""
    seen: list[list[str]] = [[] for _ in engines]
    for engine in engines:
        backend = world.backend(engine.rank)

        def recording(*args, _original=backend.start_allreduce, _seen=seen[engine.rank]):
            _seen.append(threading.current_thread().name)
            return _original(*args)

        backend.start_allreduce = recording  # type: ignore[method-assign]
    return seen


def _sync(engine: Engine, name: str, value: float) -> list[float]:
    """A synchronous allreduce, as ``hvd.allreduce_`` submits it."""
    return submit(engine, name, torch.full((2,), value), synchronous=True).wait(WAIT_S).tolist()


def _in_threads(calls: list[Callable[[], Any]], names: list[str]) -> list[Any]:
    """Run each call in a thread of its own name; their results, or the first error raised."""
    out: list[Any] = [None] * len(calls)
    failed: list[BaseException] = []

    def run(i: int) -> None:
        try:
            out[i] = calls[i]()
        except BaseException as exc:  # reported to the test below
            failed.append(exc)

    threads = [threading.Thread(target=run, args=(i,), name=names[i], daemon=True)
               for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(4 * WAIT_S)
    assert not [t.name for t in threads if t.is_alive()], "a caller thread is still blocked"
    if failed:
        raise failed[0]
    return out


def test_a_synchronous_lone_cached_operation_runs_in_its_callers_thread(start_engines):
    world, engines = start_engines(2, inline=True)
    seen = _record_allreduce_threads(world, engines)

    def loop(engine: Engine) -> list[list[float]]:
        return [_sync(engine, "lone", engine.rank + float(i)) for i in range(20)]

    got = _in_threads([lambda e=e: loop(e) for e in engines], ["caller-0", "caller-1"])

    assert got == [[[2.0 * i + 1] * 2 for i in range(20)]] * 2
    for rank, threads in enumerate(seen):
        assert len(threads) == 20
        assert threads[0] == _ENGINE_THREAD  # not cached yet: negotiated by the engines
        assert set(threads) <= {_ENGINE_THREAD, f"caller-{rank}"}
        assert threads.count(f"caller-{rank}") >= 1, threads
    bells = world.doorbell.bells()
    first_unit = next(i for i, bell in enumerate(bells) if bell != NEGOTIATE)
    assert len(bells[first_unit:]) == 19 and NEGOTIATE not in bells[first_unit:]


def test_callers_rounds_keep_the_order_of_a_burst_from_another_thread(start_engines):
    # Each rank: one thread allreduces "s" synchronously, another submits bursts of three
    # asynchronous allreduces. A rank that ran a collective out of order would pair its data
    # with another name's on its peer: every sum below would be wrong.
    _, engines = start_engines(2, inline=True)

    def lone(engine: Engine) -> list[list[float]]:
        return [_sync(engine, "s", engine.rank + float(i)) for i in range(15)]

    def bursts(engine: Engine) -> list[list]:
        out = []
        for _ in range(15):
            handles = [submit(engine, f"b.{k}", torch.full((2,), 10.0 * k + engine.rank))
                       for k in range(3)]
            out.append(results(handles))
        return out

    got = _in_threads([lambda e=e: lone(e) for e in engines]
                      + [lambda e=e: bursts(e) for e in engines],
                      ["lone-0", "lone-1", "burst-0", "burst-1"])

    assert got[:2] == [[[2.0 * i + 1] * 2 for i in range(15)]] * 2
    assert got[2:] == [[[[20.0 * k + 1] * 2 for k in range(3)]] * 15] * 2


def test_a_negotiation_rung_for_the_claimed_round_gives_it_back_to_the_engine(start_engines):
    world, engines = start_engines(2, inline=True)
    _in_threads([lambda e=e: _sync(e, "lone", 1.0) for e in engines], ["warm-0", "warm-1"])
    seen = _record_allreduce_threads(world, engines)
    rounds = len(world.doorbell.bells())

    waiting: list[Any] = []
    caller = threading.Thread(target=lambda: waiting.append(_sync(engines[0], "lone", 5.0)),
                              name="caller-0", daemon=True)
    caller.start()
    wait_until(lambda: engines[0]._turn.lock.locked(), "rank 0's caller holds the turn")
    # Rank 1 submits a name the cache does not know: its negotiation takes the round rank 0's
    # caller waits for, and rank 0's engine must run it (and the lone operation after it).
    other = [submit(engines[1], "other", torch.ones(1)), submit(engines[0], "other", torch.ones(1))]
    assert results(other) == [[2.0], [2.0]]
    lone = submit(engines[1], "lone", torch.full((2,), 2.0))
    assert results([lone]) == [[7.0, 7.0]]
    caller.join(WAIT_S)
    assert waiting == [[7.0, 7.0]]

    assert world.doorbell.bells()[rounds] == NEGOTIATE
    assert seen[0] == [_ENGINE_THREAD, _ENGINE_THREAD]  # "other", then "lone", both given back


def test_a_callers_failed_collective_fails_its_engine_naming_the_peer(start_engines):
    world, engines = start_engines(2, inline=True)
    _in_threads([lambda e=e: _sync(e, "lone", 1.0) for e in engines], ["warm-0", "warm-1"])
    seen = _record_allreduce_threads(world, engines)
    world.fail(1, "connection reset by peer")

    with pytest.raises(HorovodInternalError) as caught:
        _in_threads([lambda: _sync(engines[0], "lone", 1.0),
                     lambda: submit(engines[1], "lone", torch.ones(2))], ["caller-0", "peer"])

    assert seen[0] == ["caller-0"]  # the collective that failed ran in the caller's thread
    assert str(caught.value).startswith("a collective failed on rank 0, most likely because "
                                        "another rank failed or exited")
    assert "rank 1 failed (connection reset by peer)" in str(caught.value)
    wait_until(lambda: not engines[0].running, "rank 0's engine stopped")
    with pytest.raises(HorovodInternalError, match="a collective failed on rank 0"):
        submit(engines[0], "after.failure", torch.ones(1))
