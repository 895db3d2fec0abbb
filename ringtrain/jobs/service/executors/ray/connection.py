"""The service's connection to Ray clusters: attach, read the node table, start a private head.

One service process holds one Ray driver connection (``ray.init`` is per process), so all ray
clusters of one service must share one address. Ray's auth token, where the Ray cluster requires
one, comes from the service's own environment (``RAY_AUTH_MODE=token`` with ``RAY_AUTH_TOKEN`` or
``RAY_AUTH_TOKEN_PATH``), as Ray reads it: ringtrain never takes it on a command line or stores it.

``ray`` is imported inside the functions: the local backend works without the extra installed.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from ringtrain.jobs.errors import InvalidRequestError
from ringtrain.jobs.models import MachineInfo
from ringtrain.jobs.service.executors.node_launch import free_port

log = logging.getLogger(__name__)

#: The Ray namespace of ringtrain's named actors and placement groups.
NAMESPACE = "ringtrain"
#: ``address`` of a cluster whose Ray head the service starts itself.
LOCAL = "local"


def import_ray() -> Any:
    """The ``ray`` module. Raises InvalidRequestError, saying how to install it, if missing."""
    try:
        import ray
    except ImportError:
        raise InvalidRequestError("the ray backend needs Ray in the service's environment: "
                                  "pip install 'ringtrain[ray]'") from None
    return ray


class RayConnection:
    """The service's one driver connection to a Ray cluster, made on first use.

    Args:
        node_ip: the address this driver announces to Ray (``None``: Ray's own choice); tests
            in a loopback-only namespace pass ``127.0.0.1``.
    """

    def __init__(self, node_ip: str | None = None):
        self.node_ip = node_ip
        self.address: str | None = None  # where it is attached, once it is
        self._lock = threading.Lock()

    def connect(self, address: str) -> Any:
        """Attach to the Ray cluster at ``address`` (once), and return the ``ray`` module.

        Raises:
            InvalidRequestError: ray is missing, the cluster cannot be reached, or this service
                is attached to another Ray cluster already.
        """
        with self._lock:
            if self.address != address:
                _probe(address)  # an unreachable address fails at once, before Ray's retries
            ray = import_ray()
            if ray.is_initialized():
                # The driver is per process: whoever attached it, it serves one address.
                current = ray.get_runtime_context().gcs_address
                if current == address:
                    self.address = address
                    return ray
                raise InvalidRequestError(
                    f"this service is attached to the Ray cluster at {current}; one service "
                    f"serves one Ray cluster, so {address} needs a service of its own")
            kwargs: dict[str, Any] = dict(address=address, namespace=NAMESPACE,
                                          log_to_driver=False, logging_level=logging.WARNING,
                                          configure_logging=False)
            if self.node_ip:
                kwargs["_node_ip_address"] = self.node_ip
            try:
                ray.init(**kwargs)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise InvalidRequestError(f"cannot attach to the Ray cluster at {address}: {e}; "
                                          "is it running, and is its token in the service's "
                                          "environment (RAY_AUTH_TOKEN)?") from None
            self.address = address
            return ray

    def nodes(self, address: str) -> list[MachineInfo]:
        """Ray's node table: every node Ray knows, alive or dead, with its CPUs and GPUs.
        Raises InvalidRequestError as :meth:`connect` does."""
        ray = self.connect(address)
        # Free resources per node have no public API; the state module is what `ray status`
        # itself reads.
        from ray._private import state
        free = state.available_resources_per_node()
        out = []
        for n in ray.nodes():
            total, avail = n.get("Resources", {}), free.get(n["NodeID"], {})
            alive = bool(n["Alive"])
            out.append(MachineInfo(
                id=n["NodeID"], address=n["NodeManagerAddress"], alive=alive,
                cpus=total.get("CPU", 0.0), cpus_free=avail.get("CPU", 0.0) if alive else 0.0,
                gpus=total.get("GPU", 0.0), gpus_free=avail.get("GPU", 0.0) if alive else 0.0))
        return out


    def node_usage(self, address: str, timeout_s: float = 2.0) -> dict[str, dict[str, Any]]:
        """Each alive machine's CPU, memory and GPUs, sampled there by its agent, by Ray node
        id. Machines whose agent does not answer within ``timeout_s`` (not started yet, or from
        a ringtrain without this call) are left out. Raises InvalidRequestError as
        :meth:`connect` does."""
        from ringtrain.jobs.service.executors.ray.agent import agent_name

        ray = self.connect(address)
        calls = {}
        for n in ray.nodes():
            if not n["Alive"]:
                continue
            try:
                calls[n["NodeID"]] = ray.get_actor(agent_name(n["NodeID"])).usage.remote()
            except (ValueError, AttributeError):  # no agent there, or one without `usage`
                continue
        ready, _ = ray.wait(list(calls.values()), num_returns=len(calls), timeout=timeout_s)
        done = set(ready)
        out = {}
        for node_id, ref in calls.items():
            if ref in done:
                try:
                    out[node_id] = ray.get(ref, timeout=0)
                except Exception:  # noqa: BLE001, S112 - an agent that failed is left out
                    continue
        return out


def start_private_cluster(log_dir: Path, nodes: int, slots: int,
                          node_ip: str = "127.0.0.1") -> str:
    """Start a Ray cluster of ``nodes`` nodes on this host with ``ray start`` (a head and
    ``nodes - 1`` more raylets, each a separate Ray node, as on separate machines) and return
    its address. It runs detached from the service (it outlives a service restart) and binds
    ``node_ip``, loopback unless the caller chooses otherwise.

    Each node offers ``max(slots, cores // nodes)`` CPUs, so that a job's bundle of ``slots``
    CPUs fits on every node and the nodes together do not claim each core many times (one
    node offers what Ray counts).

    Raises:
        InvalidRequestError: ray is missing, or ``ray start`` failed (its output is in
            ``log_dir/ray-start.log``).
    """
    import_ray()
    cores = os.cpu_count() or 1
    cpus = max(slots, cores // max(1, nodes)) if nodes > 1 else None
    port = free_port(node_ip)
    address = f"{node_ip}:{port}"
    _ray_start(["--head", f"--port={port}", "--include-dashboard=false"], log_dir, node_ip, cpus)
    for _ in range(nodes - 1):
        _ray_start([f"--address={address}"], log_dir, node_ip, cpus)
    return address


def _ray_start(args: list[str], log_dir: Path, node_ip: str, cpus: int | None) -> None:
    """Run ``ray start ARGS`` (a head, or one more node of a private cluster)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    ray_cli = Path(sys.executable).parent / "ray"
    argv = [str(ray_cli), "start", *args, f"--node-ip-address={node_ip}",
            "--disable-usage-stats"]
    if cpus is not None:
        argv.append(f"--num-cpus={cpus}")
    log_file = log_dir / "ray-start.log"
    with open(log_file, "ab") as out:
        code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=120,
                              env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}).returncode
    if code != 0:
        what = "--head" if "--head" in args else args[0]
        raise InvalidRequestError(f"`ray start {what}` failed with exit code {code}; see "
                                  f"{log_file}")


def _probe(address: str, timeout_s: float = 0.5) -> None:
    """Refuse (InvalidRequestError) a malformed address, or one where nothing accepts a TCP
    connection."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError) as e:
        reason = getattr(e, "strerror", None) or str(e)
        raise InvalidRequestError(f"nothing answers at the Ray address {address} ({reason}); "
                                  "give the head's GCS address, HOST:PORT (port 6379 unless "
                                  "`ray start --head --port` chose another)") from None
