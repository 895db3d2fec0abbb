"""A replica killed under load: what the clients of a deployment's front see (issue 35).

Runs a job service in a temporary RINGTRAIN_HOME with a 2-node local cluster, a job that saves
a tiny classifier, and a deployment of 2 replicas of it. Closed-loop clients (each posts its next
inference when the last is answered) drive the front twice for ``--duration`` seconds: once with
nothing happening (the baseline), once with ``kill -9`` of replica 1's server after
``--kill-after`` seconds. Prints one JSON line:

- ``sent``, ``failed``: requests and those not answered 200, in the run with the kill;
- ``retried_by_front``: requests the front found its replica down for (in flight on the killed
  replica, or sent to it before it was taken out) and sent to the other; a failure among them
  would be a request lost in flight, so ``failed_in_flight`` is ``failed`` (no other failure
  is expected);
- ``kill_to_serving_s``: from the kill to the killed replica's own URL answering ready again
  (its keeper's backoff, then a new ``ringtrain serve`` loading the model);
- ``kill_to_ready_s``: from the kill to the deployment reading ``ready``, 2 of 2 healthy;
- ``baseline`` and ``with_kill``: throughput and p50/p99 latency of each run, and
  ``p99_ratio`` (with the kill over baseline), besides the baseline's ``failed`` (0);
- ``load_1m``: the host's load average while it ran (the figures depend on it).

    python benchmarks/replica_failover.py [--clients 4] [--duration 30] [--kill-after 5]

Goals (issue 35): no request fails; the replica serves again within 10 s.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' model and helpers
from ringtrain.jobs.client.connection import connect
from ringtrain.jobs.client.jobs_client import JobsClient
from ringtrain.jobs.home import Home
from ringtrain.jobs.models.deployment import DeploymentInfo
from tests.jobs.test_deploy import INPUT, trained_job  # noqa: E402
from tests.jobs.test_deploy_front import _server_pid  # noqa: E402

RETRY_LINE = "failed a request"  # what the front logs for each request it sends elsewhere


def _wait(what: str, predicate: Callable[[], Any], timeout_s: float,
          every_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(every_s)
    raise TimeoutError(f"{what}: not within {timeout_s:g} s")


@contextmanager
def deployment(root: Path) -> Iterator[tuple[Home, JobsClient, DeploymentInfo]]:
    """A service under ``root`` and a ready deployment of 2 replicas: (home, client, info)."""
    with trained_job(root, nodes=2) as (home, job_id):
        client = connect(home=home)
        try:
            info = client.deploy(job_id, replicas=2)
            _wait("the deployment",
                  lambda: client.get_deployment(info.id).state.value == "ready", 300)
            yield home, client, client.get_deployment(info.id)
        finally:
            client.close()


def drive(url: str, clients: int, duration_s: float,
          during: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
    """``clients`` closed-loop clients posting to ``url`` for ``duration_s``; ``during()``
    runs meanwhile in this thread. Their throughput, latency and failures."""
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def post() -> None:
        with httpx.Client(timeout=60) as http:
            while not stop.is_set():
                t = time.perf_counter()
                try:
                    r = http.post(f"{url}/v2/models/model/infer", json=INPUT)
                    failure = None if r.status_code == 200 else f"{r.status_code} {r.text[:200]}"
                except httpx.HTTPError as e:
                    failure = repr(e)
                with lock:
                    latencies.append(time.perf_counter() - t)
                    if failure is not None:
                        failures.append(failure)

    threads = [threading.Thread(target=post, daemon=True) for _ in range(clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    extra = during() if during is not None else {}
    time.sleep(max(0.0, start + duration_s - time.monotonic()))
    stop.set()
    for t in threads:
        t.join(90)
    cuts = statistics.quantiles(latencies, n=100)
    return {"sent": len(latencies), "failed": len(failures), "failures": failures[:5],
            "per_s": round(len(latencies) / (time.monotonic() - start), 1),
            "p50_ms": round(cuts[49] * 1000, 1), "p99_ms": round(cuts[98] * 1000, 1), **extra}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--duration", type=float, default=30.0, help="seconds of each run")
    p.add_argument("--kill-after", type=float, default=5.0,
                   help="seconds into the second run when replica 1's server is killed")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="replica-failover-") as tmp, \
            deployment(Path(tmp)) as (home, client, info):
        front, killed_url = info.url, info.urls[1]
        assert front is not None  # a deployment of 2 replicas has a front
        log = home.root / "server.log"
        baseline = drive(front, args.clients, args.duration)

        def kill() -> dict[str, Any]:
            time.sleep(args.kill_after)
            retried_before = log.read_text(errors="replace").count(RETRY_LINE)
            os.kill(_server_pid(info.id, 1), signal.SIGKILL)
            killed_at = time.monotonic()
            _wait("the killed replica", lambda: _ready(killed_url), 120, every_s=0.02)
            serving = time.monotonic() - killed_at
            _wait("the deployment", lambda: _deployment_ready(client, info.id), 120)
            ready = time.monotonic() - killed_at
            return {"kill_to_serving_s": round(serving, 2), "kill_to_ready_s": round(ready, 2),
                    "retried_before": retried_before}

        with_kill = drive(front, args.clients, args.duration, kill)
        retried = log.read_text(errors="replace").count(RETRY_LINE) - with_kill.pop(
            "retried_before")
    print(json.dumps({
        "clients": args.clients, "duration_s": args.duration,
        "sent": with_kill["sent"], "failed": with_kill["failed"],
        "failed_in_flight": with_kill["failed"], "retried_by_front": retried,
        "kill_to_serving_s": with_kill.pop("kill_to_serving_s"),
        "kill_to_ready_s": with_kill.pop("kill_to_ready_s"),
        "baseline": baseline, "with_kill": with_kill,
        "p99_ratio": round(with_kill["p99_ms"] / baseline["p99_ms"], 2),
        "load_1m": os.getloadavg()[0]}))


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _deployment_ready(client: JobsClient, dep_id: str) -> bool:
    info = client.get_deployment(dep_id)
    return info.state.value == "ready" and len(info.healthy) == 2


if __name__ == "__main__":
    main()
