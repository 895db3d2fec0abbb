"""Deadlock detection as a pure function of every rank's pending metas: which blocked ranks can
never go on, and the error their awaited operations fail with."""

from __future__ import annotations

from ringtrain.engine.deadlock import find
from ringtrain.engine.negotiation import decide
from ringtrain.engine.request import RequestMeta, TensorMeta
from ringtrain.errors import DeadlockError
from ringtrain.op_types import OpType, ReduceOp


def meta(name: str, rank: int, ranks=(0, 1), op=OpType.ALLREDUCE, waited=True) -> RequestMeta:
    tensors = () if op in (OpType.JOIN, OpType.BARRIER) else (TensorMeta((2,), "torch.float32",
                                                                         "cpu"),)
    return RequestMeta(name=name, op=op, rank=rank, set_ranks=ranks, tensors=tensors,
                       reduce_op=ReduceOp.SUM if op is OpType.ALLREDUCE else None, waited=waited)


def failed(metas_by_rank, blocked) -> dict[str, list[int]]:
    """Each failed name, with the ranks that submitted it."""
    responses = find(metas_by_rank, decide(metas_by_rank), blocked)
    for response in responses:
        assert response.failure is DeadlockError and response.error.startswith("deadlock: ")
    return {r.name: sorted(r.metas) for r in responses}


def test_two_ranks_each_waiting_for_what_the_other_never_submits_are_deadlocked():
    metas = [[meta("a", 0), meta("x", 0, waited=False)], [meta("b", 1)]]
    responses = find(metas, decide(metas), [0, 1])
    assert [r.name for r in responses] == ["a", "b"]  # what they wait for, not x
    message = responses[0].error
    assert all(r.error == message for r in responses)  # the same report on every rank
    assert "rank(s) [0, 1] wait for operations that can never complete" in message
    assert ("rank 0 waits for allreduce 'a' (not submitted by rank(s) [1]); its pending "
            "operations: allreduce 'a', allreduce 'x'") in message
    assert "rank 1 waits for allreduce 'b' (not submitted by rank(s) [0])" in message


def test_a_rank_that_is_not_blocked_may_still_submit_so_nobody_waiting_for_it_is_deadlocked():
    metas = [[meta("a", 0)], []]
    assert failed(metas, [0]) == {}
    # transitively: 0 waits for 1, 1 waits for 2, and 2 computes
    three = [[meta("a", 0, (0, 1))], [meta("b", 1, (1, 2))], []]
    assert failed(three, [0, 1]) == {}


def test_a_cycle_through_every_rank_is_deadlocked_and_one_through_some_of_them_too():
    world = (0, 1, 2)
    cycle = [[meta("a", 0, world)], [meta("b", 1, world)], [meta("c", 2, world)]]
    assert failed(cycle, [0, 1, 2]) == {"a": [0], "b": [1], "c": [2]}
    # ranks 0 and 1 diverge in their pair's set while rank 2 computes
    pair = [[meta("a", 0)], [meta("b", 1)], []]
    assert failed(pair, [0, 1]) == {"a": [0], "b": [1]}
    # 0 and 1 wait on world operations each missing on the other: rank 2 alone cannot help
    crossed = [[meta("a", 0, world)], [meta("b", 1, world)], []]
    assert failed(crossed, [0, 1]) == {"a": [0], "b": [1]}


def test_an_operation_that_runs_now_or_a_rank_not_known_blocked_means_no_deadlock():
    ready = [[meta("a", 0), meta("b", 0, waited=False)], [meta("b", 1), meta("a", 1, waited=False)]]
    assert failed(ready, [0, 1]) == {}
    mismatch = [[meta("a", 0)], [meta("a", 1, op=OpType.ALLGATHER)]]
    assert failed(mismatch, [0, 1]) == {}  # fails as a mismatch instead
    assert failed([[meta("a", 0)], [meta("b", 1)]], [0]) == {}  # rank 1 was not seen blocked


def test_a_live_submitter_of_a_deadlocked_operation_sees_it_fail_too():
    world = (0, 1, 2)
    metas = [[meta("a", 0, world)], [meta("b", 1, world)], [meta("a", 2, world, waited=False)]]
    # rank 2 computes, but "a" also needs rank 1, blocked on "b", which needs rank 0
    assert failed(metas, [0, 1]) == {"a": [0, 2], "b": [1]}


def test_join_waits_on_the_ranks_that_have_not_joined():
    join = [[meta("join", 0, (0, 1, 2), OpType.JOIN)], [meta("a", 1, (1, 2))],
            [meta("b", 2, (1, 2))]]
    assert failed(join, [0, 1, 2]) == {"a": [1], "b": [2], "join": [0]}
    responses = find(join, decide(join), [0, 1, 2])
    assert "rank 0 waits for join() (not submitted by rank(s) [1, 2])" in responses[0].error
    # a join waited on since the previous round only still fails with the ranks it waits for
    assert failed(join, [1, 2]) == {"a": [1], "b": [2], "join": [0]}
    unwaited = [[meta("join", 0, (0, 1, 2), OpType.JOIN, waited=False)], *join[1:]]
    assert failed(unwaited, [1, 2]) == {"a": [1], "b": [2]}  # nobody waits on that join
    # a joined rank stands in for an allreduce: it runs, nobody is deadlocked
    stand_in = [[meta("join", 0, op=OpType.JOIN)], [meta("a", 1)]]
    assert failed(stand_in, [0, 1]) == {}
    # every rank joined: the join completes
    done = [[meta("join", 0, op=OpType.JOIN)], [meta("join", 1, op=OpType.JOIN)]]
    assert failed(done, [0, 1]) == {}


def test_the_report_stays_short_with_many_ranks_and_operations():
    size = 64
    world = tuple(range(size))
    metas = [[meta(f"r{r}.op{i}", r, world, waited=i == 0) for i in range(20)]
             for r in range(size)]
    responses = find(metas, decide(metas), list(range(size)))
    assert len(responses) == size
    message = responses[0].error
    assert "and 48 more ranks" in message and "and 12 more" in message
    assert len(message) < 20_000
