"""The ClusterBackend protocol: what one backend does for the service besides running attempts.

Each :class:`~ringtrain.jobs.models.Backend` has one: it owns the backend's executor, attaches a
new cluster, describes a cluster's machines, says which job specs its clusters cannot run, and
whether their node count is the service's to change. The service asks the backend of a cluster
and never tests which backend it is. :class:`LocalBackend` is the local one: its clusters are
the service's own process slots, so it has nothing to attach or describe.
"""

from __future__ import annotations

from typing import Any, Protocol

from ringtrain.jobs.executors.base import Executor, LaunchHandle
from ringtrain.jobs.executors.records import RunnerHandle
from ringtrain.jobs.models import Backend, ClusterInfo, ClusterSpec, JobSpec


class ClusterBackend(Protocol):
    """One backend of the service: its executor and what its clusters need beyond it."""

    @property
    def kind(self) -> Backend:
        """The backend this is."""
        ...

    @property
    def executor(self) -> Executor[Any]:
        """Runs the attempts of jobs on this backend's clusters."""
        ...

    def attach(self, spec: ClusterSpec) -> ClusterSpec:
        """Make or reach the machines of a new cluster, before it is recorded.

        Returns:
            The spec to record (an address resolved, ``nodes`` 0 turned into a count).

        Raises:
            InvalidRequestError: the machines cannot be reached or started.
        """
        ...

    def describe(self, info: ClusterInfo) -> ClusterInfo:
        """``info`` with what the backend knows of the cluster's machines (never raises: the
        record stands when the machines cannot be asked)."""
        ...

    def job_problems(self, info: ClusterInfo, spec: JobSpec) -> list[dict[str, str]]:
        """What in ``spec`` this backend's cluster ``info`` cannot run, as ``{"field",
        "message"}`` entries (empty if it can run it)."""
        ...

    def resize_problem(self, info: ClusterInfo) -> str | None:
        """Why the service cannot change the cluster's node count, or ``None`` if it can."""
        ...

    def machine_usage(self, info: ClusterInfo) -> dict[str, dict[str, Any]] | None:
        """The usage of each machine of the cluster, by machine id (``{}`` if they cannot be
        asked now); ``None`` where the machines are the service's own host, whose usage the
        dashboard samples itself."""
        ...

    def leader_pid(self, launch: LaunchHandle) -> int | None:
        """The pid on the service's host that leads an attempt's processes, or ``None`` if
        they run elsewhere."""
        ...


class LocalBackend:
    """The local backend: nodes are process slots on the service's host.

    Args:
        executor: runs the attempts (the local executor; tests give their own).
    """

    kind = Backend.LOCAL

    def __init__(self, executor: Executor[Any]):
        self.executor = executor

    def attach(self, spec: ClusterSpec) -> ClusterSpec:
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
