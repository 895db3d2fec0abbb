"""Deadlocks end, on real multi-rank Gloo worlds with Horovod's default stall settings (a
warning after 60 s, never a shutdown): when ranks diverge so that each waits for an operation
the other never submits, every rank's wait ends within seconds with a ``DeadlockError`` that
names the operations; a rank that is still computing is never taken for blocked; and a signal
handler interrupts a wait on an operation that has not completed."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import ringtrain.torch as hvd
from tests.multiproc.test_no_hang import _ASYNC_KINDS, _outcome, _start
from tests.multiproc.world import World
from tests.waiting import wait_until

#: How long a test lets the ranks take; detection takes a few seconds (about three probes).
_BOUND_S = 60


@pytest.fixture
def diverging2() -> Iterator[World]:
    """A world of its own: ranks that diverged submitted different unnamed operations, so their
    generated names no longer meet, and the worlds other tests share must not inherit that."""
    world = World(2)
    yield world
    world.close()


@pytest.fixture
def diverging3() -> Iterator[World]:
    """As :func:`diverging2`, three ranks."""
    world = World(3)
    yield world
    world.close()


def _diverge() -> dict[str, str]:
    """Each rank waits for an operation of every kind that the other never submits."""
    r = hvd.rank()
    out = {}
    for kind in _ASYNC_KINDS:
        out[kind] = _outcome(_start(kind, f"{'ab'[r]}.{kind}"))
    # an (unnamed) barrier on rank 0 while rank 1 waits in an allreduce
    out["barrier"] = _outcome(hvd.barrier if r == 0 else _start("allreduce", "b.barrier"))
    out["after"] = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="deadlock.after").item()
    return out


def test_ranks_that_diverge_in_every_kind_of_collective_fail_with_a_named_deadlock(diverging2):
    results = diverging2.run(_diverge, timeout=_BOUND_S * 3)
    for _r, out in enumerate(results):
        assert out.pop("after") == 2.0  # the engine goes on: nothing was stopped
        for kind, outcome in out.items():
            assert outcome.startswith("DeadlockError: deadlock: rank(s) [0, 1] wait for "
                                      "operations that can never complete"), outcome
            op = kind.split("_")[-1]
            # both ranks' awaited operations are named in every rank's error
            if kind == "barrier":
                assert "rank 0 waits for barrier 'barrier.noname." in outcome, outcome
                assert ("rank 1 waits for allreduce 'b.barrier' (not submitted by rank(s) [0])"
                        in outcome), outcome
            else:
                for rank, prefix in enumerate("ab"):
                    assert (f"rank {rank} waits for {op} '{prefix}.{kind}' (not submitted by "
                            f"rank(s) [{1 - rank}])") in outcome, outcome


def _join_while_the_others_diverge() -> str:
    r = hvd.rank()
    # Start together: a rank still being set up is not blocked, and ranks blocked without it
    # would be a deadlock of their own (detected in about two seconds) that leaves it waiting.
    hvd.allreduce(torch.ones(1), op=hvd.Sum, name="join.start")
    if r == 0:
        return _outcome(hvd.join)
    return _outcome(_start("allreduce", f"join.{r}"))


def test_a_join_waiting_for_ranks_that_diverge_fails_with_them(diverging3):
    results = diverging3.run(_join_while_the_others_diverge, timeout=_BOUND_S)
    for outcome in results:
        assert outcome.startswith("DeadlockError: deadlock: rank(s) [0, 1, 2]"), outcome
        assert "rank 0 waits for join() (not submitted by rank(s) [1, 2])" in outcome, outcome
        assert "rank 1 waits for allreduce 'join.1' (not submitted by rank(s) [2])" in outcome
        assert "rank 2 waits for allreduce 'join.2' (not submitted by rank(s) [1])" in outcome
    assert diverging3.run(hvd.size) == [3, 3, 3]


def _compute_first(seconds: float) -> float:
    if hvd.rank() == 1:
        time.sleep(seconds)  # computing, not waiting: never blocked
    return hvd.allreduce(torch.ones(1), op=hvd.Sum, name="slow.rank").item()


@pytest.mark.slow
def test_a_rank_that_computes_for_12_s_before_the_collective_is_no_deadlock(world2):
    # six times what detecting a deadlock takes (about 2 s), over two full exchanges (5 s)
    assert world2.run(_compute_first, 12.0, timeout=_BOUND_S + 12) == [2.0, 2.0]


class _Interrupted(Exception):
    pass


def _interrupt_a_wait(interrupted: str) -> dict:
    r = hvd.rank()
    out = {}
    if r == 1:
        # rank 0's wait could only end by the handler until this rank submits
        wait_until(Path(interrupted).exists, "the interruption of rank 0's wait")
        out["result"] = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="late").item()
        return out

    def handler(signum, frame):
        raise _Interrupted

    handle = hvd.allreduce_async(torch.ones(1), op=hvd.Sum, name="late")
    previous = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        hvd.synchronize(handle)
        out["interrupted"] = False
    except _Interrupted:
        out["interrupted"] = True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        Path(interrupted).touch()
    out["result"] = hvd.synchronize(handle).item()  # the operation went on: wait again
    return out


def test_a_signal_handler_interrupts_a_wait_and_the_operation_can_be_waited_for_again(world2,
                                                                                     tmp_path):
    zero, one = world2.run(_interrupt_a_wait, str(tmp_path / "interrupted"), timeout=_BOUND_S)
    assert zero == {"interrupted": True, "result": 2.0}
    assert one == {"result": 2.0}
