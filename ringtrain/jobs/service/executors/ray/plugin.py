"""The ray backend's entry in the registry: its option of ``ringtrain server``, and how the
service builds it (one Ray driver connection, shared by its executor and its backend)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from ringtrain.jobs.service.executors.backend import ClusterBackend
from ringtrain.jobs.service.executors.registry import BackendContext


class RayPlugin:
    """Builds the ray backend; ``ray`` itself is imported only when a Ray cluster is used."""

    name = "ray"
    summary = ("a cluster is attached to a Ray cluster at --address HOST:PORT (or a private "
               "head the service starts: --local), whose machines are its nodes")

    def add_options(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument("--ray-node-ip", help="the address this service announces to Ray "
                                                 "clusters (default: Ray's choice)")

    def create(self, context: BackendContext, options: Mapping[str, Any]) -> ClusterBackend:
        from ringtrain.jobs.service.executors.ray.backend import RayBackend
        from ringtrain.jobs.service.executors.ray.connection import RayConnection
        from ringtrain.jobs.service.executors.ray.executor import RayExecutor

        connection = RayConnection(options.get("ray_node_ip"))
        executor = RayExecutor(context.share, connection, context.address_of)
        return RayBackend(executor, connection, context.state_dir)


PLUGIN = RayPlugin()
