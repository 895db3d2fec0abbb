"""The thread world's backend: each collective's semantics, process sets, and failures that raise
naming the rank instead of hanging (the engine tests rely on all three)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from ringtrain.op_types import ReduceOp
from tests.engine.thread_world import RendezvousError, ThreadBackend, ThreadWorld

pytestmark = pytest.mark.timeout(20)


def on_every_rank(world: ThreadWorld, fn: Callable[[ThreadBackend], Any],
                  ranks: range | tuple[int, ...] | None = None,
                  within_s: float | None = None) -> list[Any]:
    """``fn(backend)`` on one thread per rank; each rank's result, or the exception it raised.
    Every thread must end within ``within_s`` (default: the world's timeout, and 5 s)."""
    ranks = range(world.size) if ranks is None else ranks
    results: dict[int, Any] = {}

    def call(rank: int) -> None:
        try:
            results[rank] = fn(world.backend(rank))
        except Exception as exc:
            results[rank] = exc

    threads = [threading.Thread(target=call, args=(rank,), daemon=True) for rank in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(world.timeout_s + 5 if within_s is None else within_s)
    assert not any(t.is_alive() for t in threads), "a rank is still inside a collective"
    return [results[rank] for rank in ranks]


@pytest.mark.parametrize("op, expected", [(ReduceOp.SUM, [6.0, 0.0]), (ReduceOp.MIN, [1.0, -3.0]),
                                          (ReduceOp.MAX, [3.0, 3.0]),
                                          (ReduceOp.PRODUCT, [6.0, -0.0])])
def test_allreduce_reduces_in_place_on_every_rank(op, expected):
    world = ThreadWorld(3)
    values = {0: [1.0, 0.0], 1: [2.0, -3.0], 2: [3.0, 3.0]}

    def allreduce(backend: ThreadBackend) -> list[float]:
        tensor = torch.tensor(values[backend.rank])
        backend.start_allreduce(tensor, op, (0, 1, 2))()
        return tensor.tolist()

    assert on_every_rank(world, allreduce) == [expected] * 3
    assert world.completed["allreduce"] == 1


def test_booleans_reduce_as_any_and_all():
    world = ThreadWorld(2)

    def reduce(backend: ThreadBackend) -> dict[str, list[bool]]:
        out = {}
        for op in (ReduceOp.SUM, ReduceOp.MIN):
            tensor = torch.tensor([True, backend.rank == 0])
            backend.start_allreduce(tensor, op, (0, 1))()
            out[op.value] = tensor.tolist()
        return out

    assert on_every_rank(world, reduce) == [{"Sum": [True, True], "Min": [True, False]}] * 2


def test_allreduces_started_together_complete_in_any_order_of_waits():
    world = ThreadWorld(2)

    def two_in_flight(backend: ThreadBackend) -> list[float]:
        first, second = torch.ones(1), torch.full((1,), 10.0)
        wait_first = backend.start_allreduce(first, ReduceOp.SUM, (0, 1))
        wait_second = backend.start_allreduce(second, ReduceOp.SUM, (0, 1))
        wait_second()
        wait_first()
        return [first.item(), second.item()]

    assert on_every_rank(world, two_in_flight) == [[2.0, 20.0]] * 2


def test_allgather_broadcast_alltoall_and_reducescatter():
    world = ThreadWorld(3)
    everyone = (0, 1, 2)

    def collectives(backend: ThreadBackend) -> dict[str, list]:
        r = backend.rank
        gathered = torch.empty(6)
        backend.allgather(gathered, torch.tensor([r, r + 0.5]), everyone)
        broadcast = torch.full((2,), float(r))
        backend.broadcast_(broadcast, 2, everyone)
        # rank r sends r + 1 rows to every rank, each row holding the sender's rank
        send = torch.full((3 * (r + 1),), float(r))
        received = torch.empty(6)
        backend.alltoall(received, send, [1, 2, 3], [r + 1] * 3, everyone)
        scattered = torch.empty(2)
        backend.reducescatter(scattered, torch.arange(6.0), ReduceOp.SUM, everyone)
        return {"allgather": gathered.tolist(), "broadcast": broadcast.tolist(),
                "alltoall": received.tolist(), "reducescatter": scattered.tolist()}

    for r, out in enumerate(on_every_rank(world, collectives)):
        assert out["allgather"] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
        assert out["broadcast"] == [2.0, 2.0]
        assert out["alltoall"] == [0.0, 1.0, 1.0, 2.0, 2.0, 2.0]
        assert out["reducescatter"] == [3.0 * (2 * r), 3.0 * (2 * r + 1)]


def test_control_channel_sums_and_gathers_copies():
    world = ThreadWorld(2)
    shared = {"list": [1]}

    def control(backend: ThreadBackend) -> tuple[list[int], list[Any]]:
        counts = torch.tensor([1, backend.rank], dtype=torch.int32)
        backend.control_allreduce(counts)
        gathered = backend.control_allgather(shared)
        gathered[0]["list"].append(backend.rank)  # a copy of this rank's own, as over a wire
        return counts.tolist(), gathered

    for counts, gathered in on_every_rank(world, control):
        assert counts == [2, 1]
        assert len(gathered) == 2 and gathered[1] == {"list": [1]}
    assert shared == {"list": [1]}


def test_a_process_set_runs_among_its_members_only():
    world = ThreadWorld(3)
    for rank in (0, 2):
        world.backend(rank).add_set((0, 2))

    def sum_over_the_set(backend: ThreadBackend) -> float:
        tensor = torch.tensor([float(backend.rank)])
        backend.start_allreduce(tensor, ReduceOp.SUM, (0, 2))()
        return tensor.item()

    assert on_every_rank(world, sum_over_the_set, ranks=(0, 2)) == [2.0, 2.0]
    with pytest.raises(RendezvousError, match=r"rank 1 has no process set \[0, 2\]"):
        sum_over_the_set(world.backend(1))


def test_a_rank_that_never_comes_is_named_after_the_timeout():
    world = ThreadWorld(3, timeout_s=0.2)
    errors = on_every_rank(world, lambda b: b.control_allreduce(torch.zeros(1, dtype=torch.int32)),
                           ranks=(0, 1))
    for rank, error in zip((0, 1), errors):
        assert isinstance(error, RendezvousError)
        assert f"rank {rank} waited 0.2 s in control_allreduce over ranks [0, 1, 2]" in str(error)
        assert "for rank(s) [2]" in str(error)


def test_a_failed_rank_fails_its_peers_collectives_at_once():
    world = ThreadWorld(2, timeout_s=3600.0)  # woken by the failure, or the test's bound ends it
    entered = threading.Event()

    def allreduce(backend: ThreadBackend) -> None:
        if backend.rank == 0:
            wait = backend.start_allreduce(torch.ones(1), ReduceOp.SUM, (0, 1))
            entered.set()
            wait()
        else:
            assert entered.wait(5)
            world.fail(1, "connection reset")
            backend.start_allreduce(torch.ones(1), ReduceOp.SUM, (0, 1))

    waiting, failed = on_every_rank(world, allreduce, within_s=10.0)
    assert "rank 1 failed (connection reset)" in str(waiting)
    assert str(failed) == "rank 1's backend failed: connection reset"


def test_ranks_calling_different_collectives_are_told_which():
    world = ThreadWorld(2)

    def disagree(backend: ThreadBackend) -> None:
        if backend.rank == 0:
            backend.control_allreduce(torch.zeros(1, dtype=torch.int32))
        else:
            backend.control_allgather("metas")

    for error in on_every_rank(world, disagree):
        assert isinstance(error, RendezvousError)
        assert "called different collectives over ranks [0, 1]" in str(error)
        assert "control_allreduce" in str(error) and "control_allgather" in str(error)


def test_average_and_adasum_are_not_wire_reductions():
    with pytest.raises(ValueError, match="Average"):
        ThreadWorld(1).backend(0).start_allreduce(torch.ones(1), ReduceOp.AVERAGE, (0,))
