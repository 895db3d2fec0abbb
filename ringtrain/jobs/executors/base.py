"""The Executor protocol: how the scheduler starts, watches and stops one attempt of a job.

An executor returns a JSON-able *launch handle* from :meth:`Executor.start`; the scheduler stores
it with the job, so that a restarted server can hand it back to :meth:`Executor.poll` and find the
attempt again. The local executor's handle holds pids; a Ray executor's would hold a placement
group and job id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ringtrain.jobs.models import JobInfo, NodeInfo

Phase = Literal["preparing", "running", "exited", "lost"]


@dataclass(frozen=True)
class Observation:
    """What an executor saw of an attempt.

    ``exited`` carries the exit code (0 = success); ``lost`` means its processes are gone
    without having reported one (killed, or died while no server watched).
    """

    phase: Phase
    exit_code: int | None = None
    message: str = ""


class Executor(Protocol):
    """Runs attempts of jobs on cluster nodes."""

    def start(self, job: JobInfo, nodes: list[NodeInfo]) -> dict[str, Any]:
        """Start the job's current attempt on ``nodes`` (preparation, then the workers).

        Returns:
            The launch handle to store with the job.

        Raises:
            OSError: the attempt could not be started.
        """
        ...

    def poll(self, job: JobInfo, launch: dict[str, Any] | None) -> Observation:
        """Observe an attempt; ``launch`` is ``None`` if the service stopped before storing it."""
        ...

    def stop(self, job: JobInfo, launch: dict[str, Any] | None, force: bool) -> None:
        """Ask the attempt's processes to stop (``force``: kill them now)."""
        ...

    def release(self, job: JobInfo, launch: dict[str, Any] | None) -> None:
        """After an attempt ended: kill whatever it left behind and forget it."""
        ...
