"""Job service latency: submit-to-running and log-follow lag, on the local and the ray backend.

Prints one JSON line of medians in seconds, per backend, and the ray/local ratios. Peers: the
same command started by a bare ``subprocess.Popen``, and by ``ringtrain run`` directly, so the
service's own share of the latency is visible. Runs in a temporary RINGTRAIN_HOME with its own
server; every job has ``--job-nodes`` nodes of one rank.

    python benchmarks/jobs_latency.py [--reps 5]                  # the local backend only
    python benchmarks/jobs_latency.py --ray-address HOST:PORT     # and an idle Ray cluster
    unshare -n sh -c 'ip link set lo up && exec python benchmarks/jobs_latency.py --ray-nodes 2'

``--ray-nodes N`` starts a Ray test cluster of N raylets on this machine for the run (only in a
loopback-only network namespace: see ``loopback_ray.py``). Goals (issue 13): submit to running
≤ 3 s on an idle Ray cluster; log lag ≤ 1 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from loopback_ray import NODE_IP, job_server, machine, ray_test_cluster

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


class _Probe:
    """An empty Ray actor: what placing a job's nodes costs Ray itself."""

    def ping(self) -> float:
        return time.time()


def peer_ray(address: str, node_ip: str | None, nodes: int, reps: int
             ) -> tuple[list[float], list[float]]:
    """Ray alone, without the service: a placement group of ``nodes`` one-CPU bundles and then
    (1) a fresh actor in each bundle answering (the previous design's floor), (2) a warm actor
    already running on each bundle's machine answering (the agents' floor).

    Returns:
        The seconds of each, per repetition.
    """
    import ray
    from ray.util import placement_group_table
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import (
        NodeAffinitySchedulingStrategy,
        PlacementGroupSchedulingStrategy,
    )

    ray.init(address=address, _node_ip_address=node_ip, log_to_driver=False,
             namespace="ringtrain-bench")
    probe, fresh, warm = ray.remote(_Probe), [], []
    try:
        agents = {n["NodeID"]: probe.options(num_cpus=0, scheduling_strategy=(
            NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))).remote()
                  for n in ray.nodes() if n["Alive"]}
        ray.get([a.ping.remote() for a in agents.values()], timeout=120)
        for _ in range(reps):
            t0 = time.time()
            pg = placement_group([{"CPU": 1}] * nodes,
                                 strategy="STRICT_SPREAD" if nodes > 1 else "PACK")
            actors = []
            for k in range(nodes):
                where = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=k)
                actors.append(probe.options(num_cpus=1, scheduling_strategy=where).remote())
            ray.get([a.ping.remote() for a in actors], timeout=120)
            fresh.append(time.time() - t0)
            for a in actors:
                ray.kill(a)
            remove_placement_group(pg)
            t0 = time.time()
            pg = placement_group([{"CPU": 1}] * nodes,
                                 strategy="STRICT_SPREAD" if nodes > 1 else "PACK")
            ray.get(pg.ready(), timeout=120)
            placed = placement_group_table(pg)["bundles_to_node_id"].values()
            ray.get([agents[node].ping.remote() for node in placed], timeout=120)
            warm.append(time.time() - t0)
            remove_placement_group(pg)
    finally:
        ray.shutdown()
    return fresh, warm


def service_latency(client, cluster: str, nodes: int, reps: int
                    ) -> tuple[list[float], list[float]]:
    """Submit -> state running (seen through the API), and submit -> command running."""
    to_running, to_command = [], []
    spec = parse_job_spec({"node_count": nodes, "command": STAMP})
    for _ in range(reps):
        t0 = time.time()
        job = client.submit(cluster, spec)
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


def follow_lag(client, cluster: str, nodes: int, lines: int = 60, every_s: float = 0.05
               ) -> tuple[list[float], float]:
    """Per-line delay between a rank printing a line and `job logs --follow` receiving it."""
    spec = parse_job_spec({"node_count": nodes,
                           "command": TICKER.format(n=lines, every=every_s)})
    job = client.submit(cluster, spec)
    lags, buf = [], b""
    for chunk in client.logs(job.id, follow=True):
        now = time.time()
        buf += chunk
        *complete, buf = buf.split(b"\n")
        lags += [now - float(line) for line in complete if line.strip()]
    returned = time.time()
    ended = client.get_job(job.id).ended_at
    return lags, returned - ended


def measure(client, cluster: str, nodes: int, reps: int) -> dict[str, float]:
    """The service's figures on one cluster."""
    to_running, to_command = service_latency(client, cluster, nodes, reps)
    lags, end_after = follow_lag(client, cluster, nodes)
    lags.sort()
    median = statistics.median
    return {
        "submit_to_running_s": round(median(to_running), 3),
        "submit_to_running_max_s": round(max(to_running), 3),
        "submit_to_command_s": round(median(to_command), 3),
        "log_follow_lag_median_s": round(median(lags), 3),
        "log_follow_lag_p95_s": round(lags[int(0.95 * (len(lags) - 1))], 3),
        "log_follow_lag_max_s": round(lags[-1], 3),
        "follow_returns_after_job_end_s": round(end_after, 3),
        "log_lines": len(lags),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--job-nodes", type=int, default=2, help="nodes of every job (default 2)")
    ray = p.add_mutually_exclusive_group()
    ray.add_argument("--ray-address", help="also run the jobs on the Ray cluster at HOST:PORT")
    ray.add_argument("--ray-nodes", type=int,
                     help="also run them on a Ray test cluster of N raylets started here")
    args = p.parse_args(argv)
    where = machine()
    figures: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="ringtrain-bench-") as tmp, ExitStack() as stack:
        address = args.ray_address
        if args.ray_nodes:
            address = stack.enter_context(ray_test_cluster(args.ray_nodes))
        home = Home(Path(tmp) / "home")
        # Our own test cluster announces loopback; an existing one is reached as Ray chooses.
        node_ip = NODE_IP if args.ray_nodes else None
        client = stack.enter_context(job_server(home, node_ip))
        client.create_cluster(ClusterSpec(name="local", nodes=args.job_nodes, slots=1))
        figures["local"] = measure(client, "local", args.job_nodes, args.reps)
        if address:
            client.create_cluster(ClusterSpec(name="ray", nodes=0, slots=1, backend="ray",
                                              address=address))
            measure(client, "ray", args.job_nodes, 1)  # Ray starts its worker processes
            figures["ray"] = measure(client, "ray", args.job_nodes, args.reps)
            fresh, warm = peer_ray(address, node_ip, args.job_nodes, args.reps)
            figures["ray"]["peer_ray_fresh_actors_ready_s"] = round(statistics.median(fresh), 3)
            figures["ray"]["peer_ray_warm_actors_ready_s"] = round(statistics.median(warm), 3)
        bare = peer_subprocess(args.reps)
        run = peer_ringtrain_run(args.reps, Path(tmp))
    result: dict[str, object] = {
        "benchmark": "jobs_latency", "machine": where, "reps": args.reps,
        "job_nodes": args.job_nodes, **figures,
        "peer_ringtrain_run_to_command_s": round(statistics.median(run), 3),
        "peer_subprocess_to_command_s": round(statistics.median(bare), 3),
    }
    if "ray" in figures:
        result["ray_over_local"] = {k: round(figures["ray"][k] / figures["local"][k], 2)
                                    for k in ("submit_to_running_s", "submit_to_command_s",
                                              "log_follow_lag_median_s")
                                    if figures["local"][k] > 0}
        result["goals_met"] = {
            "ray_submit_to_running_le_3s": figures["ray"]["submit_to_running_max_s"] <= 3.0,
            "ray_log_lag_le_1s": figures["ray"]["log_follow_lag_max_s"] <= 1.0}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
