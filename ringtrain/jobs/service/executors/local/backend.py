"""The local backend and its entry in the registry (no options of its own): a cluster's nodes
are process slots on the service's host, so it has nothing to attach or describe, and the
service may resize its clusters as it likes."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from ringtrain.jobs.errors import SpecError
from ringtrain.jobs.models import ClusterInfo, ClusterSpec, JobSpec
from ringtrain.jobs.service.executors.base import Executor, LaunchHandle
from ringtrain.jobs.service.executors.local.records import RunnerHandle
from ringtrain.jobs.service.executors.registry import BackendContext


class LocalBackend:
    """The local backend of a service.

    Args:
        executor: runs the attempts (the local executor; tests give their own).
    """

    name = "local"

    def __init__(self, executor: Executor[Any]):
        self.executor = executor

    def attach(self, spec: ClusterSpec) -> ClusterSpec:
        if spec.address is not None:
            raise SpecError([{"field": "address",
                              "message": "a local cluster has no address: its nodes are process "
                                         "slots on the service's host"}], "cluster")
        return spec

    def describe(self, info: ClusterInfo) -> ClusterInfo:
        return info

    def job_problems(self, info: ClusterInfo, spec: JobSpec) -> list[dict[str, str]]:
        return []

    def resize_problem(self, info: ClusterInfo) -> str | None:
        return None

    def machine_usage(self, info: ClusterInfo) -> dict[str, dict[str, Any]] | None:
        return None

    def leader_pid(self, launch: LaunchHandle) -> int | None:
        return launch.pid if isinstance(launch, RunnerHandle) else None


class LocalPlugin:
    """Builds the local backend."""

    name = "local"
    summary = "a cluster's nodes are process slots on the service's host (the default)"

    def add_options(self, group: argparse._ArgumentGroup) -> None:
        pass

    def create(self, context: BackendContext, options: Mapping[str, Any]) -> LocalBackend:
        from ringtrain.jobs.service.executors.local.executor import LocalExecutor

        return LocalBackend(LocalExecutor(context.share, storage=context.storage))


PLUGIN = LocalPlugin()
