"""What feeds the dashboard live: the store's change log, the event stream of a real server
(snapshot first, then the jobs that changed and those removed), and the figures read from a
model server's own metrics."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import generate_latest

from ringtrain.jobs.client.connection import connect, read_server_file
from ringtrain.jobs.errors import InvalidTransitionError
from ringtrain.jobs.home import Home
from ringtrain.jobs.models import ClusterSpec, JobInfo, JobState, parse_job_spec
from ringtrain.jobs.service.monitor.replica_metrics import ReplicaScraper
from ringtrain.jobs.service.store import SQLiteStore
from ringtrain.serve.metrics import ServeMetrics

from .conftest import bearer, wait_for


def test_the_change_log_names_jobs_written_since_a_revision(store: SQLiteStore,
                                                              tmp_path: Path) -> None:
    store.add_cluster(ClusterSpec(name="c", nodes=1), 0.0)
    start = store.revision()
    spec = parse_job_spec({"node_count": 1, "command": "true"})
    for job_id in ("a-1", "b-1"):
        store.add_job(JobInfo(id=job_id, cluster="c", spec=spec, state=JobState.QUEUED,
                              created_at=1.0, job_dir=str(tmp_path / job_id)))
    assert store.changes_since(start) == (start + 2, ["a-1", "b-1"])
    store.update_job("a-1", JobState.PREPARING, 2.0, nodes=[0])
    assert store.changes_since(start + 2) == (start + 3, ["a-1"])
    assert store.changes_since(start) == (start + 3, ["b-1", "a-1"])  # by latest change
    with pytest.raises(InvalidTransitionError):  # rolled back: no change recorded
        store.update_job("b-1", JobState.SUCCEEDED, 3.0)
    assert store.revision() == start + 3
    store.update_job("b-1", JobState.TERMINATED, 3.0)
    store.remove_job("b-1")
    assert store.changes_since(start + 3) == (start + 5, ["b-1"])


def _events(lines: Iterator[str]) -> Iterator[tuple[str, dict]]:
    name = None
    for line in lines:
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: ") and name is not None:
            yield name, json.loads(line[6:])
            name = None


def _first_snapshot(http: httpx.Client) -> dict:
    with http.stream("GET", "/v1/events") as stream:
        name, data = next(_events(stream.iter_lines()))
    assert name == "snapshot"
    return data


def test_the_event_stream_sends_a_snapshot_then_changes(home: Home, tmp_path: Path) -> None:
    client = connect(home=home)
    client.create_cluster(ClusterSpec(name="c", nodes=1))
    info = read_server_file(home)
    with httpx.Client(base_url=info.url, headers=bearer(home), timeout=30) as http, \
            http.stream("GET", "/v1/events") as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        events = _events(stream.iter_lines())
        name, snapshot = next(events)
        assert name == "snapshot" and snapshot["jobs"] == []
        assert [n["state"] for n in snapshot["clusters"][0]["nodes"]] == ["idle"]
        assert snapshot["host"]["cpus"] >= 1 and snapshot["host"]["memory_total"] > 0
        job = client.submit("c", parse_job_spec({"name": "ev", "node_count": 1,
                                                 "command": f"{sys.executable} -c pass"}))
        seen = []
        for name, data in events:
            if name == "changes":
                seen += [(j["id"], j["state"]) for j in data["jobs"]]
                if (job.id, "succeeded") in seen:
                    break
        states = [s for i, s in seen if i == job.id]
        assert states[-1] == "succeeded" and len(states) == len(set(states))
        assert _first_snapshot(http)["jobs"][0]["state"] == "succeeded"  # a later dashboard
        client.delete_job(job.id)
        for name, data in events:
            if name == "changes" and data["removed"]:
                assert data["removed"] == [job.id]
                break
        assert _first_snapshot(http)["jobs"] == []
    client.close()


def test_replica_figures_come_from_a_model_servers_metrics() -> None:
    metrics = ServeMetrics(lambda: 0.0)
    exposition = {"text": ""}

    def serve(requests: int, seconds: float, code: str = "200") -> None:
        for _ in range(requests):
            metrics.requests.labels("/v2/models/m/infer", code).inc()
            metrics.latency.labels("/v2/models/m/infer").observe(seconds)
        exposition["text"] = generate_latest(metrics.registry).decode()

    scraper = ReplicaScraper(get=lambda url: exposition["text"])
    serve(100, 0.003)
    metrics.observe_batch(4, 0.01)
    metrics.observe_batch(8, 0.01)
    serve(0, 0.0)
    first = scraper.scrape("http://127.0.0.1:1")
    assert first["rate"] is None and first["errors"] == 0 and first["mean_batch"] == 6.0
    assert 0.0025 <= first["p50"] <= 0.005 and first["p99"] <= 0.005
    serve(10, 0.2)  # the next interval: slow requests only, two of them failing
    serve(2, 0.2, "500")
    second = scraper.scrape("http://127.0.0.1:1")
    assert second["rate"] > 0 and second["errors"] == 2 and second["mean_batch"] is None
    assert 0.1 <= second["p50"] <= 0.25  # the interval's, not the life's (mostly 3 ms)
    assert "error" in ReplicaScraper(get=lambda url: 1 / 0).scrape("http://x")


def test_job_usage_counts_a_runners_whole_process_tree() -> None:
    import subprocess

    from ringtrain.jobs.service.monitor.job_usage import JobUsageSampler

    # A "runner" leading its own session, with a child that burns CPU and one that sleeps.
    script = ("import subprocess, sys, time\n"
              "a = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
              "b = subprocess.Popen(['sleep', '60'])\n"
              "time.sleep(60)\n")
    runner = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        sampler = JobUsageSampler(max_age_s=0.0)

        def three() -> dict | None:
            got = sampler.sample({"j-1": runner.pid})["j-1"]
            return got if got["processes"] == 3 else None

        first = wait_for(three, timeout_s=30)
        assert first["memory"] > 1 << 20

        def busy() -> dict | None:  # a later sample has a CPU share: the busy child's
            got = sampler.sample({"j-1": runner.pid})["j-1"]
            return got if (got["cpu_percent"] or 0.0) > 10.0 else None

        second = wait_for(busy, timeout_s=30, every_s=0.2)
        assert second["processes"] == 3
        assert sampler.sample({"gone-1": 2 ** 22 + 7})["gone-1"]["processes"] == 0
    finally:
        os.killpg(runner.pid, signal.SIGKILL)
        runner.wait(timeout=30)


def test_dashboard_command_prints_the_url_with_the_token(home: Home, cli) -> None:
    rc, out, _ = cli("dashboard")
    info = read_server_file(home)
    assert rc == 0 and out.strip() == f"{info.url}/dashboard?token={info.token}"
    rc, out, _ = cli("dashboard", "-o", "json")
    assert rc == 0 and json.loads(out) == {"url": f"{info.url}/dashboard?token={info.token}"}
    with httpx.Client(timeout=10) as http:  # the URL signs a browser in
        assert http.get(json.loads(out)["url"], follow_redirects=True).status_code == 200
