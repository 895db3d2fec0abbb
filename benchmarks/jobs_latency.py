"""Job service latency: submit-to-running and log-follow lag, on the local or the ray backend.

Prints one JSON line of medians in seconds. Peers: the same command started by a bare
``subprocess.Popen``, and by ``ringtrain run`` directly, so the service's own share of the
latency is visible. Runs in a temporary RINGTRAIN_HOME with its own server.

    python benchmarks/jobs_latency.py [--reps 5] [--ray-address HOST:PORT]

With ``--ray-address`` the jobs run on a one-node job cluster of that (idle) Ray cluster; Ray
must bind an address the service reaches (here: loopback, inside a network namespace, see
docs/jobs.md "Ray clusters").
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ringtrain.jobs.connect import connect, stop_server
from ringtrain.jobs.home import Home
from ringtrain.jobs.models import ClusterSpec, JobState, parse_job_spec

STAMP = "python -c \"import time; print(repr(time.time()), flush=True)\""
TICKER = ("python -c \"import time\nfor _ in range({n}):\n    print(repr(time.time()), "
          "flush=True); time.sleep({every})\"")


def _first_stamp(text: str) -> float:
    return float(text.split()[0])


def peer_subprocess(reps: int) -> list[float]:
    """Popen of the same command: the floor any launcher pays."""
    out = []
    for _ in range(reps):
        t0 = time.time()
        proc = subprocess.run(["sh", "-c", STAMP], capture_output=True, text=True, check=True)
        out.append(_first_stamp(proc.stdout) - t0)
    return out


def peer_ringtrain_run(reps: int, tmp: Path) -> list[float]:
    """`ringtrain run -np 1` of the same command, without the service."""
    out = []
    for i in range(reps):
        logs = tmp / f"run{i}"
        t0 = time.time()
        subprocess.run([sys.executable, "-m", "ringtrain.cli", "run", "-np", "1",
                        "--output-filename", str(logs), "sh", "-c", STAMP],
                       capture_output=True, check=True)
        out.append(_first_stamp((logs / "rank.0" / "stdout").read_text()) - t0)
    return out


def service_latency(client, reps: int) -> tuple[list[float], list[float]]:
    """Submit -> state running (seen through the API), and submit -> command running."""
    to_running, to_command = [], []
    spec = parse_job_spec({"node_count": 1, "command": STAMP})
    for _ in range(reps):
        t0 = time.time()
        job = client.submit("bench", spec)
        seen = None
        while not (job := client.get_job(job.id)).state.is_terminal():
            if seen is None and job.state == JobState.RUNNING:
                seen = time.time()
            time.sleep(0.05)  # poll gently: the server shares the CPU with the job
        if job.state != JobState.SUCCEEDED:
            raise RuntimeError(f"benchmark job {job.id} {job.state.value}: {job.message}")
        # A job may finish between two polls; the store's time is then the best we have.
        to_running.append((seen or job.running_at or job.ended_at) - t0)
        to_command.append(_first_stamp(b"".join(client.logs(job.id)).decode()) - t0)
    return to_running, to_command


def follow_lag(client, lines: int = 60, every_s: float = 0.05) -> tuple[list[float], float]:
    """Per-line delay between a rank printing a line and `job logs --follow` receiving it."""
    spec = parse_job_spec({"node_count": 1, "command": TICKER.format(n=lines, every=every_s)})
    job = client.submit("bench", spec)
    lags, buf = [], b""
    for chunk in client.logs(job.id, follow=True):
        now = time.time()
        buf += chunk
        *complete, buf = buf.split(b"\n")
        lags += [now - float(line) for line in complete if line.strip()]
    returned = time.time()
    ended = client.get_job(job.id).ended_at
    return lags, returned - ended


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--ray-address", help="run the jobs on the Ray cluster at HOST:PORT")
    args = p.parse_args(argv)
    backend = "ray" if args.ray_address else "local"
    with tempfile.TemporaryDirectory(prefix="ringtrain-bench-") as tmp:
        home = Home(Path(tmp) / "home")
        client = connect(home)
        try:
            client.create_cluster(ClusterSpec(name="bench", nodes=1, slots=1, backend=backend,
                                              address=args.ray_address))
            to_running, to_command = service_latency(client, args.reps)
            lags, end_after = follow_lag(client)
            bare = peer_subprocess(args.reps)
            run = peer_ringtrain_run(args.reps, Path(tmp))
        finally:
            client.close()
            stop_server(home)
    lags.sort()
    median = statistics.median
    print(json.dumps({
        "benchmark": "jobs_latency", "backend": backend, "reps": args.reps,
        "submit_to_running_s": round(median(to_running), 3),
        "submit_to_command_s": round(median(to_command), 3),
        "peer_ringtrain_run_to_command_s": round(median(run), 3),
        "peer_subprocess_to_command_s": round(median(bare), 3),
        "log_follow_lag_median_s": round(median(lags), 3),
        "log_follow_lag_p95_s": round(lags[int(0.95 * (len(lags) - 1))], 3),
        "log_follow_lag_max_s": round(lags[-1], 3),
        "follow_returns_after_job_end_s": round(end_after, 3),
        "log_lines": len(lags),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
