"""The service asks a cluster's backend, never tests which one it is: a backend the service does
not run is refused, a Ray cluster's jobs get Ray's rules, and a job's logs follow the backend
that ran it, by the tag on its stored handle once its cluster is gone. In-process: a real SQLite
file, the fake executor behind both backends (no Ray needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringtrain.jobs.errors import InvalidRequestError
from ringtrain.jobs.executors.backend import LocalBackend
from ringtrain.jobs.executors.ray.backend import RayBackend
from ringtrain.jobs.executors.ray.connection import RayConnection
from ringtrain.jobs.executors.routing import Backends
from ringtrain.jobs.models import Backend, ClusterSpec, JobState, parse_job_spec
from ringtrain.jobs.service import JobService
from ringtrain.jobs.share import Share
from ringtrain.jobs.store import SQLiteStore

from .conftest import FakeClock, FakeExecutor

pytestmark = pytest.mark.fast  # in-process: the tier of `scripts/test.sh --fast`

#: A Ray address where nothing answers: describing the cluster fails fast and is only logged.
NOWHERE = "127.0.0.1:1"


def _ray_service(store: SQLiteStore, share: Share, executor: FakeExecutor,
                 clock: FakeClock, tmp_path: Path) -> JobService:
    ray = RayBackend(executor, RayConnection(), tmp_path / "ray")
    return JobService(store, share, [LocalBackend(executor), ray], clock)


def test_a_backend_the_service_does_not_run_is_refused_before_anything_is_recorded(
        store: SQLiteStore, share: Share, fake_executor: FakeExecutor, clock: FakeClock) -> None:
    service = JobService(store, share, [LocalBackend(fake_executor)], clock)
    with pytest.raises(InvalidRequestError, match="this service runs no ray backend"):
        service.create_cluster(ClusterSpec(name="r", nodes=1, backend="ray", address=NOWHERE))
    assert store.list_clusters() == []
    # A Ray cluster recorded by a service that ran Ray: its jobs are refused at submit.
    store.add_cluster(ClusterSpec(name="r", nodes=1, backend="ray", address=NOWHERE), clock())
    with pytest.raises(InvalidRequestError, match="this service runs no ray backend"):
        service.submit("r", parse_job_spec({"node_count": 1, "command": "true"}))
    assert store.list_jobs() == []
    assert service.get_cluster("r").ray_nodes == []  # the record stands, undescribed


def test_two_backends_of_one_kind_are_refused(fake_executor: FakeExecutor) -> None:
    with pytest.raises(ValueError, match="two local backends"):
        Backends([LocalBackend(fake_executor), LocalBackend(fake_executor)],
                 lambda name: Backend.LOCAL)


def test_a_ray_cluster_keeps_its_machines_and_runs_elastic_jobs_too(
        store: SQLiteStore, share: Share, fake_executor: FakeExecutor, clock: FakeClock,
        tmp_path: Path) -> None:
    service = _ray_service(store, share, fake_executor, clock, tmp_path)
    store.add_cluster(ClusterSpec(name="r", nodes=2, backend="ray", address=NOWHERE), clock())
    service.create_cluster(ClusterSpec(name="l", nodes=2))
    with pytest.raises(InvalidRequestError, match="cluster r is a Ray cluster: its machines are "
                                                  "Ray's to add or remove"):
        service.resize_cluster("r", nodes=3)
    assert service.resize_cluster("r", slots=2).slots == 2  # the CPUs a job may use: ours
    assert service.resize_cluster("l", nodes=3).target_nodes == 3
    elastic = parse_job_spec({"node_count": 2, "min_nodes": 1, "command": "true"})
    # Every node runs `ringtrain run` in its per-node mode: what a local cluster runs, Ray does.
    for cluster in ("r", "l"):
        assert service.submit(cluster, elastic).state in (JobState.STAGING, JobState.QUEUED)


def test_a_jobs_handle_keeps_its_backend_after_its_cluster_is_gone(
        store: SQLiteStore, share: Share, fake_executor: FakeExecutor, clock: FakeClock,
        tmp_path: Path) -> None:
    service = _ray_service(store, share, fake_executor, clock, tmp_path)
    store.add_cluster(ClusterSpec(name="r", nodes=1, backend="ray", address=NOWHERE), clock())
    service.create_cluster(ClusterSpec(name="l", nodes=1))
    spec = parse_job_spec({"node_count": 1, "command": "true"})
    on_ray, on_local = service.submit("r", spec), service.submit("l", spec)
    # Every backend's nodes write the interleaved copy of a rank's streams.
    for job in (on_ray, on_local):
        assert service.log_path(job.id, 0, "output") == "stdouterr/rank.0/output"
    assert service.log_path(on_ray.id, 0, "prep.stderr") == "prep/node.0.stderr"
    service.tick()  # both start; their handles are stored with their backend's tag
    assert store.get_launch(on_ray.id)["backend"] == "ray"
    assert store.get_launch(on_local.id)["backend"] == "local"
    for job in (on_ray, on_local):
        fake_executor.exit(job.id, 0)
    service.tick()
    assert store.get_job(on_ray.id).state == JobState.SUCCEEDED
    service.delete_cluster("r")
    service.tick()
    assert [c.name for c in store.list_clusters()] == ["l"]
    # A job that ran before nodes wrote the interleaved copy: its stdout stands in.
    stdout = share.job_dir(on_ray.id) / "stdouterr" / "rank.0" / "stdout"
    stdout.parent.mkdir(parents=True, exist_ok=True)
    stdout.write_text("trained\n")
    assert service.log_path(on_ray.id, 0, "output") == "stdouterr/rank.0/stdout"
    assert service.log_path(on_local.id, 0, "output") == "stdouterr/rank.0/output"
