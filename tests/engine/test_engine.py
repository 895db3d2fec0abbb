"""The engine, with N ranks as threads of this process: rounds, mismatches, shutdown, stalls and
failed peers (joins: test_join.py), on real engines whose requests age by a clock the test moves.

Requests are submitted from the test's thread to each rank's engine in turn (submission does not
block); every wait is bounded.
"""

from __future__ import annotations

import logging
import threading

import pytest
import torch

from ringtrain.engine import round_runner
from ringtrain.engine.doorbell import NEGOTIATE
from ringtrain.engine.request import OpKey
from ringtrain.errors import HorovodInternalError, StallError, TensorMismatchError
from ringtrain.op_types import OpType, ReduceOp
from tests.engine.calls import (
    WAIT_S,
    count_looks,
    errors,
    results,
    step,
    submit,
    sum_ones,
    wait_until,
)

pytestmark = pytest.mark.timeout(20)


# -- rounds ---------------------------------------------------------------------------------------

def test_a_lone_operation_is_negotiated_and_runs_once_on_every_rank(start_engines):
    world, engines = start_engines(3)
    handles = [submit(e, "lone", torch.full((2,), e.rank + 1.0)) for e in engines]
    assert results(handles) == [[6.0, 6.0]] * 3
    assert world.completed["allreduce"] == 1
    # the cache did not know the name: the metas were exchanged, in negotiation rounds only
    assert world.completed["control_allgather"] >= 1
    assert set(world.doorbell.bells()) == {NEGOTIATE}


def test_a_cached_unit_runs_in_one_round_of_its_own_with_no_negotiation(start_engines):
    world, engines = start_engines(2)
    bucket = ("grad.a", "grad.b")
    assert step(engines, bucket, lambda r: 1.0) == [[2.0, 2.0]] * 4  # negotiated and cached
    rounds, negotiations = len(world.doorbell.bells()), world.completed["control_allreduce"]
    allreduces = world.completed["allreduce"]

    for i in range(3):  # step calls the lambda before it returns
        assert step(engines, bucket, lambda r: r + i) == [[2.0 * i + 1] * 2] * 4  # noqa: B023

    new_bells = world.doorbell.bells()[rounds:]
    assert len(new_bells) == 3 and NEGOTIATE not in new_bells  # one unit round per step
    assert world.completed["control_allreduce"] == negotiations
    assert world.completed["allreduce"] == allreduces + 3  # the two tensors fused each time


def test_a_lone_cached_operation_runs_in_a_unit_round_with_its_collective_alone(start_engines):
    # a synchronous collective, submitted while nothing else is queued: once cached, one
    # collective per operation (no control allreduce), one round, rung only when every rank has it
    world, engines = start_engines(3)
    assert results([submit(e, "lone", torch.ones(2)) for e in engines]) == [[3.0, 3.0]] * 3
    rounds, negotiations = len(world.doorbell.bells()), world.completed["control_allreduce"]

    for i in range(4):
        handles = [submit(e, "lone", torch.full((2,), float(e.rank + i))) for e in engines]
        assert results(handles) == [[3.0 + 3 * i] * 2] * 3

    new_bells = world.doorbell.bells()[rounds:]
    assert len(new_bells) == 4 and NEGOTIATE not in new_bells
    assert world.completed["control_allreduce"] == negotiations
    assert world.completed["allreduce"] == 5


def test_the_same_name_in_disjoint_process_sets_is_two_operations(start_engines):
    # Issue 35 (Horovod's test_async_sparse_allreduce_process_sets): ranks 0 and 1, each in a
    # set of its own, submit the same names. Keyed by name alone, two such requests taken by one
    # negotiation round failed as "ranks disagree on the process set"; holding both engines'
    # turns while the ranks submit makes that round certain. Later steps run from the cache.
    world, engines = start_engines(2)
    for engine in engines:
        world.backend(engine.rank).add_set((engine.rank,))
    names = ("0.indices", "0.values")
    for i in range(3):
        turns = [e._turn.lock for e in engines]
        for turn in turns:
            turn.acquire()
        try:
            handles = [submit(e, name, torch.full((2,), 10.0 * e.rank + i), op=OpType.ALLGATHER,
                              ranks=(e.rank,)) for e in engines for name in names]
        finally:
            for turn in turns:
                turn.release()
        assert results(handles) == [[10.0 * r + i] * 2 for r in (0, 1) for _ in names], i


def test_a_lone_cached_operation_on_a_process_set_leaves_the_other_ranks_idle(start_engines):
    world, engines = start_engines(3)
    evens = (0, 2)
    for engine in engines:
        world.backend(engine.rank).add_set(evens)
    members = [engines[0], engines[2]]

    def lone(value: float) -> list:
        return results([submit(e, "set.lone", torch.full((1,), e.rank + value), ranks=evens)
                        for e in members])

    assert lone(0.5) == [[3.0]] * 2  # negotiated: the cache learns it
    rounds, negotiations = len(world.doorbell.bells()), world.completed["control_allreduce"]
    assert lone(1.5) == [[5.0]] * 2
    assert lone(2.5) == [[7.0]] * 2
    new_bells = world.doorbell.bells()[rounds:]
    assert len(new_bells) == 2 and NEGOTIATE not in new_bells
    assert world.completed["control_allreduce"] == negotiations  # rank 1 took part in none
    assert world.completed["allreduce"] == 3


def test_lone_operations_give_exact_averages_sums_and_maxima_in_their_dtypes(start_engines):
    world, engines = start_engines(3)
    # name: dtype, reduction, each rank's values, the exact result (binary fractions)
    cases = {"avg.f64": (torch.float64, ReduceOp.AVERAGE, [[0.5, 1], [0.5, 2], [2, 3]],
                         [1.0, 2.0]),
             "avg.f16": (torch.float16, ReduceOp.AVERAGE, [[0.25, 1], [0.25, 2], [0.25, 3]],
                         [0.25, 2.0]),
             "sum.i32": (torch.int32, ReduceOp.SUM, [[0, 1], [0, 2], [1, 3]], [1, 6]),
             "max.f32": (torch.float32, ReduceOp.MAX, [[0, 1], [0, 2], [1, 3]], [1.0, 3.0])}
    for _ in range(2):  # negotiated, then cached and counted
        for name, (dtype, op, values, expected) in cases.items():
            handles = [submit(e, name, torch.tensor(values[e.rank], dtype=dtype), reduce_op=op)
                       for e in engines]
            assert results(handles) == [expected] * 3, name
    assert NEGOTIATE not in world.doorbell.bells()[-len(cases):]


def test_lone_operations_counted_on_one_rank_and_negotiated_on_another_run_once_and_resume(
        start_engines):
    world, engines = start_engines(2)
    sum_ones(engines, ("mix.a", "mix.b"))
    # rank 0 submits a then b; rank 1 b then a: each counts its first alone, and its second
    # (queued behind it) rings for a negotiation, which runs both whatever was counted
    for i in range(3):
        handles = [submit(engines[0], "mix.a", torch.full((1,), float(i))),
                   submit(engines[1], "mix.b", torch.full((1,), float(i))),
                   submit(engines[0], "mix.b", torch.ones(1)),
                   submit(engines[1], "mix.a", torch.ones(1))]
        assert results(handles) == [[i + 1.0]] * 4, f"step {i}"
    # the counters were renewed alike on both ranks: lone operations have unit rounds again
    rounds, negotiations = len(world.doorbell.bells()), world.completed["control_allreduce"]
    sum_ones(engines, ("mix.a", "mix.b"))
    assert NEGOTIATE not in world.doorbell.bells()[rounds:]
    assert world.completed["control_allreduce"] == negotiations


def test_an_operation_a_peer_negotiated_before_this_rank_submitted_it_is_not_counted_alone(
        start_engines):
    # Rank 0's burst: x counted alone, y queued behind it, rung for a negotiation that runs
    # before rank 1 has either. Rank 1 then submits x (its unit completes) and, alone, y: counted
    # by itself, y's counter could never complete (rank 0 offered it uncounted) and nothing
    # would ring for it (the pending watch is off here). Rank 1 must ring a negotiation for it.
    _, engines = start_engines(2)
    sum_ones(engines, ("burst.x", "burst.y"))
    burst_y = OpKey("burst.y", (0, 1))
    for i in range(3):
        first = [submit(engines[0], "burst.x", torch.full((1,), float(i))),
                 submit(engines[0], "burst.y", torch.full((1,), float(i)))]
        backlog = engines[0]._backlog
        wait_until(lambda: burst_y in backlog.pending and not backlog.queue,  # noqa: B023
                   "rank 0's negotiation round took its burst")
        x = submit(engines[1], "burst.x", torch.ones(1))
        assert results([first[0], x]) == [[i + 1.0]] * 2
        y = submit(engines[1], "burst.y", torch.ones(1))
        assert results([first[1], y]) == [[i + 1.0]] * 2, f"step {i}"


def test_units_that_differ_between_ranks_keep_running_through_negotiation_rounds(
        start_engines, clock):
    # rank 0 submits one unit of two names, rank 1 a unit per name: no readiness counter ever
    # has all members, and the pending watch's negotiation rounds run them
    world, engines = start_engines(2, probe_s=0.01)
    step(engines, ("diff.a", "diff.b"), lambda r: 1.0)
    for i in range(3):
        handles = []
        with engines[0].one_round():
            handles += [submit(engines[0], n, torch.full((2,), 1.0)) for n in ("diff.a", "diff.b")]
        for name in ("diff.a", "diff.b"):
            with engines[1].one_round():
                handles.append(submit(engines[1], name, torch.full((2,), float(i))))
        clock.advance(1.0)
        assert results(handles) == [[i + 1.0] * 2] * 4, f"step {i}"
    assert world.completed["allreduce"] == 4  # each step: one round, both names fused


def test_the_watch_rings_no_round_for_requests_a_negotiation_in_progress_took(
        start_engines, clock):
    # Rank 1's negotiation round that took "held.y" is held inside its control collective while
    # the requests grow old: the watches must leave them to it, not ring another round behind
    # it (in which a rank could offer its peers' next submissions before they make them).
    world, engines = start_engines(2, probe_s=0.01)
    sum_ones(engines, ("held.x",))
    held, entered = threading.Event(), threading.Event()
    backend = world.backend(1)
    at_hold: list[tuple[int, int]] = []  # rounds rung, negotiations completed

    def holding(counts, _original=backend.control_allreduce):
        # A round rung by rank 0's submission may start here before "held.y" is submitted to
        # rank 1: that one runs on, and the next takes it.
        if OpKey("held.y", (0, 1)) in engines[1]._backlog.pending and not entered.is_set():
            at_hold.append((len(world.doorbell.bells()), world.completed["control_allreduce"]))
            entered.set()
            assert held.wait(WAIT_S), "the test never released the round"
        return _original(counts)

    backend.control_allreduce = holding  # type: ignore[method-assign]
    looks = count_looks(engines)
    handles = [submit(e, "held.y", torch.ones(1)) for e in engines]  # new: negotiated
    assert entered.wait(WAIT_S)
    clock.advance(1.0)  # the requests are old: a watch between rounds would ring now
    wait_until(lambda: all(not e._backlog.queue and e._rounds.drained for e in engines),
               "both rounds took their requests")
    seen = list(looks)
    wait_until(lambda: all(n >= s + 10 for n, s in zip(looks, seen)), "ten looks of each watch")
    held.set()
    assert results(handles) == [[2.0], [2.0]]
    ((rounds, negotiations),) = at_hold
    assert len(world.doorbell.bells()) == rounds  # no round rung behind the held one
    assert world.completed["control_allreduce"] == negotiations + 1


def test_a_process_set_runs_among_its_members_and_its_units_leave_the_others_idle(
        start_engines):
    world, engines = start_engines(3)
    evens = (0, 2)
    for engine in engines:
        world.backend(engine.rank).add_set(evens)
    members = [engines[0], engines[2]]
    assert step(members, ("set.a",), lambda r: r + 1.0, ranks=evens) == [[4.0, 4.0]] * 2
    rounds, negotiations = len(world.doorbell.bells()), world.completed["control_allreduce"]

    assert step(members, ("set.a",), lambda r: r, ranks=evens) == [[2.0, 2.0]] * 2
    assert len(world.doorbell.bells()) == rounds + 1  # a unit round, rank 1 read it too
    assert world.completed["control_allreduce"] == negotiations
    assert results([submit(e, "world.after", torch.ones(1)) for e in engines]) == [[3.0]] * 3


def test_the_other_collectives_run_through_the_engine(start_engines):
    _, engines = start_engines(3)
    gathered = [submit(e, "gather", torch.full((e.rank + 1,), float(e.rank)),
                       op=OpType.ALLGATHER) for e in engines]
    broadcast = [submit(e, "bcast", torch.full((2,), float(e.rank)), op=OpType.BROADCAST,
                        root_rank=1) for e in engines]
    barrier = [submit(e, "barrier", op=OpType.BARRIER) for e in engines]
    assert results(gathered) == [[0.0, 1.0, 1.0, 2.0, 2.0, 2.0]] * 3
    assert results(broadcast) == [[1.0, 1.0]] * 3
    assert results(barrier) == [None] * 3


def test_a_name_in_flight_twice_is_refused(start_engines):
    _, engines = start_engines(2)
    first = submit(engines[0], "dup", torch.ones(1))
    with pytest.raises(ValueError, match="'dup' is already in flight"):
        submit(engines[0], "dup", torch.ones(1))
    second = submit(engines[1], "dup", torch.ones(1))
    assert results([first, second]) == [[2.0], [2.0]]


# -- mismatches -----------------------------------------------------------------------------------

def test_a_mismatch_fails_that_operation_on_every_rank_and_the_engine_goes_on(start_engines):
    _, engines = start_engines(2)
    shape = errors([submit(e, "mm.shape", torch.ones(e.rank + 1)) for e in engines])
    dtype = errors([submit(e, "mm.dtype", torch.ones(2, dtype=torch.float32 if e.rank
                                                      else torch.float64)) for e in engines])
    for error in shape:
        assert isinstance(error, TensorMismatchError)
        assert "'mm.shape': ranks disagree on the shape (rank 0: [1]; rank 1: [2])" in str(error)
    for error in dtype:
        assert "'mm.dtype': ranks disagree on the dtype (rank 0: float64; rank 1: float32)" \
            in str(error)
    assert results([submit(e, "after.mismatch", torch.ones(1)) for e in engines]) == [[2.0]] * 2


def test_a_mismatch_on_a_cached_unit_renews_its_counter_and_unit_rounds_resume(start_engines):
    world, engines = start_engines(2)
    step(engines, ("cached",), lambda r: 1.0)
    with engines[0].one_round():
        good = submit(engines[0], "cached", torch.ones(2))
    with engines[1].one_round():
        bad = submit(engines[1], "cached", torch.ones(3))
    for error in errors([good, bad]):
        assert "'cached': ranks disagree on the shape (rank 0: [2]; rank 1: [3])" in str(error)

    rounds = len(world.doorbell.bells())
    assert step(engines, ("cached",), lambda r: r + 1.0) == [[3.0, 3.0]] * 2
    new_bells = world.doorbell.bells()[rounds:]
    assert len(new_bells) == 1 and new_bells != [NEGOTIATE]


# -- shutdown -------------------------------------------------------------------------------------

def test_shutdown_on_one_rank_stops_every_rank_and_fails_what_is_pending(start_engines):
    _, engines = start_engines(3)
    pending = submit(engines[0], "pending", torch.ones(1))  # waits for ranks 1 and 2
    engines[2].shutdown(timeout=WAIT_S)

    (error,) = errors([pending])
    assert isinstance(error, HorovodInternalError)
    assert "shut down (hvd.shutdown() was called on 1 rank(s))" in str(error)
    wait_until(lambda: not any(e.running for e in engines), "every engine stopped")
    for engine in engines:
        engine.shutdown(timeout=WAIT_S)  # idempotent, on the rank that asked and the others
        with pytest.raises(HorovodInternalError, match="shut down"):
            submit(engine, "too.late", torch.ones(1))


def test_shutdown_returns_with_none_of_the_engines_threads_left(start_engines):
    # A daemon thread still inside a store call when the interpreter finalizes aborts the
    # process after a run that succeeded: shutdown must end the pending watch too.
    before = set(threading.enumerate())
    _, engines = start_engines(2)
    started = [t for t in threading.enumerate()
               if t not in before and t.name.startswith("ringtrain-")]
    assert sorted(t.name for t in started) == ["ringtrain-engine"] * 2 + [
        "ringtrain-pending-watch"] * 2
    for engine in engines:
        engine.shutdown(timeout=WAIT_S)
    assert [t.name for t in started if t.is_alive()] == []


def test_a_unit_whose_block_closes_after_shutdown_fails_its_handles(start_engines):
    _, engines = start_engines(2)
    with engines[1].one_round():
        late = submit(engines[1], "late", torch.ones(1))
        engines[0].shutdown(timeout=WAIT_S)
        wait_until(lambda: not engines[1].running, "rank 1 stopped")
    (error,) = errors([late])
    assert isinstance(error, HorovodInternalError) and "shut down" in str(error)


# -- stalls ---------------------------------------------------------------------------------------

def test_a_stall_warns_every_rank_then_stops_every_rank(start_engines, clock, caplog):
    # the pending watch rings every 10 ms of real time once the clock has aged the request
    _, engines = start_engines(2, probe_s=0.01, stall_warning_s=1.0, stall_shutdown_s=3.0)
    caplog.set_level(logging.WARNING, logger="ringtrain.engine.stall")

    def warnings() -> list[str]:
        return sorted(r.getMessage() for r in caplog.records if r.name == "ringtrain.engine.stall")

    stalled = submit(engines[0], "stalled.tensor", torch.ones(1))
    clock.advance(1.5)
    wait_until(lambda: len(warnings()) == 2, "both ranks warned")
    for rank, message in zip((0, 1), warnings()):
        assert message.startswith(f"rank {rank}: some ranks submitted operations")
        assert ("stalled.tensor: submitted by ranks [0], waiting for ranks [1] for 1.5 s"
                in message)
    assert not stalled.done()

    clock.advance(2.0)
    (error,) = errors([stalled])
    assert isinstance(error, StallError)
    assert str(error).startswith("stalled for more than 3 s, shutting down")
    assert "waiting for ranks [1] for 3.5 s" in str(error)
    wait_until(lambda: not engines[1].running, "rank 1 stopped")
    with pytest.raises(StallError, match="stalled.tensor"):
        submit(engines[1], "after.stall", torch.ones(1))
    assert len(warnings()) == 2  # one warning per rank and period


# -- failed peers ---------------------------------------------------------------------------------

def test_a_failed_peer_stops_every_engine_with_a_named_error(start_engines):
    world, engines = start_engines(3)
    world.fail(2, "connection reset by peer")
    (error,) = errors([submit(engines[0], "orphan", torch.ones(1))])

    assert isinstance(error, HorovodInternalError)
    assert str(error).startswith("a collective failed on rank 0, most likely because another "
                                 "rank failed or exited")
    assert "rank 2 failed (connection reset by peer)" in str(error)
    wait_until(lambda: not any(e.running for e in engines), "every engine stopped")
    with pytest.raises(HorovodInternalError, match="rank 2's backend failed"):
        submit(engines[2], "after.failure", torch.ones(1))
    with pytest.raises(HorovodInternalError, match="a collective failed on rank 1"):
        submit(engines[1], "after.failure", torch.ones(1))



def test_a_round_stops_gathering_once_its_submitters_block_on_their_results(start_engines,
                                                                             monkeypatch):
    # A quiet period and a cycle far past the test's bound: only callers blocking on their
    # handles can end the gathering (a synchronous collective submits nothing more).
    monkeypatch.setattr(round_runner, "_QUIET_S", 60.0)
    _, engines = start_engines(2, cycle_time_ms=600_000)
    handles = [submit(e, "sync", torch.full((2,), e.rank + 1.0)) for e in engines]
    out: dict[int, list] = {}
    waiters = [threading.Thread(target=lambda i=i: out.setdefault(i, results([handles[i]])))
               for i in range(2)]
    for waiter in waiters:
        waiter.start()
    for waiter in waiters:
        waiter.join(WAIT_S + 1)
    assert out == {0: [[3.0, 3.0]], 1: [[3.0, 3.0]]}
    monkeypatch.setattr(round_runner, "_QUIET_S", 0.0002)  # shutdown rounds gather as usual
