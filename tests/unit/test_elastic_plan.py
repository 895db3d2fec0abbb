"""Elastic world planning (pure): who keeps a place, who starts, who leaves, and the slots."""

from __future__ import annotations

from ringtrain.contract.slots import SlotInfo
from ringtrain.runner.elastic_plan import FailedHosts, Worker, plan_world
from ringtrain.runner.hosts import HostInfo


def _ranks(plan) -> list[tuple[int, str, int, int]]:
    """(worker, host, rank, local rank) in rank order."""
    return sorted(((w, s.hostname, s.rank, s.local_rank) for w, s in plan.slots.items()),
                  key=lambda t: t[2])


def test_the_first_world_takes_every_slot_in_discovery_order():
    plan = plan_world([], [HostInfo("a", 2), HostInfo("b", 1)], max_np=None, next_id=0)
    assert [w.id for w in plan.new] == [0, 1, 2] and plan.removed == ()
    assert plan.slots[2] == SlotInfo(hostname="b", rank=2, local_rank=0, cross_rank=1, size=3,
                                     local_size=1, cross_size=2)
    assert _ranks(plan) == [(0, "a", 0, 0), (1, "a", 1, 1), (2, "b", 2, 0)]


def test_max_np_caps_the_world():
    plan = plan_world([], [HostInfo("a", 4)], max_np=3, next_id=0)
    assert plan.size == 3 and len(plan.new) == 3


def test_survivors_keep_their_order_so_rank_0_holds_the_state():
    # worker 1 (rank 1 on a) is gone; a new host c and a slot freed on a
    live = [Worker(0, "a"), Worker(2, "b"), Worker(3, "b")]
    hosts = [HostInfo("c", 1), HostInfo("a", 2), HostInfo("b", 2)]
    plan = plan_world(live, hosts, max_np=None, next_id=4)
    # hosts of survivors first (a, b), then the new host c; new workers after survivors
    assert _ranks(plan) == [(0, "a", 0, 0), (4, "a", 1, 1), (2, "b", 2, 0), (3, "b", 3, 1),
                            (5, "c", 4, 0)]
    assert [w.hostname for w in plan.new] == ["a", "c"] and plan.removed == ()
    assert plan.slots[3].cross_rank == 1 and plan.slots[3].cross_size == 2  # b's local rank 1


def test_a_host_with_fewer_slots_drops_its_newest_workers():
    live = [Worker(0, "a"), Worker(1, "a"), Worker(2, "a")]
    plan = plan_world(live, [HostInfo("a", 2)], max_np=None, next_id=3)
    assert plan.removed == (2,) and plan.new == ()
    assert _ranks(plan) == [(0, "a", 0, 0), (1, "a", 1, 1)]


def test_a_vanished_host_takes_its_workers_along_and_nothing_left_gives_an_empty_world():
    live = [Worker(0, "a"), Worker(1, "b")]
    plan = plan_world(live, [HostInfo("a", 1)], max_np=None, next_id=2)
    assert plan.removed == (1,) and list(plan.slots) == [0]
    assert plan_world(live, [], max_np=None, next_id=2).size == 0


def test_survivors_beyond_max_np_leave_and_no_worker_starts():
    live = [Worker(0, "a"), Worker(1, "a"), Worker(2, "b")]
    plan = plan_world(live, [HostInfo("a", 2), HostInfo("b", 2)], max_np=2, next_id=3)
    assert list(plan.slots) == [0, 1] and plan.removed == (2,) and plan.new == ()


def test_a_host_where_a_worker_failed_is_capped_until_discovery_reports_it_anew():
    failed = FailedHosts()
    reported = {"a": 3, "b": 1}
    failed.record_failure("a", survivors=2, reported=3)
    assert failed.usable(reported) == [HostInfo("a", 2), HostInfo("b", 1)]
    failed.forget_changed(reported)  # still reported as before: the cap holds
    assert failed.usable(reported) == [HostInfo("a", 2), HostInfo("b", 1)]
    failed.forget_changed({"a": 2, "b": 1})  # reported anew: the cap is lifted
    assert failed.usable({"a": 3, "b": 1}) == [HostInfo("a", 3), HostInfo("b", 1)]
    failed.record_failure("b", survivors=0, reported=1)
    failed.forget_changed({"a": 3})  # gone ...
    assert failed.usable({"a": 3, "b": 1}) == [HostInfo("a", 3), HostInfo("b", 1)]  # ... and back
