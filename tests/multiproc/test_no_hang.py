"""No hang, ever: a rank that diverges (another operation under the same name), is slow past the
stall shutdown time, exits, or is stopped (SIGSTOP) in the middle of each kind of collective,
join included, ends every surviving rank's wait within the configured time, with an error that
says which rank and why. (Ranks that wait for operations under different names are a deadlock:
tests/multiproc/test_deadlock.py.)

The worlds run with a short stall time (``HOROVOD_STALL_CHECK_TIME_SECONDS``,
``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS``) to keep this fast; the defaults are Horovod's (a warning
after 60 s, no shutdown).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import ringtrain.torch as hvd
from tests.multiproc.world import WorkerError, World
from tests.waiting import wait_until

STALL_S = 2.0
_KNOBS = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "0.5",
          "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(STALL_S)}
#: A bound on a hang, far beyond the stall time: how fast a survivor notices is a speed goal
#: (benchmarks/failure_latency.py); which error ends its wait says how it noticed.
_BOUND_S = 60.0
_ASYNC_KINDS = ("allreduce", "grouped_allreduce", "allgather", "broadcast", "alltoall",
                "reducescatter")
_KINDS = _ASYNC_KINDS + ("barrier", "join")


def _start(kind: str, name: str) -> Callable[[], object]:
    """Submit one collective of ``kind``; return what waits for it."""
    n = hvd.size()
    if kind == "barrier":
        return hvd.barrier  # synchronous only, and unnamed
    if kind == "join":
        return hvd.join
    handle = {
        "allreduce": lambda: hvd.allreduce_async(torch.ones(2), name=name),
        "grouped_allreduce": lambda: hvd.grouped_allreduce_async([torch.ones(2), torch.ones(3)],
                                                                 name=name),
        "allgather": lambda: hvd.allgather_async(torch.ones(1, 2), name=name),
        "broadcast": lambda: hvd.broadcast_async(torch.ones(2), root_rank=0, name=name),
        "alltoall": lambda: hvd.alltoall_async(torch.ones(n), name=name),
        "reducescatter": lambda: hvd.reducescatter_async(torch.ones(n), name=name),
    }[kind]()
    return lambda: hvd.synchronize(handle)


def _outcome(wait: Callable[[], object]) -> str:
    try:
        wait()
        return "no error"
    except RuntimeError as exc:
        return f"{type(exc).__name__}: {exc}"


@pytest.fixture(scope="module")
def stall_world() -> Iterator[World]:
    world = World(2, env=_KNOBS)
    yield world
    world.close()


def _another_operation_under_the_same_name() -> dict[str, str]:
    r = hvd.rank()
    out = {}
    for i, kind in enumerate(_ASYNC_KINDS):
        other = _ASYNC_KINDS[(i + 1) % len(_ASYNC_KINDS)]
        out[kind] = _outcome(_start(kind if r == 0 else other, f"diverge.{kind}"))
    # rank 0 joins; rank 1 broadcasts, which needs it, then joins too
    out["join"] = _outcome(hvd.join if r == 0 else _start("broadcast", "diverge.join"))
    if r == 1:
        out["joined"] = hvd.join()
    out["after"] = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="diverge.after").item()
    return out


def test_another_operation_under_the_same_name_fails_at_once_on_every_rank(stall_world):
    results = stall_world.run(_another_operation_under_the_same_name, timeout=30)
    for out in results:
        for kind in _ASYNC_KINDS:
            # (a grouped allreduce differs from an allreduce in its number of tensors)
            assert out[kind].startswith(f"TensorMismatchError: {kind.split('_')[-1]} "
                                        f"'diverge.{kind}': ranks disagree on the"), out[kind]
            assert "(rank 0: " in out[kind] and "; rank 1: " in out[kind], out[kind]
        assert out["after"] == 2.0
    rank0, rank1 = results
    assert rank0["join"] == "no error" and rank1["joined"] == 1  # once every rank has joined
    assert ("broadcast 'diverge.join' cannot run: rank(s) [0] (the root) have already called "
            "join()") in rank1["join"]


def _a_slow_rank(gave_up: str) -> dict:
    r = hvd.rank()
    out = {}
    if r == 0:
        waits = {kind: _start(kind, f"a.{kind}") for kind in _ASYNC_KINDS}
        out["barrier"] = _outcome(hvd.barrier)
        out.update({kind: _outcome(wait) for kind, wait in waits.items()})
        Path(gave_up).touch()
    else:
        # computing until rank 0's waits have ended, never waiting: a stall, not a deadlock
        wait_until(Path(gave_up).exists, "the end of rank 0's waits", timeout_s=_BOUND_S)
        out["late"] = _outcome(lambda: _start("allreduce", "b.allreduce")())
    hvd.shutdown()  # the stall stopped every rank's engine: start a fresh one
    hvd.init()
    return out


def test_operations_a_slow_rank_has_not_submitted_end_in_a_stall_error_naming_it(stall_world,
                                                                                  tmp_path):
    rank0, rank1 = stall_world.run(_a_slow_rank, str(tmp_path / "gave-up"), timeout=2 * _BOUND_S)
    assert set(rank0) == set(_ASYNC_KINDS) | {"barrier"}
    for outcome in rank0.values():
        assert outcome.startswith(f"StallError: stalled for more than {STALL_S:g} s"), outcome
        # the error lists every stalled name and who it waits for
        for other in _ASYNC_KINDS:
            assert f"a.{other}: submitted by ranks [0], waiting for ranks [1]" in outcome
    # the slow rank learns of it when it submits: its engine stopped too
    assert rank1["late"].startswith("StallError: stalled for more than"), rank1


def _exit_in_the_middle(kind: str, waiting: str) -> str:
    if hvd.rank() == 1:
        wait_until(Path(waiting).exists, "rank 0 in the collective")
        os._exit(1)
    wait = _start(kind, f"exit.{kind}")
    Path(waiting).touch()
    return _outcome(wait)


@pytest.mark.slow
@pytest.mark.parametrize("kind", _KINDS)
def test_a_rank_that_exits_in_the_middle_of_a_collective_fails_its_peer(kind, tmp_path):
    world = World(2, env=_KNOBS)
    try:
        with pytest.raises(WorkerError) as info:
            world.run(_exit_in_the_middle, kind, str(tmp_path / "waiting"), timeout=_BOUND_S)
    finally:
        world.close()
    outcome, dead = info.value.results
    assert dead == "the process exited"
    # Its death, not the stall shutdown (STALL_S) that would end the wait otherwise.
    assert outcome.startswith("HorovodInternalError: a collective failed on rank 0, because "
                              "rank 1 (host "), outcome
    assert " died (its process is gone: it exited or was killed): " in outcome, outcome


def _stop_in_the_middle(waiting: str) -> str:
    if hvd.rank() == 1:
        wait_until(Path(waiting).exists, "rank 0 in the collective")
        os.kill(os.getpid(), signal.SIGSTOP)
    wait = _start("allreduce", "stopped")
    Path(waiting).touch()
    return _outcome(wait)


@pytest.mark.slow
def test_a_stopped_rank_fails_its_peer_naming_it_after_the_stall_time(tmp_path):
    world = World(2, env=_KNOBS)
    try:
        world.send(_stop_in_the_middle, str(tmp_path / "waiting"))
        status, outcome = world.receive(0, timeout=_BOUND_S)
    finally:
        world.kill(1)
        world.close()
    assert status == "ok", outcome
    assert outcome.startswith(f"StallError: rank(s) [1] stopped responding: no heartbeat for "
                              f"{STALL_S:g} s while rank 0 waited"), outcome
