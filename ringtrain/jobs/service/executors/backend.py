"""The ClusterBackend protocol: what one backend does for the service besides running attempts.

Each backend the service runs (found by name in :mod:`.registry`, built by its plug-in) has one:
it owns the backend's executor, checks and attaches a new cluster, describes a cluster's
machines, says which job specs its clusters cannot run, and whether their node count is the
service's to change. The service asks the backend of a cluster and never tests which backend it
is.
"""

from __future__ import annotations

from typing import Any, Protocol

from ringtrain.jobs.models import ClusterInfo, ClusterSpec, JobSpec
from ringtrain.jobs.service.executors.base import Executor, LaunchHandle


class ClusterBackend(Protocol):
    """One backend of the service: its executor and what its clusters need beyond it."""

    @property
    def name(self) -> str:
        """The backend's name, as clusters name it (``ClusterSpec.backend``) and as the tag of
        its launch handles."""
        ...

    @property
    def executor(self) -> Executor[Any]:
        """Runs the attempts of jobs on this backend's clusters."""
        ...

    def attach(self, spec: ClusterSpec) -> ClusterSpec:
        """Check a new cluster's spec and make or reach its machines, before it is recorded;
        the spec to record (an address resolved, ``nodes`` 0 turned into a count).

        Raises:
            SpecError: the spec does not suit the backend (an address it needs or refuses).
            InvalidRequestError: the machines cannot be reached or started.
        """
        ...

    def describe(self, info: ClusterInfo) -> ClusterInfo:
        """``info`` with what the backend knows of the cluster's machines (``machines``; never
        raises: the record stands when the machines cannot be asked)."""
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
