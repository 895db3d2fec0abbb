"""The service's executor: each attempt goes to the executor of its backend.

The scheduler sees one :class:`~ringtrain.jobs.service.executors.base.Executor`,
:class:`Backends`. It starts an attempt on the executor of the job's cluster's backend and tags the
handle with that backend (:class:`TaggedHandle`); the tag is stored with the handle, so a stored
attempt goes back to the executor that started it, whatever its handle's fields.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ringtrain.jobs.errors import InvalidRequestError, RecordError
from ringtrain.jobs.models import JobInfo, NodeInfo
from ringtrain.jobs.service.executors.backend import ClusterBackend
from ringtrain.jobs.service.executors.base import Executor, LaunchHandle, Observation

#: The key of a stored handle that names its backend (the other keys are the executor's own).
TAG = "backend"


@dataclass(frozen=True)
class TaggedHandle:
    """An executor's launch handle and the backend whose executor made it."""

    backend: str
    handle: LaunchHandle

    def to_json(self) -> dict[str, Any]:
        """The handle's JSON object with the tag beside its fields."""
        return {**self.handle.to_json(), TAG: self.backend}


class Backends:
    """The backends a service runs (ValueError for two of one name), and the executor that
    routes each call to one of them; ``backend_of`` gives a cluster's backend by its name."""

    def __init__(self, backends: Iterable[ClusterBackend], backend_of: Callable[[str], str]):
        self._by_name: dict[str, ClusterBackend] = {}
        for backend in backends:
            if backend.name in self._by_name:
                raise ValueError(f"two {backend.name} backends")
            self._by_name[backend.name] = backend
        self.backend_of = backend_of

    def find(self, name: str) -> ClusterBackend | None:
        """The backend of that name, if this service runs it."""
        return self._by_name.get(name)

    def get(self, name: str) -> ClusterBackend:
        """The backend of that name. Raises InvalidRequestError if this service does not run it."""
        backend = self._by_name.get(name)
        if backend is None:
            raise InvalidRequestError(f"this service runs no {name} backend (it runs "
                                      f"{', '.join(self._by_name) or 'none'})")
        return backend

    # -- the Executor protocol ---------------------------------------------------------------

    def _executor(self, name: str) -> Executor[Any]:
        backend = self._by_name.get(name)
        if backend is None:
            raise OSError(f"this service runs no {name} backend")
        return backend.executor

    def _for(self, job: JobInfo, launch: TaggedHandle | None) -> tuple[Executor[Any], Any]:
        """The executor of an attempt (by its handle's tag; without a handle, by its cluster's
        backend) and the executor's own handle."""
        if launch is None:
            return self._executor(self.backend_of(job.cluster)), None
        return self._executor(launch.backend), launch.handle

    def start(self, job: JobInfo, nodes: list[NodeInfo]) -> TaggedHandle:
        name = self.backend_of(job.cluster)
        return TaggedHandle(name, self._executor(name).start(job, nodes))

    def load_handle(self, data: dict[str, Any]) -> TaggedHandle:
        if not isinstance(data, dict) or not isinstance(data.get(TAG), str):
            raise RecordError(f"the launch handle stored with the job names no backend: {data!r}")
        name = data[TAG]
        backend = self._by_name.get(name)
        if backend is None:
            raise RecordError(f"the job's launch handle is one of the {name!r} backend, which "
                              "this service does not run")
        fields = {k: v for k, v in data.items() if k != TAG}
        return TaggedHandle(name, backend.executor.load_handle(fields))

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
