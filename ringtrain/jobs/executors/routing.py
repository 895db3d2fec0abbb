"""The service's executor: each attempt goes to the executor of its backend.

The scheduler sees one :class:`~ringtrain.jobs.executors.base.Executor`, :class:`Backends`. It
starts an attempt on the executor of the job's cluster's backend and tags the handle with that
backend (:class:`TaggedHandle`); the tag is stored with the handle, so a stored attempt goes
back to the executor that started it, whatever its handle's fields.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ringtrain.jobs.errors import InvalidRequestError, RecordError
from ringtrain.jobs.executors.backend import ClusterBackend
from ringtrain.jobs.executors.base import Executor, LaunchHandle, Observation
from ringtrain.jobs.models import Backend, JobInfo, NodeInfo

#: The key of a stored handle that names its backend (the other keys are the executor's own).
TAG = "backend"


@dataclass(frozen=True)
class TaggedHandle:
    """An executor's launch handle and the backend whose executor made it."""

    backend: Backend
    handle: LaunchHandle

    def to_json(self) -> dict[str, Any]:
        """The handle's JSON object with the tag beside its fields."""
        return {**self.handle.to_json(), TAG: self.backend.value}


class Backends:
    """The backends a service runs, and the executor that routes each call to one of them.

    Args:
        backends: one per backend kind.
        backend_of: the backend of a cluster, by cluster name.

    Raises:
        ValueError: two backends of one kind.
    """

    def __init__(self, backends: Iterable[ClusterBackend], backend_of: Callable[[str], Backend]):
        self._by_kind: dict[Backend, ClusterBackend] = {}
        for backend in backends:
            if backend.kind in self._by_kind:
                raise ValueError(f"two {backend.kind.value} backends")
            self._by_kind[backend.kind] = backend
        self.backend_of = backend_of

    def find(self, kind: Backend) -> ClusterBackend | None:
        """The backend of that kind, if this service runs it."""
        return self._by_kind.get(kind)

    def get(self, kind: Backend) -> ClusterBackend:
        """The backend of that kind.

        Raises:
            InvalidRequestError: this service does not run it.
        """
        backend = self._by_kind.get(kind)
        if backend is None:
            raise InvalidRequestError(f"this service runs no {kind.value} backend")
        return backend

    # -- the Executor protocol ---------------------------------------------------------------

    def _executor(self, kind: Backend) -> Executor[Any]:
        backend = self._by_kind.get(kind)
        if backend is None:
            raise OSError(f"this service runs no {kind.value} backend")
        return backend.executor

    def _for(self, job: JobInfo, launch: TaggedHandle | None) -> tuple[Executor[Any], Any]:
        """The executor of an attempt (by its handle's tag; without a handle, by its cluster's
        backend) and the executor's own handle."""
        if launch is None:
            return self._executor(self.backend_of(job.cluster)), None
        return self._executor(launch.backend), launch.handle

    def start(self, job: JobInfo, nodes: list[NodeInfo]) -> TaggedHandle:
        kind = self.backend_of(job.cluster)
        return TaggedHandle(kind, self._executor(kind).start(job, nodes))

    def load_handle(self, data: dict[str, Any]) -> TaggedHandle:
        if not isinstance(data, dict) or not isinstance(data.get(TAG), str):
            raise RecordError(f"the launch handle stored with the job names no backend: {data!r}")
        try:
            kind = Backend(data[TAG])
        except ValueError:
            raise RecordError(f"the launch handle stored with the job names the backend "
                              f"{data[TAG]!r}, which ringtrain does not know") from None
        backend = self._by_kind.get(kind)
        if backend is None:
            raise RecordError(f"the job's launch handle is one of the {kind.value} backend, "
                              "which this service does not run")
        fields = {k: v for k, v in data.items() if k != TAG}
        return TaggedHandle(kind, backend.executor.load_handle(fields))

    def poll(self, job: JobInfo, launch: TaggedHandle | None) -> Observation:
        executor, handle = self._for(job, launch)
        return executor.poll(job, handle)

    def stop(self, job: JobInfo, launch: TaggedHandle | None, force: bool) -> None:
        executor, handle = self._for(job, launch)
        executor.stop(job, handle, force)

    def set_nodes(self, job: JobInfo, launch: TaggedHandle | None, nodes: list[int]) -> None:
        executor, handle = self._for(job, launch)
        executor.set_nodes(job, handle, nodes)

    def release(self, job: JobInfo, launch: TaggedHandle | None) -> None:
        executor, handle = self._for(job, launch)
        executor.release(job, handle)
