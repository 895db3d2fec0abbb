"""Elastic jobs in the scheduler, with synchronous ticks and a scripted executor: a lost node is
given back and named, a job below min_nodes fails, idle nodes are offered up to max_nodes while
no job waits for them; specs are validated and refused on Ray clusters."""

from __future__ import annotations

import pytest

from ringtrain.jobs.errors import SpecError
from ringtrain.jobs.models import ClusterSpec, JobState, parse_job_spec
from ringtrain.jobs.service.executors.base import NodeLoss, Observation
from ringtrain.jobs.service.executors.local.backend import LocalBackend
from ringtrain.jobs.service.executors.phase import Phase
from ringtrain.jobs.service.executors.ray.backend import RayBackend
from ringtrain.jobs.service.executors.ray.connection import RayConnection
from ringtrain.jobs.service.job_service import JobService
from tests.clock import FakeClock

from .conftest import FakeExecutor

KILLED = "worker 1 on node1.localhost was killed by signal SIGKILL"


def _running(scheduler, store, fake_executor: FakeExecutor, job_id: str,
             world: tuple[int, ...]) -> None:
    scheduler.tick()
    fake_executor.phase[job_id] = Observation(Phase.RUNNING, world=world)
    scheduler.tick()
    assert store.get_job(job_id).state is JobState.RUNNING


def test_a_lost_node_is_given_back_and_named_while_the_job_runs_on(
        scheduler, store, fake_executor: FakeExecutor, cluster, add_job) -> None:
    cluster("c", nodes=3)
    job = add_job("c", node_count=3, min_nodes=2)
    _running(scheduler, store, fake_executor, job.id, (0, 1, 2))
    fake_executor.phase[job.id] = Observation(Phase.RUNNING, world=(0, 2),
                                              lost=(NodeLoss(1, KILLED),))
    scheduler.tick()
    seen = store.get_job(job.id)
    assert (seen.state, seen.nodes) == (JobState.RUNNING, [0, 2])
    assert seen.message == f"elastic: running on nodes 0, 2; lost node 1 ({KILLED})"
    assert fake_executor.offered == [(job.id, [0, 2])]
    # The node is idle again, but not offered back to the attempt that lost it.
    assert store.get_cluster("c").node_counts.idle == 1
    scheduler.tick()
    assert fake_executor.offered == [(job.id, [0, 2])]
    fake_executor.phase[job.id] = Observation(Phase.EXITED, 0, world=(0, 2),
                                              lost=(NodeLoss(1, KILLED),))
    scheduler.tick()
    seen = store.get_job(job.id)
    assert (seen.state, seen.message) == (JobState.SUCCEEDED, f"lost node 1 ({KILLED})")


def test_a_job_left_with_fewer_than_min_nodes_fails(scheduler, store, fake_executor, cluster,
                                                    add_job) -> None:
    cluster("c", nodes=2)
    job = add_job("c", node_count=2, min_nodes=2)
    _running(scheduler, store, fake_executor, job.id, (0, 1))
    fake_executor.phase[job.id] = Observation(Phase.RUNNING, world=(0,),
                                              lost=(NodeLoss(1, KILLED),))
    scheduler.tick()
    seen = store.get_job(job.id)
    assert seen.state is JobState.TERMINATING and fake_executor.stops == [(job.id, False)]
    message = f"lost node 1 ({KILLED}); 1 node(s) left, fewer than min_nodes (2); stopped"
    assert seen.message == message
    fake_executor.exit(job.id, 1)
    scheduler.tick()
    seen = store.get_job(job.id)
    assert (seen.state, seen.message) == (JobState.FAILED, message)


def test_idle_nodes_are_offered_up_to_max_nodes_unless_a_job_waits(
        scheduler, store, fake_executor, cluster, add_job) -> None:
    cluster("c", nodes=2)
    job = add_job("c", node_count=1, max_nodes=3)
    waiting = add_job("c", node_count=2)  # queued behind it, needs the idle node and one more
    _running(scheduler, store, fake_executor, job.id, (0,))
    assert store.get_job(job.id).nodes == [0] and fake_executor.offered == []
    store.update_job(waiting.id, JobState.TERMINATED, 0.0)
    store.resize_cluster("c", 4)
    scheduler.tick()
    seen = store.get_job(job.id)
    assert seen.nodes == [0, 1, 2] and fake_executor.offered == [(job.id, [0, 1, 2])]
    assert seen.message == "elastic: running on nodes 0; nodes 1, 2 join at the next commit"
    assert store.get_cluster("c").node_counts.running == 3
    fake_executor.phase[job.id] = Observation(Phase.RUNNING, world=(0, 1, 2))
    scheduler.tick()
    assert store.get_job(job.id).message == "elastic: running on nodes 0, 1, 2"
    assert store.get_cluster("c").node_counts.idle == 1  # max_nodes reached


@pytest.mark.parametrize(("fields", "error"), [
    ({"min_nodes": 4}, ("min_nodes", "must be at most node_count (3): the job starts on "
                                     "node_count nodes and may shrink down to min_nodes (got 4)")),
    ({"max_nodes": 2}, ("max_nodes", "must be at least node_count (3): the job starts on "
                                     "node_count nodes and may grow up to max_nodes (got 2)")),
    ({"min_nodes": 0}, ("min_nodes", "Input should be greater than or equal to 1 (got 0)")),
])
def test_min_and_max_nodes_must_bracket_node_count(fields, error) -> None:
    with pytest.raises(SpecError) as refused:
        parse_job_spec({"node_count": 3, "command": "true", **fields})
    assert [(e["field"], e["message"]) for e in refused.value.errors] == [error]


def test_the_node_range_defaults_to_node_count() -> None:
    fixed = parse_job_spec({"node_count": 3, "command": "true"})
    assert (fixed.elastic, fixed.node_range) == (False, (3, 3))
    shrinks = parse_job_spec({"node_count": 3, "min_nodes": 1, "command": "true"})
    assert (shrinks.elastic, shrinks.node_range) == (True, (1, 3))


def test_ray_clusters_take_elastic_specs(store, share, fake_executor, clock: FakeClock) -> None:
    store.add_cluster(ClusterSpec(name="r", nodes=2, backend="ray", address="127.0.0.1:6379"),
                      clock())
    ray = RayBackend(fake_executor, RayConnection(), share.root / "ray")
    service = JobService(store, share, [LocalBackend(fake_executor), ray], clock)
    job = service.submit("r", parse_job_spec({"node_count": 2, "min_nodes": 1, "command": "x"}))
    assert job.spec.node_range == (1, 2)
