"""The local backend's entry in the registry: no options of its own."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from ringtrain.jobs.service.executors.backend import ClusterBackend
from ringtrain.jobs.service.executors.registry import BackendContext


class LocalPlugin:
    """Builds the local backend: process slots on the service's host."""

    name = "local"
    summary = "a cluster's nodes are process slots on the service's host (the default)"

    def add_options(self, group: argparse._ArgumentGroup) -> None:
        pass

    def create(self, context: BackendContext, options: Mapping[str, Any]) -> ClusterBackend:
        from ringtrain.jobs.service.executors.local.backend import LocalBackend
        from ringtrain.jobs.service.executors.local.executor import LocalExecutor

        return LocalBackend(LocalExecutor(context.share))


PLUGIN = LocalPlugin()
