"""The local backend: a cluster's nodes are process slots on the service's host, so it has
nothing to attach or describe, and the service may resize its clusters as it likes."""

from __future__ import annotations

from typing import Any

from ringtrain.jobs.errors import SpecError
from ringtrain.jobs.models import ClusterInfo, ClusterSpec, JobSpec
from ringtrain.jobs.service.executors.base import Executor, LaunchHandle
from ringtrain.jobs.service.executors.local.records import RunnerHandle


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
