"""Scheduling logic with synchronous ticks, a fake clock and a scripted executor: gang allocation,
priority and FIFO order, retries, wall-clock limits, termination, resizes and deletes."""

from __future__ import annotations

import pytest

from ringtrain.jobs.errors import ConflictError, InvalidRequestError, SpecError
from ringtrain.jobs.models import ClusterSpec, JobState, NodeState, parse_job_spec
from ringtrain.jobs.service.executors.base import Observation
from ringtrain.jobs.service.executors.local.backend import LocalBackend
from ringtrain.jobs.service.executors.phase import Phase
from ringtrain.jobs.service.job_service import JobService
from ringtrain.jobs.service.scheduler import Scheduler
from ringtrain.jobs.service.store import SQLiteStore
from tests.clock import FakeClock

from .conftest import FakeExecutor

pytestmark = pytest.mark.fast  # in-process: the tier of `scripts/test.sh --fast`


def state(store: SQLiteStore, job_id: str) -> str:
    return store.get_job(job_id).state.value


def test_job_runs_to_success(scheduler: Scheduler, store, fake_executor: FakeExecutor,
                             cluster, add_job) -> None:
    cluster("c", nodes=2)
    job = add_job("c", node_count=2)
    scheduler.tick()
    assert state(store, job.id) == "preparing" and fake_executor.started == [job.id]
    assert store.get_launch(job.id) == {"attempt": 0, "nodes": [0, 1]}
    fake_executor.phase[job.id] = Observation(Phase.RUNNING)
    scheduler.tick()
    assert state(store, job.id) == "running"
    assert store.get_cluster("c").node_counts.running == 2
    fake_executor.exit(job.id, 0)
    scheduler.tick()
    assert state(store, job.id) == "succeeded" and fake_executor.released == [job.id]
    assert store.get_cluster("c").node_counts.idle == 2


def test_gang_allocation_waits_for_all_nodes(scheduler, store, fake_executor, cluster,
                                             add_job) -> None:
    cluster("c", nodes=2)
    one = add_job("c", node_count=1)
    two = add_job("c", node_count=2)
    scheduler.tick()
    assert state(store, one.id) == "preparing"
    assert state(store, two.id) == "queued"
    assert "waiting for 2 idle nodes (1 idle now)" in store.get_job(two.id).message
    fake_executor.exit(one.id, 0)
    scheduler.tick()  # frees the node, then both nodes go to the 2-node job in the same tick
    assert state(store, two.id) == "preparing"
    assert sorted(store.get_job(two.id).nodes) == [0, 1]


def test_no_backfill_past_a_waiting_job(scheduler, store, fake_executor, cluster,
                                        add_job) -> None:
    cluster("c", nodes=2)
    running = add_job("c", node_count=1)
    scheduler.tick()
    big = add_job("c", node_count=2)
    small = add_job("c", node_count=1)
    scheduler.tick()
    # One node is idle and `small` would fit, but it must not overtake `big`.
    assert (state(store, big.id), state(store, small.id)) == ("queued", "queued")
    fake_executor.exit(running.id, 0)
    scheduler.tick()
    assert (state(store, big.id), state(store, small.id)) == ("preparing", "queued")


def test_priority_then_fifo(scheduler, store, fake_executor, cluster, add_job) -> None:
    cluster("c", nodes=1)
    blocker = add_job("c")
    scheduler.tick()
    low = add_job("c", priority="low")
    normal1 = add_job("c")
    high = add_job("c", priority="high")
    normal2 = add_job("c", priority="normal")
    order = []
    current = blocker.id
    for _ in range(4):
        fake_executor.exit(current, 0)
        scheduler.tick()
        current = next(j.id for j in store.list_jobs(states=[JobState.PREPARING]))
        order.append(current)
    assert order == [high.id, normal1.id, normal2.id, low.id]


def test_job_needing_more_nodes_than_the_cluster_says_so(scheduler, store, cluster,
                                                         add_job) -> None:
    cluster("c", nodes=1)
    job = add_job("c", node_count=3)
    scheduler.tick()
    assert state(store, job.id) == "queued"
    assert "needs 3 nodes but cluster c has 1; resize it" in store.get_job(job.id).message


def test_retries_requeue_then_fail(scheduler, store, fake_executor, cluster, add_job) -> None:
    cluster("c", nodes=1)
    job = add_job("c", max_retries=2)
    for attempt in range(3):
        scheduler.tick()
        assert state(store, job.id) == "preparing"
        assert store.get_job(job.id).attempt == attempt
        fake_executor.exit(job.id, 7, "rank 1 failed")
        scheduler.tick()
    got = store.get_job(job.id)
    assert (got.state, got.exit_code, got.attempt) == (JobState.FAILED, 7, 2)
    assert got.message == "rank 1 failed"
    assert fake_executor.started == [job.id] * 3


def test_retry_message_and_success_on_second_attempt(scheduler, store, fake_executor, cluster,
                                                     add_job) -> None:
    cluster("c", nodes=1)
    job = add_job("c", max_retries=1)
    scheduler.tick()
    fake_executor.exit(job.id, 1)
    scheduler._supervise(store.get_job(job.id), 0.0)  # settle without starting the retry yet
    got = store.get_job(job.id)
    assert got.state == JobState.QUEUED
    assert got.message == "attempt 1 failed (exited with code 1); re-queued, retry 1 of 1"
    scheduler.tick()
    got = store.get_job(job.id)  # the retry runs and still says why the first attempt failed
    assert (got.state, got.attempt) == (JobState.PREPARING, 1)
    assert got.message == "attempt 1 failed (exited with code 1); re-queued, retry 1 of 1"
    fake_executor.exit(job.id, 0)
    scheduler.tick()
    got = store.get_job(job.id)
    assert (got.state, got.message) == (JobState.SUCCEEDED, "")


def test_lost_processes_fail_the_job(scheduler, store, fake_executor, cluster, add_job) -> None:
    cluster("c", nodes=1)
    job = add_job("c")
    scheduler.tick()
    fake_executor.phase[job.id] = Observation(Phase.LOST, message="runner vanished")
    scheduler.tick()
    got = store.get_job(job.id)
    assert (got.state, got.message) == (JobState.FAILED, "runner vanished")


def test_unreadable_launch_handle_ends_the_attempt_with_the_reason(scheduler, store,
                                                                   fake_executor, cluster,
                                                                   add_job) -> None:
    cluster("c", nodes=2)
    job, stopped = add_job("c"), add_job("c")
    scheduler.tick()
    for j in (job, stopped):
        store.set_launch(j.id, {"pid": 1})
    scheduler.terminate(stopped.id)
    assert fake_executor.stops == [(stopped.id, False)]
    scheduler.tick()
    got = store.get_job(job.id)
    assert got.state == JobState.FAILED and got.message == "not a fake handle: {'pid': 1}"
    assert state(store, stopped.id) == "terminated"
    assert sorted(fake_executor.released) == sorted([job.id, stopped.id])


def test_wall_clock_limit(scheduler, store, fake_executor, clock: FakeClock, cluster,
                          add_job) -> None:
    cluster("c", nodes=1)
    job = add_job("c", max_wall_clock_time=60, max_retries=3)
    scheduler.tick()
    fake_executor.phase[job.id] = Observation(Phase.RUNNING)
    clock.advance(59)
    scheduler.tick()
    assert state(store, job.id) == "running" and fake_executor.stops == []
    clock.advance(2)
    scheduler.tick()
    got = store.get_job(job.id)
    assert got.state == JobState.TERMINATING and got.ends_as == JobState.FAILED
    assert fake_executor.stops == [(job.id, False)]
    fake_executor.exit(job.id, 143)
    scheduler.tick()
    got = store.get_job(job.id)
    assert got.state == JobState.FAILED  # not re-queued despite max_retries
    assert got.message == "exceeded max_wall_clock_time of 60 s; stopped"


def test_terminate_running_escalates_after_grace(scheduler, store, fake_executor,
                                                 clock: FakeClock, cluster, add_job) -> None:
    cluster("c", nodes=1)
    job = add_job("c")
    scheduler.tick()
    got = scheduler.terminate(job.id)
    assert got.state == JobState.TERMINATING and fake_executor.stops == [(job.id, False)]
    clock.advance(4)
    scheduler.tick()
    assert fake_executor.stops == [(job.id, False)]
    clock.advance(2)
    scheduler.tick()
    assert fake_executor.stops[-1] == (job.id, True)
    fake_executor.exit(job.id, -9)
    scheduler.tick()
    got = store.get_job(job.id)
    assert (got.state, got.message) == (JobState.TERMINATED, "terminated on request")
    with pytest.raises(ConflictError, match="already terminated"):
        scheduler.terminate(job.id)


def test_terminate_queued_job(scheduler, store, fake_executor, cluster, add_job) -> None:
    cluster("c", nodes=0)
    job = add_job("c")
    scheduler.tick()
    assert scheduler.terminate(job.id).state == JobState.TERMINATED
    assert fake_executor.started == []


def test_job_that_succeeds_during_terminate_counts_as_terminated(scheduler, store,
                                                                 fake_executor, cluster,
                                                                 add_job) -> None:
    cluster("c", nodes=1)
    job = add_job("c")
    scheduler.tick()
    scheduler.terminate(job.id)
    fake_executor.exit(job.id, 0)
    scheduler.tick()
    assert state(store, job.id) == "terminated"


def test_resize_while_busy(scheduler, store, fake_executor, cluster, add_job) -> None:
    cluster("c", nodes=2)
    job = add_job("c", node_count=2)
    scheduler.tick()
    info = store.resize_cluster("c", 1)
    assert info.allocation_state.value == "resizing" and info.node_counts.leaving == 1
    fake_executor.phase[job.id] = Observation(Phase.RUNNING)
    scheduler.tick()
    assert state(store, job.id) == "running"  # never killed by the shrink
    nxt = add_job("c")
    fake_executor.exit(job.id, 0)
    scheduler.tick()
    info = store.get_cluster("c")
    assert (info.current_nodes, info.allocation_state.value) == (1, "steady")
    assert state(store, nxt.id) == "preparing"


def test_never_started_attempt_is_lost(scheduler, store, cluster, add_job) -> None:
    # The server died between claiming nodes and storing the launch handle.
    cluster("c", nodes=1)
    job = add_job("c")
    store.update_job(job.id, JobState.PREPARING, 1.0, nodes=[0])
    scheduler.tick()
    assert state(store, job.id) == "failed"
    assert store.list_nodes("c")[0].state == NodeState.IDLE


def test_deleting_cluster_is_removed_once_its_jobs_end(scheduler, store, fake_executor,
                                                       cluster, add_job) -> None:
    cluster("c", nodes=1)
    job = add_job("c")
    scheduler.tick()
    store.mark_cluster_deleting("c")
    scheduler.tick()
    assert store.get_cluster("c").allocation_state.value == "deleting"
    fake_executor.exit(job.id, 0)
    scheduler.tick()
    assert [c.name for c in store.list_clusters()] == []
    assert state(store, job.id) == "succeeded"


def test_start_failure_fails_the_job(store, cluster, add_job, clock) -> None:
    class Broken(FakeExecutor):
        def start(self, job, nodes):
            raise OSError("no such interpreter")

    scheduler = Scheduler(store, Broken(), clock)
    cluster("c", nodes=1)
    job = add_job("c")
    scheduler.tick()
    got = store.get_job(job.id)
    assert got.state == JobState.FAILED and "no such interpreter" in got.message
    assert store.get_cluster("c").node_counts.idle == 1


def test_small_job_backfills_past_one_that_needs_a_resize(scheduler, store, fake_executor,
                                                          cluster, add_job) -> None:
    cluster("c", nodes=2)
    huge = add_job("c", node_count=3)
    small = add_job("c", node_count=1, priority="low")
    scheduler.tick()
    # `huge` cannot use any node before a resize, so it holds none back.
    assert (state(store, huge.id), state(store, small.id)) == ("queued", "preparing")
    assert "needs 3 nodes but cluster c has 2; resize it" in store.get_job(huge.id).message
    store.resize_cluster("c", 3)
    fake_executor.exit(small.id, 0)
    scheduler.tick()
    assert state(store, huge.id) == "preparing"


def test_backfill_only_on_nodes_the_waiting_job_will_not_need(scheduler, store, fake_executor,
                                                              cluster, add_job) -> None:
    cluster("c", nodes=4)
    running = add_job("c", node_count=2)  # no wall-clock limit: it may run for ever
    scheduler.tick()
    head = add_job("c", node_count=3)
    fits_aside = add_job("c", node_count=1)
    too_many = add_job("c", node_count=1)
    scheduler.tick()
    # Once `running` ends, `head` needs 3 of the 4 nodes: one node may be lent, not two.
    assert [state(store, j.id) for j in (head, fits_aside, too_many)] == [
        "queued", "preparing", "queued"]
    fake_executor.exit(running.id, 0)
    scheduler.tick()
    assert state(store, head.id) == "preparing"  # not delayed by the backfilled job
    assert state(store, too_many.id) == "queued"


def test_backfill_of_a_job_that_ends_before_the_waiting_one_can_start(
        scheduler, store, fake_executor, clock: FakeClock, cluster, add_job) -> None:
    cluster("c", nodes=2)
    running = add_job("c", node_count=1, max_wall_clock_time=100)
    scheduler.tick()
    head = add_job("c", node_count=2)
    too_long = add_job("c", node_count=1, max_wall_clock_time=100)
    short = add_job("c", node_count=1, max_wall_clock_time=50)
    clock.advance(10)
    scheduler.tick()
    # `running` is stopped by t+100 (+ the stop grace) at the latest; `short` ends before that.
    assert [state(store, j.id) for j in (head, too_long, short)] == [
        "queued", "queued", "preparing"]
    fake_executor.exit(running.id, 0)
    fake_executor.exit(short.id, 0)
    scheduler.tick()
    assert state(store, head.id) == "preparing"


def test_node_count_beyond_the_clusters_maximum_is_refused_at_submit(
        store, share, fake_executor, clock: FakeClock) -> None:
    service = JobService(store, share, [LocalBackend(fake_executor)], clock)
    service.create_cluster(ClusterSpec(name="c", nodes=1, max_nodes=2))
    with pytest.raises(SpecError) as refused:
        service.submit("c", parse_job_spec({"node_count": 3, "command": "true"}))
    assert refused.value.errors == [{"field": "node_count", "message": (
        "3 nodes, but cluster c can have at most 2 (max_nodes; it has 1 now)")}]
    assert service.list_jobs() == []
    assert service.submit("c", parse_job_spec({"node_count": 2, "command": "true"})).state in (
        JobState.STAGING, JobState.QUEUED)
    with pytest.raises(InvalidRequestError, match="at most 2 nodes"):
        service.resize_cluster("c", 3)
    assert service.resize_cluster("c", 2).target_nodes == 2


def test_a_one_process_job_runs_beside_a_job_on_every_node(scheduler, store, fake_executor,
                                                           cluster, add_job) -> None:
    # The README's cluster: 2 nodes x 2 slots; its main job takes 1 slot of each node.
    cluster("c", nodes=2, slots=2)
    main = add_job("c", node_count=2)
    scheduler.tick()
    small = add_job("c", node_count=1)
    replicas = add_job("c", node_count=1)
    scheduler.tick()
    assert [state(store, j.id) for j in (main, small, replicas)] == ["preparing"] * 3
    assert {n.index: n.jobs for n in store.list_nodes("c")} == {
        0: [main.id, small.id], 1: [main.id, replicas.id]}
    late = add_job("c", node_count=1)
    scheduler.tick()
    assert state(store, late.id) == "queued"
    assert "waiting for 1 node with 1 free slot each (0 have them now)" in (
        store.get_job(late.id).message)
    fake_executor.exit(small.id, 0)
    scheduler.tick()
    assert state(store, late.id) == "preparing" and store.get_job(late.id).nodes == [0]


def test_small_jobs_pack_onto_one_node_so_a_whole_node_stays_free(
        scheduler, store, fake_executor, cluster, add_job) -> None:
    cluster("c", nodes=2, slots=2)
    first, second = add_job("c"), add_job("c")
    scheduler.tick()
    assert store.get_job(first.id).nodes == store.get_job(second.id).nodes
    whole = add_job("c", process_count_per_node=2)
    scheduler.tick()
    assert state(store, whole.id) == "preparing"
    assert store.get_job(whole.id).nodes != store.get_job(first.id).nodes


def test_backfill_never_takes_the_slots_a_waiting_job_needs(scheduler, store, fake_executor,
                                                           cluster, add_job) -> None:
    cluster("c", nodes=2, slots=2)
    running = add_job("c", process_count_per_node=2)  # node 0, whole, for ever
    scheduler.tick()
    head = add_job("c", node_count=2, process_count_per_node=2)
    later = add_job("c")  # would fit on node 1, which `head` needs whole
    scheduler.tick()
    assert (state(store, head.id), state(store, later.id)) == ("queued", "queued")
    assert "waiting for 2 idle nodes (1 idle now)" in store.get_job(head.id).message
    fake_executor.exit(running.id, 0)
    scheduler.tick()
    assert (state(store, head.id), state(store, later.id)) == ("preparing", "queued")
