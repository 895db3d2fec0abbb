"""Job service under load: concurrent submits and followed logs across a killed server.

``--clients`` threads (in a process of their own, so that they do not share the probe's
interpreter) submit ``--submits`` jobs in all, each with a marker of its own, while
``--followers`` clients follow the logs of jobs that print a numbered line every 0.1 s, and a
probe asks ``/v1/health`` every 50 ms. Once a third of the submits are done the server is killed
with SIGKILL and started again. Prints one JSON line:

- ``recorded``, ``duplicates``, ``lost``: the submitted jobs in the store, markers recorded
  more than once, and submits the store does not hold (both must be 0);
- ``followers_ok``: every follower got each line exactly once, in order, to the job's end;
- ``health_max_ms``: the slowest health answer outside the restart (from the kill to the first
  answer of the new server), with ``health_p50_ms``, ``health_p95_ms`` and ``health_failures``
  outside it;
- ``restart_s``, ``submit_p50_ms``, ``submit_max_ms``, ``wall_s``.

The submitted jobs need one node more than the cluster has (a node per followed job), so they
queue and the load is on the service, not on starting processes; they are terminated at the
end. The probe runs only while the load does: the followed jobs' ranks and the submitting
process have started before it.

    python benchmarks/jobs_load.py [--submits 200] [--clients 20] [--followers 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from ringtrain import proc_stat
from ringtrain.jobs.client.connection import connect, read_server_file, start_server, stop_server
from ringtrain.jobs.client.jobs_client import JobsClient
from ringtrain.jobs.errors import JobsError
from ringtrain.jobs.home import Home
from ringtrain.jobs.models import ClusterSpec, parse_job_spec
from ringtrain.jobs.service.executors.local import cgroups, procs

CLUSTER = "load"
TICKER = ("python -c \"import time\nfor i in range({lines}):\n    print('line', i, flush=True); "
          "time.sleep(0.1)\"")


def submit_all(home_root: str, submits: int, clients: int, node_count: int, ready, go, done,
               results) -> None:
    """In a process of its own: ``clients`` threads submit ``submits`` jobs between them.

    Sets ``ready`` once connected, and starts on ``go``. Each thread pauses up to 50 ms between
    submits, so the submits span the server's restart. ``done`` counts finished submits;
    ``results`` gets ``(marker, job id or error, seconds)``.
    """
    home = Home(Path(home_root))
    out: list[tuple[str, str, float]] = []
    lock = threading.Lock()
    connected = [connect(home, autostart=False) for _ in range(clients)]  # no herd of restarts
    ready.set()
    go.wait()

    def client(index: int) -> None:
        c = connected[index]
        for k in range(index, submits, clients):
            marker = f"m{k:05d}"
            spec = parse_job_spec({"name": marker, "node_count": node_count, "command": "true"})
            t0 = time.monotonic()
            try:
                job_id = c.submit(CLUSTER, spec).id
            except JobsError as e:
                job_id = f"error: {e}"
            with lock:
                out.append((marker, job_id, time.monotonic() - t0))
            with done.get_lock():
                done.value += 1
            time.sleep(0.05 * (k % 3) / 2)
        c.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.put(out)


class HealthProbe(threading.Thread):
    """Asks ``/v1/health`` every 50 ms; records ``(start, end, whether it answered)``."""

    def __init__(self, client: JobsClient):
        super().__init__(daemon=True)
        self.client = client
        self.samples: list[tuple[float, float, bool]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                self.client.health()
                self.samples.append((t0, time.monotonic(), True))
            except JobsError:
                self.samples.append((t0, time.monotonic(), False))
                self.client.reconnect()
            self.stop.wait(0.05)


def follow(client: JobsClient, job_id: str, lines: int, ok: list[bool]) -> None:
    """Follow a ticker job's log; ``ok`` gets whether each line came exactly once, in order."""
    text = b"".join(client.logs(job_id, follow=True)).decode()
    ok.append(text.splitlines() == [f"line {i}" for i in range(lines)])


def run(submits: int, clients: int, followers: int, lines: int) -> dict:
    """The whole load test in a fresh home; returns the JSON line's fields."""
    with tempfile.TemporaryDirectory(prefix="ringtrain-load-") as tmp:
        home = Home(Path(tmp) / "home")
        start_server(home)
        admin = connect(home, autostart=False)
        try:
            return _load(home, admin, submits, clients, followers, lines)
        finally:
            _end_jobs(admin)
            admin.close()
            stop_server(home)
            for job_dir in (home.share_root / "jobs").iterdir():
                procs.signal_job(job_dir.name, None, signal.SIGKILL)
            if (groups := cgroups.JobCgroups.detect(home.share_root.resolve())) is not None:
                groups.sweep()


def _end_jobs(admin: JobsClient, timeout_s: float = 60.0) -> None:
    """Terminate what still runs or waits, and wait (bounded) until the service has released it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [j for j in admin.list_jobs(cluster=CLUSTER) if not j.state.is_terminal()]
        if not left:
            return
        for job in left:
            try:
                admin.terminate(job.id)
            except JobsError:  # ended, or terminating, meanwhile
                pass
        time.sleep(0.2)


def _load(home: Home, admin: JobsClient, submits: int, clients: int, followers: int,
          lines: int) -> dict:
    admin.create_cluster(ClusterSpec(name=CLUSTER, nodes=followers))
    ticker = parse_job_spec({"name": "ticker", "node_count": 1, "priority": "high",
                             "command": TICKER.format(lines=lines)})
    tickers = [admin.submit(CLUSTER, ticker).id for _ in range(followers)]
    ctx = multiprocessing.get_context("spawn")
    ready, go, done, results = ctx.Event(), ctx.Event(), ctx.Value("i", 0), ctx.Queue()
    submitter = ctx.Process(target=submit_all, args=(
        str(home.root), submits, clients, followers + 1, ready, go, done, results))
    submitter.start()
    logs = [home.share_root / "jobs" / t / "stdouterr/rank.0/stdout" for t in tickers]
    deadline = time.monotonic() + 120
    while not (ready.is_set() and all(p.exists() and p.stat().st_size for p in logs)):
        if time.monotonic() > deadline or not submitter.is_alive():
            raise RuntimeError("the followed jobs or the submitting process did not start")
        time.sleep(0.1)

    t_start = time.monotonic()
    go.set()
    probe = HealthProbe(connect(home, autostart=False))
    probe.start()
    followed: list[bool] = []
    follow_threads = [threading.Thread(target=follow, args=(connect(home, autostart=False), t,
                                                            lines, followed))
                      for t in tickers]
    for t in follow_threads:
        t.start()

    while done.value < submits // 3 and submitter.is_alive():
        time.sleep(0.01)
    killed = read_server_file(home)
    os.kill(killed.pid, signal.SIGKILL)
    t_kill = time.monotonic()
    while proc_stat.is_alive(killed.pid, None):
        time.sleep(0.01)
    start_server(home)
    admin.reconnect()

    out = results.get(timeout=300)
    submitter.join(timeout=30)
    for t in follow_threads:
        t.join(timeout=300)
    probe.stop.set()
    probe.join(timeout=10)
    wall = time.monotonic() - t_start

    # The restart: from the kill to the new server's first answer. A request that was under
    # way when the server was killed is part of it.
    first_after = min((t0 for t0, _, ok in probe.samples if t0 > t_kill and ok),
                      default=float("inf"))
    outside = [(t0, t1, ok) for t0, t1, ok in probe.samples if t1 < t_kill or t0 >= first_after]
    answers = sorted(t1 - t0 for t0, t1, ok in outside if ok)
    recorded = Counter(j.spec.name for j in admin.list_jobs(cluster=CLUSTER)
                       if j.spec.name != "ticker")
    returned = {marker: job_id for marker, job_id, _ in out}
    latencies = sorted(s for _, _, s in out)
    return {
        "benchmark": "jobs_load", "submits": submits, "clients": clients,
        "followers": followers,
        "recorded": sum(recorded.values()),
        "duplicates": sum(1 for n in recorded.values() if n > 1),
        "lost": sum(1 for m in returned if m not in recorded),
        "submit_errors": sum(1 for j in returned.values() if j.startswith("error")),
        "followers_ok": len(followed) == followers and all(followed),
        "health_max_ms": round(1000 * answers[-1], 1) if answers else None,
        "health_p50_ms": round(1000 * statistics.median(answers), 1) if answers else None,
        "health_p95_ms": round(1000 * answers[int(0.95 * (len(answers) - 1))], 1)
        if answers else None,
        "health_failures": sum(1 for _, _, ok in outside if not ok),
        "restart_s": round(first_after - t_kill, 2),
        "submit_p50_ms": round(1000 * statistics.median(latencies), 1),
        "submit_max_ms": round(1000 * latencies[-1], 1),
        "wall_s": round(wall, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--submits", type=int, default=200)
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--followers", type=int, default=3)
    p.add_argument("--lines", type=int, default=100, help="lines each followed job prints")
    args = p.parse_args(argv)
    print(json.dumps(run(args.submits, args.clients, args.followers, args.lines)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
