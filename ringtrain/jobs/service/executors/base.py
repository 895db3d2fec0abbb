"""The Executor protocol: how the scheduler starts, watches and stops one attempt of a job.

An executor returns a *launch handle* from :meth:`Executor.start`; the scheduler stores its JSON
with the job, so that a restarted server can turn it back into a handle
(:meth:`Executor.load_handle`) and find the attempt again. The local executor's handle holds
pids; the Ray executor's a placement group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ringtrain.jobs.service.executors.phase import Phase

if TYPE_CHECKING:  # the job runner imports this module and stays free of pydantic
    from ringtrain.jobs.models import JobInfo, NodeInfo


@dataclass(frozen=True)
class NodeLoss:
    """A node an elastic attempt lost, and why (the launcher's words for its first failed rank)."""

    node: int
    reason: str


@dataclass(frozen=True)
class Observation:
    """What an executor saw of an attempt.

    ``exited`` carries the exit code (0 = success); ``lost`` means its processes are gone
    without having reported one (killed, or died while no server watched). An elastic attempt
    also reports the nodes of its current world and the nodes it lost (``world`` is ``None``
    before its first world formed, and for fixed attempts).
    """

    phase: Phase
    exit_code: int | None = None
    message: str = ""
    world: tuple[int, ...] | None = None
    lost: tuple[NodeLoss, ...] = ()


class LaunchHandle(Protocol):
    """An executor's record of a started attempt, stored with the job as JSON."""

    def to_json(self) -> dict[str, Any]:
        """The JSON object to store; :meth:`Executor.load_handle` reads it back."""
        ...


H = TypeVar("H", bound=LaunchHandle)


class Executor(Protocol[H]):
    """Runs attempts of jobs on cluster nodes; ``H`` is its launch handle."""

    def start(self, job: JobInfo, nodes: list[NodeInfo]) -> H:
        """Start the job's current attempt on ``nodes`` (preparation, then the workers) and
        return the launch handle to store with the job. Raises OSError if it could not start."""
        ...

    def load_handle(self, data: dict[str, Any]) -> H:
        """The handle whose :meth:`LaunchHandle.to_json` gave ``data``. Raises RecordError if
        ``data`` is not a handle of this executor."""
        ...

    def poll(self, job: JobInfo, launch: H | None) -> Observation:
        """Observe an attempt; ``launch`` is ``None`` if the service stopped before storing it."""
        ...

    def stop(self, job: JobInfo, launch: H | None, force: bool) -> None:
        """Ask the attempt's processes to stop (``force``: kill them now)."""
        ...

    def set_nodes(self, job: JobInfo, launch: H | None, nodes: list[int]) -> None:
        """Offer an elastic attempt these nodes from now on: its workers grow into new ones and
        leave dropped ones at their next commit. Raises OSError if the offer was not recorded."""
        ...

    def release(self, job: JobInfo, launch: H | None) -> None:
        """After an attempt ended: kill whatever it left behind and forget it."""
        ...
