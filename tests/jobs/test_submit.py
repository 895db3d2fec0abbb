"""Submitting is idempotent: an idempotency key recorded with the job, retries that reuse it, and a
working dir copied after the request so that a slow copy never looks like a failure. A real
server on loopback and a real SQLite file."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringtrain.jobs.client.connection import connect, read_server_file
from ringtrain.jobs.client.jobs_client import JobsClient
from ringtrain.jobs.errors import ConflictError, SpecError
from ringtrain.jobs.home import Home
from ringtrain.jobs.models import ClusterSpec, JobInfo, JobState, parse_job_spec
from ringtrain.jobs.service.executors.local.backend import LocalBackend
from ringtrain.jobs.service.job_service import JobService
from ringtrain.jobs.service.store import SQLiteStore

from .conftest import FakeClock, FakeExecutor, returns_within, wait_for
from .test_e2e import api


@pytest.fixture
def client(home: Home) -> JobsClient:
    c = connect()
    c.create_cluster(ClusterSpec(name="c", nodes=1))
    return c


def test_a_repeated_key_returns_the_same_job(home: Home, client: JobsClient) -> None:
    body = {"cluster": "c", "spec": {"node_count": 1, "command": "true"}}
    with api(home) as http:
        first = http.post("/v1/jobs", json=body, headers={"Idempotency-Key": "k-1"})
        again = http.post("/v1/jobs", json=body, headers={"Idempotency-Key": "k-1"})
        assert first.status_code == again.status_code == 201
        assert first.json()["id"] == again.json()["id"]
        other = {"cluster": "c", "spec": {"node_count": 1, "command": "false"}}
        r = http.post("/v1/jobs", json=other, headers={"Idempotency-Key": "k-1"})
        assert r.status_code == 409
        assert "idempotency key 'k-1' was already used for job" in r.json()["detail"]
        for bad in ("", "x" * 200, "spaces are not allowed"):
            r = http.post("/v1/jobs", json=body, headers={"Idempotency-Key": bad})
            assert r.status_code == 422, bad
            assert r.json()["errors"][0]["field"] == "Idempotency-Key"
        # Without a key every submit is a new job.
        ids = {http.post("/v1/jobs", json=body).json()["id"] for _ in range(2)}
    assert len(ids) == 2
    assert len(client.list_jobs()) == 3
    with pytest.raises(ConflictError, match="already used"):
        client.submit("c", parse_job_spec({"node_count": 1, "command": "false"}),
                      idempotency_key="k-1")


def test_a_client_that_times_out_during_a_slow_copy_gets_one_job(home: Home, client: JobsClient,
                                                                  tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    for i in range(2000):  # about a second to copy here: longer than the client waits
        (project / f"f{i}.txt").write_text(f"file {i}\n")
    info = read_server_file(home)
    impatient = JobsClient(info.url, info.token, timeout_s=0.3)
    spec = parse_job_spec({"node_count": 1, "command": "ls | wc -l", "working_dir": str(project)})
    job = returns_within(60, impatient.submit, "c", spec)  # retried, never waiting out the copy
    assert job.state in (JobState.STAGING, JobState.QUEUED)
    done = wait_for(lambda: (j := client.get_job(job.id)).state.is_terminal() and j,
                    timeout_s=90)
    assert done.state == JobState.SUCCEEDED, done.message
    assert b"".join(client.logs(job.id)).strip() == b"2000"
    assert [j.id for j in client.list_jobs()] == [job.id]


def _service(tmp_path: Path) -> tuple[JobService, SQLiteStore]:
    from ringtrain.jobs.service.share import Share

    store = SQLiteStore(tmp_path / "jobs.sqlite")
    service = JobService(store, Share(tmp_path / "share"), [LocalBackend(FakeExecutor())],
                         FakeClock())
    service.create_cluster(ClusterSpec(name="c", nodes=1))
    return service, store


def test_staging_left_by_a_stopped_server_is_resumed(tmp_path: Path) -> None:
    service, store = _service(tmp_path)
    project = tmp_path / "project"
    project.mkdir()
    (project / "data.txt").write_text("data")
    spec = parse_job_spec({"node_count": 1, "command": "true", "working_dir": str(project)})
    job_dir = service.share.job_dir("left-1")
    (job_dir / "wd").mkdir(parents=True)  # half a copy
    store.add_job(JobInfo(id="left-1", cluster="c", spec=spec, state=JobState.STAGING,
                          created_at=0.0, job_dir=str(job_dir)))
    service.resume_staging()
    wait_for(lambda: store.get_job("left-1").state == JobState.QUEUED, timeout_s=30)
    assert (job_dir / "wd" / "data.txt").read_text() == "data"
    assert (job_dir / "launcher").is_dir()
    store.close()


def test_a_job_terminated_while_staging_stays_terminated(tmp_path: Path) -> None:
    service, store = _service(tmp_path)
    project = tmp_path / "project"
    project.mkdir()
    for i in range(500):
        (project / f"f{i}").write_text("x")
    spec = parse_job_spec({"node_count": 1, "command": "true", "working_dir": str(project)})
    job = service.submit("c", spec, idempotency_key="once")
    assert job.state == JobState.STAGING
    assert service.terminate(job.id).state == JobState.TERMINATED
    service.stager.join(timeout_s=30)
    got = store.get_job(job.id)
    assert got.state == JobState.TERMINATED and got.message == "terminated before it started"
    assert service.submit("c", spec, idempotency_key="once").id == job.id
    with pytest.raises(SpecError, match="working_dir"):
        service.submit("c", spec.model_copy(update={"working_dir": str(tmp_path / "nope")}))
    store.close()
