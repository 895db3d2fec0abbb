"""Shared by the job benchmarks: a Ray test cluster on loopback and a job server attached to it.

Ray binds the machine's own network address unless told otherwise, and servers on the
development machines may use loopback only: the cluster here is refused unless the process runs
in a network namespace that has no interface but ``lo``. Run a benchmark that uses it as

    unshare -n sh -c 'ip link set lo up && exec python benchmarks/BENCH.py --ray-nodes 2'
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ringtrain.jobs import envvars
from ringtrain.jobs.client.connection import connect, running_server, stop_server
from ringtrain.jobs.client.jobs_client import JobsClient
from ringtrain.jobs.home import Home
from ringtrain.jobs.models import JobInfo

#: The address every Ray node and the service announce: only loopback exists here.
NODE_IP = "127.0.0.1"


def require_loopback_only() -> None:
    """Exit with a message unless ``lo`` is the only network interface (see the module doc)."""
    interfaces = sorted(name for _, name in socket.if_nameindex())  # this namespace's
    if interfaces != ["lo"]:
        sys.exit(f"a Ray test cluster binds every interface it sees, and this process sees "
                 f"{', '.join(interfaces)}: run it in a loopback-only network namespace, "
                 "`unshare -n sh -c 'ip link set lo up && exec python ...'` (as root)")


@contextmanager
def ray_test_cluster(nodes: int, cpus_per_node: int = 2) -> Iterator[str]:
    """A Ray cluster of ``nodes`` raylets on this machine (address 127.0.0.1); yields its address.

    Each raylet is a separate Ray node with its own CPUs, so placement groups spread over them
    as over separate machines (they share the filesystem).
    """
    require_loopback_only()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from ray.cluster_utils import Cluster

    node = {"num_cpus": cpus_per_node, "node_ip_address": NODE_IP,
            "object_store_memory": 80 << 20}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    try:
        for _ in range(nodes - 1):
            cluster.add_node(**node)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()


@contextmanager
def job_server(home: Home, ray_node_ip: str | None = NODE_IP,
               timeout_s: float = 60.0) -> Iterator[JobsClient]:
    """A ``ringtrain server`` for ``home`` announcing ``ray_node_ip`` to Ray (``None``: Ray's
    choice); stopped on exit."""
    home.ensure()
    argv = [sys.executable, "-m", "ringtrain.cli", "server"]
    if ray_node_ip:
        argv += ["--ray-node-ip", ray_node_ip]
    with open(home.server_log, "ab") as log:
        subprocess.Popen(argv, env={**os.environ, envvars.HOME: str(home.root)},
                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while running_server(home) is None:
        if time.monotonic() > deadline:
            sys.exit(f"the job server did not start; see {home.server_log}")
        time.sleep(0.1)
    client = connect(home, autostart=False)
    try:
        yield client
    finally:
        client.close()
        stop_server(home)


def wait_until_ended(client: JobsClient, job_id: str, timeout_s: float) -> JobInfo:
    """The job once it is in a final state.

    Raises:
        TimeoutError: it was not within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while not (job := client.get_job(job_id)).state.is_terminal():
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still {job.state.value} after {timeout_s:.0f} s")
        time.sleep(0.5)
    return job


def rank_stdout(client: JobsClient, job_id: str) -> str:
    """Rank 0's whole stdout."""
    return b"".join(client.logs(job_id)).decode(errors="replace")


def machine() -> str:
    """A line naming the machine the figures come from."""
    load = os.getloadavg()[0]
    return f"{os.cpu_count()} cores, load average {load:.1f} at the start"


def repo_root() -> Path:
    """The checkout these benchmarks belong to (specs' working dirs are relative to it)."""
    return Path(__file__).resolve().parents[1]
