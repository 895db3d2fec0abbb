"""The ``ray`` backend and its entry in the registry: a cluster is attached to a Ray cluster,
whose machines are its nodes.

Attaching starts the service's private Ray head first where the address is ``local``, then
each machine's agent (:mod:`ringtrain.jobs.service.executors.ray.agent`), so that the first job does
not wait for it. Ray owns the machines: the service neither adds nor removes them. ``ray`` itself
is imported only when a Ray cluster is used.
"""

from __future__ import annotations

import argparse
import logging
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ringtrain.jobs.errors import InvalidRequestError, SpecError
from ringtrain.jobs.models import ClusterInfo, ClusterSpec, JobSpec, MachineInfo
from ringtrain.jobs.service.executors.base import Executor, LaunchHandle
from ringtrain.jobs.service.executors.ray.agent import ensure_agents
from ringtrain.jobs.service.executors.ray.connection import (
    LOCAL,
    RayConnection,
    start_private_cluster,
)
from ringtrain.jobs.service.executors.registry import BackendContext

log = logging.getLogger(__name__)

#: A Ray cluster's address: ``local``, or HOST:PORT (an IPv6 host in brackets).
ADDRESS_PATTERN = re.compile(r"local|[A-Za-z0-9_.-]+:[0-9]{1,5}|\[[0-9A-Fa-f:.]+\]:[0-9]{1,5}")


class RayBackend:
    """The Ray backend of a service.

    Args:
        executor: runs the attempts (the Ray executor; tests give their own).
        connection: the service's Ray driver connection.
        private_dir: where a private Ray head keeps its files and logs.
        join_timeout_s: how long a private cluster's machines have to join.
    """

    name = "ray"

    def __init__(self, executor: Executor[Any], connection: RayConnection, private_dir: Path,
                 join_timeout_s: float = 60.0):
        self.executor = executor
        self.connection = connection
        self.private_dir = private_dir
        self.join_timeout_s = join_timeout_s

    def attach(self, spec: ClusterSpec) -> ClusterSpec:
        address = spec.address or ""
        if not ADDRESS_PATTERN.fullmatch(address):
            message = ("a ray cluster needs an address: HOST:PORT, or local" if not address else
                       "a Ray address is HOST:PORT (an IPv6 host in brackets), or local")
            raise SpecError([{"field": "address", "message": message}], "cluster")
        if address == LOCAL:
            address = start_private_cluster(self.private_dir, max(1, spec.nodes), spec.slots)
            alive = self._wait_for_nodes(address, max(1, spec.nodes))
        else:
            alive = [n for n in self.connection.nodes(address) if n.alive]
        ensure_agents(self.connection.connect(address))
        return spec.model_copy(update={"address": address, "nodes": spec.nodes or len(alive)})

    def _wait_for_nodes(self, address: str, count: int) -> list[MachineInfo]:
        """The alive nodes of a private Ray cluster once ``count`` of them have joined.

        Raises:
            InvalidRequestError: fewer joined within ``join_timeout_s``.
        """
        deadline = time.monotonic() + self.join_timeout_s
        while True:
            alive = [n for n in self.connection.nodes(address) if n.alive]
            if len(alive) >= count:
                return alive
            if time.monotonic() > deadline:
                raise InvalidRequestError(
                    f"the private Ray cluster at {address} has {len(alive)} of its {count} "
                    f"nodes after {self.join_timeout_s:g} s; see {self.private_dir}")
            time.sleep(0.5)

    def describe(self, info: ClusterInfo) -> ClusterInfo:
        if not info.address:
            return info
        try:
            return info.model_copy(update={"machines": self.connection.nodes(info.address)})
        except InvalidRequestError as e:  # the record stands; Ray's view is missing
            log.warning("cluster %s: %s", info.name, e)
            return info

    def job_problems(self, info: ClusterInfo, spec: JobSpec) -> list[dict[str, str]]:
        # Every node runs `ringtrain run` in its per-node mode, elastic jobs included; only the
        # storage steps are not carried to Ray's machines yet.
        copies = [n for n, s in spec.input_sources().items() if s.mode == "copy"]
        errors = [{"field": f"inputs.{name}",
                   "message": f"cluster {info.name} is a Ray cluster, whose nodes do not stage "
                              "store URLs yet: use mode: direct, or a local cluster"}
                  for name in copies]
        if spec.outputs_url:
            errors.append({"field": "outputs_url",
                           "message": f"cluster {info.name} is a Ray cluster, whose nodes do not "
                                      "upload outputs to a store yet: use a local cluster"})
        return errors

    def resize_problem(self, info: ClusterInfo) -> str | None:
        return (f"cluster {info.name} is a Ray cluster: its machines are Ray's to add or remove "
                "(`ray start --address ...` on a new machine, or the Ray autoscaler); delete "
                "and create the ringtrain cluster again to change how many nodes its jobs may "
                "hold")

    def machine_usage(self, info: ClusterInfo) -> dict[str, dict[str, Any]] | None:
        if not info.address:
            return {}
        try:
            return self.connection.node_usage(info.address)
        except InvalidRequestError:  # unreachable now: nothing to show
            return {}

    def leader_pid(self, launch: LaunchHandle) -> int | None:
        return None  # the ranks run on Ray's machines


class RayPlugin:
    """Builds the ray backend: one Ray driver connection, shared by its executor and backend."""

    name = "ray"
    summary = ("a cluster is attached to a Ray cluster at --address HOST:PORT (or a private "
               "head the service starts: --local), whose machines are its nodes")

    def add_options(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument("--ray-node-ip", help="the address this service announces to Ray "
                                                 "clusters (default: Ray's choice)")

    def create(self, context: BackendContext, options: Mapping[str, Any]) -> RayBackend:
        from ringtrain.jobs.service.executors.ray.executor import RayExecutor

        connection = RayConnection(options.get("ray_node_ip"))
        executor = RayExecutor(context.share, connection, context.address_of)
        return RayBackend(executor, connection, context.state_dir)


PLUGIN = RayPlugin()
