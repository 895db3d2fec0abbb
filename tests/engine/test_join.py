"""Joins, with N ranks as threads of this process: what a rank that has joined contributes to its
peers' collectives (Horovod 0.28.1's rules: zeros to allreduces), and which collectives cannot
run without it (every other kind). Every wait is bounded."""

from __future__ import annotations

import pytest
import torch

from ringtrain.engine.doorbell import NEGOTIATE
from ringtrain.engine.engine import Engine
from ringtrain.engine.handle import Handle
from ringtrain.errors import TensorMismatchError
from ringtrain.op_types import OpType, ReduceOp
from tests.clock import FakeClock
from tests.engine.calls import errors, join, results, step, submit

pytestmark = pytest.mark.timeout(20)


def join_the_rest(engines: list[Engine], joined: dict[int, Handle], clock: FakeClock) -> list:
    """Join every rank not in ``joined``, later by the clock; each rank's join result."""
    clock.advance(1.0)
    handles = {e.rank: joined.get(e.rank) or join(e) for e in engines}
    return results([handles[r] for r in sorted(handles)])


def test_join_returns_the_last_rank_to_join_and_averages_divide_by_every_member(
        start_engines, clock):
    _, engines = start_engines(3)
    steps: dict[int, list[Handle]] = {}
    for engine in engines:  # rank r has r + 1 batches; a joined rank adds zeros
        steps[engine.rank] = [submit(engine, f"step.{s}", torch.full((1,), engine.rank + 1.0),
                                     reduce_op=ReduceOp.AVERAGE) for s in range(engine.rank + 1)]
    joins = {rank: join(engines[rank]) for rank in (1, 0)}
    clock.advance(1.0)
    # Rank 2's last step ran with ranks 0 and 1 standing in: its join comes rounds after theirs.
    results(steps[2])
    joins[2] = join(engines[2])

    assert results([joins[r] for r in range(3)]) == [2, 2, 2]
    for _rank, handles in steps.items():
        for s, value in enumerate(results(handles)):
            # Horovod 0.28.1: Average is a sum scaled by 1 / (size of the process set)
            assert value == [pytest.approx(sum(r + 1.0 for r in range(3) if r >= s) / 3)]
    after = [submit(e, "after.join", torch.ones(1)) for e in engines]
    assert results(after) == [[3.0]] * 3


def test_a_grouped_allreduce_and_adasum_go_on_with_zeros_from_a_joined_rank(start_engines,
                                                                            clock):
    _, engines = start_engines(3)
    joined = {1: join(engines[1])}
    active = [engines[0], engines[2]]
    grouped = [submit(e, "grouped", [torch.full((2,), e.rank + 1.0), torch.ones(3)],
                      reduce_op=ReduceOp.AVERAGE) for e in active]
    adasum = [submit(e, "adasum", torch.tensor([1.0, 0.0]) if e.rank == 0
                     else torch.tensor([0.0, 2.0]), reduce_op=ReduceOp.ADASUM) for e in active]
    assert results(grouped) == [[pytest.approx([4 / 3] * 2), pytest.approx([2 / 3] * 3)]] * 2
    assert results(adasum) == [[1.0, 2.0]] * 2  # orthogonal tensors add; zeros add nothing
    assert join_the_rest(engines, joined, clock) == [2, 2, 2]


def test_an_allgather_with_a_joined_member_fails_on_every_rank_that_submitted_it(
        start_engines, clock):
    # Horovod 0.28.1's test_horovod_join_allgather requires the error.
    _, engines = start_engines(3)
    joined = {1: join(engines[1])}
    active = [engines[0], engines[2]]
    for name, tensors in [("gather", lambda e: torch.full((e.rank + 1, 2), float(e.rank))),
                          ("gather.grouped", lambda e: [torch.full((1,), float(e.rank)),
                                                       torch.full((e.rank, 1), 5.0)])]:
        failed = errors([submit(e, name, tensors(e), op=OpType.ALLGATHER) for e in active])
        for error in failed:
            assert isinstance(error, TensorMismatchError)
            assert (f"allgather {name!r} cannot run: rank(s) [1] have already called join(), "
                    "and allgather needs every member (only allreduce goes on with joined "
                    "ranks, as in Horovod). If this is a sparse gradient of "
                    "DistributedOptimizer, pass sparse_as_dense=True") in str(error)
    assert results([submit(e, "after", torch.ones(1)) for e in active]) == [[2.0]] * 2
    assert join_the_rest(engines, joined, clock) == [2, 2, 2]


@pytest.mark.parametrize("root", [1, 0], ids=["joined-root", "joined-member"])
def test_a_broadcast_with_a_joined_member_fails_on_every_rank_that_submitted_it(
        start_engines, clock, root):
    _, engines = start_engines(3)
    joined = {1: join(engines[1])}
    active = [engines[0], engines[2]]
    failed = errors([submit(e, "bcast", torch.ones(2), op=OpType.BROADCAST, root_rank=root)
                     for e in active])
    the_root = " (the root)" if root == 1 else ""
    for error in failed:
        assert isinstance(error, TensorMismatchError)
        assert (f"broadcast 'bcast' cannot run: rank(s) [1]{the_root} have already called "
                "join(), and broadcast needs every member") in str(error)
    assert results([submit(e, "after", torch.ones(1)) for e in active]) == [[2.0]] * 2
    assert join_the_rest(engines, joined, clock) == [2, 2, 2]


def test_alltoall_reducescatter_and_barrier_with_a_joined_member_fail_and_the_job_goes_on(
        start_engines, clock):
    _, engines = start_engines(2)
    joined = {0: join(engines[0])}
    rank1 = engines[1]
    for name, op, kwargs in [("a2a", OpType.ALLTOALL, {"splits": (1, 1)}),
                             ("rs", OpType.REDUCESCATTER, {"reduce_op": ReduceOp.SUM}),
                             ("barrier", OpType.BARRIER, {})]:
        tensor = None if op is OpType.BARRIER else torch.ones(2)
        (error,) = errors([submit(rank1, name, tensor, op=op, **kwargs)])
        assert f"{op.value} {name!r} cannot run: rank(s) [0] have already called join()" \
            in str(error)
    assert join_the_rest(engines, joined, clock) == [1, 1]


def test_a_process_set_with_a_joined_member_goes_on_among_the_others(start_engines, clock):
    world, engines = start_engines(3)
    pair = (0, 1)
    for engine in engines:
        world.backend(engine.rank).add_set(pair)
    joined = {1: join(engines[1])}
    reduced = submit(engines[0], "pair.avg", torch.full((2,), 4.0), reduce_op=ReduceOp.AVERAGE,
                     ranks=pair)
    gathered = submit(engines[0], "pair.gather", torch.ones(1, 2), op=OpType.ALLGATHER,
                      ranks=pair)
    assert results([reduced]) == [[2.0, 2.0]]
    assert "have already called join()" in str(errors([gathered])[0])
    assert join_the_rest(engines, joined, clock) == [2, 2, 2]


def test_units_go_on_while_a_peer_has_joined_and_run_alone_again_after(start_engines, clock):
    world, engines = start_engines(2)
    bucket = ("unit.a", "unit.b")
    step(engines, bucket, lambda r: 1.0)
    joined = join(engines[1])
    # rank 1 stands in for this one, so rank 0's engine has seen the join when it completes
    assert results([submit(engines[0], "sync", torch.ones(1))]) == [[1.0]]

    # rank 1 counts nothing while joined: the unit's counter cannot complete, and it must not
    # wait for it
    assert step(engines[:1], bucket, lambda r: 5.0) == [[5.0, 5.0]] * 2
    assert join_the_rest(engines, {1: joined}, clock) == [0, 0]

    assert step(engines, bucket, lambda r: r + 1.0) == [[3.0, 3.0]] * 4
    assert step(engines, bucket, lambda r: r + 2.0) == [[5.0, 5.0]] * 4
    # the exchange that ran the unit without rank 1 renewed its counters: after at most a
    # negotiation that still saw the join, the unit has rounds of its own again
    assert world.doorbell.bells()[-1] != NEGOTIATE


def test_a_lone_cached_operation_goes_on_with_zeros_while_a_peer_has_joined(start_engines,
                                                                            clock):
    world, engines = start_engines(2)
    avg = ReduceOp.AVERAGE
    assert results([submit(e, "lone", torch.ones(2), reduce_op=avg) for e in engines]) \
        == [[1.0, 1.0]] * 2
    joined = join(engines[1])
    # counted on rank 0 alone, it cannot complete its counter: the join's negotiation runs it,
    # and the next one, submitted once rank 0 knows of the join, rings for a negotiation itself
    for _ in range(2):
        assert results([submit(engines[0], "lone", torch.full((2,), 4.0), reduce_op=avg)]) \
            == [[2.0, 2.0]]
    assert join_the_rest(engines, {1: joined}, clock) == [0, 0]

    for _ in range(2):
        handles = [submit(e, "lone", torch.full((2,), e.rank + 1.0), reduce_op=avg)
                   for e in engines]
        assert results(handles) == [[1.5, 1.5]] * 2
    assert world.doorbell.bells()[-1] != NEGOTIATE  # counted alone again once all are back
