"""The service's executor: each job goes to the executor of its cluster's backend.

The scheduler and the service see one :class:`~ringtrain.jobs.executors.base.Executor`; this one
hands every call to the local executor or the Ray executor, by the backend of the job's cluster
(for a stored handle, by its fields: a Ray handle names a placement group).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ringtrain.jobs.errors import RecordError
from ringtrain.jobs.executors.base import Executor, LaunchHandle, Observation
from ringtrain.jobs.models import JobInfo, NodeInfo


class BackendExecutor:
    """Routes each call to the executor of the job's backend.

    Args:
        executors: the executor of each backend name (``local``, ``ray``).
        backend_of: the backend of a cluster, by cluster name.
    """

    def __init__(self, executors: dict[str, Executor[Any]], backend_of: Callable[[str], str]):
        self.executors = executors
        self.backend_of = backend_of

    def _for(self, job: JobInfo) -> Executor[Any]:
        backend = self.backend_of(job.cluster)
        try:
            return self.executors[backend]
        except KeyError:
            raise OSError(f"this service runs no {backend} backend") from None

    def start(self, job: JobInfo, nodes: list[NodeInfo]) -> LaunchHandle:
        return self._for(job).start(job, nodes)

    def load_handle(self, data: dict[str, Any]) -> LaunchHandle:
        backend = "ray" if isinstance(data, dict) and "placement_group" in data else "local"
        if backend not in self.executors:
            raise RecordError(f"the job's launch handle is one of the {backend} backend, which "
                              "this service does not run")
        return self.executors[backend].load_handle(data)

    def poll(self, job: JobInfo, launch: LaunchHandle | None) -> Observation:
        return self._for(job).poll(job, launch)

    def stop(self, job: JobInfo, launch: LaunchHandle | None, force: bool) -> None:
        self._for(job).stop(job, launch, force)

    def set_nodes(self, job: JobInfo, launch: LaunchHandle | None, nodes: list[int]) -> None:
        self._for(job).set_nodes(job, launch, nodes)

    def release(self, job: JobInfo, launch: LaunchHandle | None) -> None:
        self._for(job).release(job, launch)
