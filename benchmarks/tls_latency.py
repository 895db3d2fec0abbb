"""What TLS costs on the job routes: GET /v1/jobs over HTTPS against plain HTTP, on loopback, in
one run.

Two servers of two temporary homes, started alike except for ``--tls`` (the self-signed
certificate, pinned by the client as ``ringtrain login`` pins it), each holding the same queued
jobs. Each client keeps its connection alive, as the CLI's and a script's client do, so the
handshake is paid once per client; the requests alternate between the two servers in blocks, so
that a change of load on a shared machine lands on both. A second, smaller measure opens a new
connection per request (a CLI command opens one, plus the one that reads the pinned
certificate), where the handshake is the difference.

Prints one JSON line: per server the median and p90 of the kept-alive requests in ms, the ratio
of medians, the median of the per-block ratios with its bootstrap 95 % interval, and the fresh
connections' medians and ratio. Goal (issue 38): TLS ≤ 1.10x plain on kept-alive requests.

    python benchmarks/tls_latency.py [--requests 2000] [--block 50] [--jobs 20] [--fresh 50]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
from stats import bootstrap_median_ci

from ringtrain.jobs.client.connection import running_server, stop_server
from ringtrain.jobs.client.jobs_client import JobsClient
from ringtrain.jobs.client.pinning import pinned_context
from ringtrain.jobs.home import Home
from ringtrain.jobs.models import ClusterSpec, parse_job_spec
from ringtrain.jobs.server_info import ServerInfo


@contextmanager
def server(home: Home, *flags: str, timeout_s: float = 60.0) -> Iterator[ServerInfo]:
    """``ringtrain server FLAGS`` for ``home``, stopped on exit."""
    home.ensure()
    with open(home.server_log, "ab") as log:
        subprocess.Popen([sys.executable, "-m", "ringtrain.cli", "server", *flags],
                         env={**os.environ, "RINGTRAIN_HOME": str(home.root)},
                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while (info := running_server(home)) is None:
        if time.monotonic() > deadline:
            sys.exit(f"the job server did not start; see {home.server_log}")
        time.sleep(0.1)
    try:
        yield info
    finally:
        stop_server(home)


def queue_jobs(info: ServerInfo, count: int) -> None:
    """``count`` jobs that stay queued (each needs two nodes of a one-node cluster), so that
    GET /v1/jobs answers a list of that many records and no job runs during the measure."""
    client = JobsClient(info.url, info.token, fingerprint=info.fingerprint)
    client.create_cluster(ClusterSpec(name="bench", nodes=1, slots=1))
    for i in range(count):
        client.submit("bench", parse_job_spec({"name": f"queued{i}", "node_count": 2,
                                               "command": "true"}))
    client.close()


def http_client(info: ServerInfo) -> httpx.Client:
    """A kept-alive client of ``info``'s server, trusting exactly its pinned certificate."""
    verify = pinned_context(info.url, info.fingerprint) if info.fingerprint else True
    return httpx.Client(base_url=info.url, verify=verify, timeout=30,
                        headers={"Authorization": f"Bearer {info.token}"})


def timed_get(client: httpx.Client) -> float:
    """One GET /v1/jobs, in seconds."""
    t0 = time.perf_counter()
    r = client.get("/v1/jobs")
    elapsed = time.perf_counter() - t0
    r.raise_for_status()
    return elapsed


def fresh_get(info: ServerInfo) -> float:
    """One GET /v1/jobs on a new connection (the pin's context made beforehand, untimed)."""
    client = http_client(info)
    try:
        return timed_get(client)
    finally:
        client.close()


def ms(seconds: list[float], q: float = 0.5) -> float:
    ordered = sorted(seconds)
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=2000, help="kept-alive requests per server")
    p.add_argument("--block", type=int, default=50, help="requests per block (alternating)")
    p.add_argument("--jobs", type=int, default=20, help="queued jobs each server lists")
    p.add_argument("--fresh", type=int, default=50, help="new-connection requests per server")
    p.add_argument("--warmup", type=int, default=100, help="untimed requests per server first")
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="tls-latency-") as tmp, ExitStack() as stack:
        plain = stack.enter_context(server(Home(Path(tmp) / "plain")))
        tls = stack.enter_context(server(Home(Path(tmp) / "tls"), "--tls"))
        for info in (plain, tls):
            queue_jobs(info, args.jobs)
        clients = {"plain": stack.enter_context(http_client(plain)),
                   "tls": stack.enter_context(http_client(tls))}
        for client in clients.values():
            for _ in range(args.warmup):
                timed_get(client)
        times: dict[str, list[float]] = {"plain": [], "tls": []}
        block_ratios = []
        load = os.getloadavg()[0]
        for b in range(max(1, args.requests // args.block)):
            order = ("plain", "tls") if b % 2 == 0 else ("tls", "plain")
            block: dict[str, list[float]] = {}
            for name in order:
                block[name] = [timed_get(clients[name]) for _ in range(args.block)]
                times[name] += block[name]
            block_ratios.append(statistics.median(block["tls"]) / statistics.median(
                block["plain"]))
        fresh: dict[str, list[float]] = {"plain": [], "tls": []}
        for _ in range(args.fresh):
            fresh["plain"].append(fresh_get(plain))
            fresh["tls"].append(fresh_get(tls))
    low, high = bootstrap_median_ci(block_ratios)
    result = {
        "benchmark": "tls_latency", "route": "GET /v1/jobs", "jobs_listed": args.jobs,
        "requests_per_server": len(times["plain"]), "block": args.block,
        "load_avg_1m": [round(load, 2), round(os.getloadavg()[0], 2)],
        "plain_ms": {"median": ms(times["plain"]), "p90": ms(times["plain"], 0.9)},
        "tls_ms": {"median": ms(times["tls"]), "p90": ms(times["tls"], 0.9)},
        "ratio_of_medians": round(statistics.median(times["tls"])
                                  / statistics.median(times["plain"]), 3),
        "block_ratio_median": round(statistics.median(block_ratios), 3),
        "block_ratio_ci95": [round(low, 3), round(high, 3)],
        "goal": "tls <= 1.10x plain (kept-alive)",
        "fresh_connection_ms": {"plain": ms(fresh["plain"]), "tls": ms(fresh["tls"]),
                                "ratio": round(statistics.median(fresh["tls"])
                                               / statistics.median(fresh["plain"]), 3)},
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
