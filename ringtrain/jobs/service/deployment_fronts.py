"""The fronts the job service runs: one URL for each deployment of several replicas.

Each front is :func:`ringtrain.jobs.service.front_proxy.create_front` served by uvicorn in a
thread of the service, on a port of its own on 127.0.0.1 (no token: like the replicas, it answers on
loopback only). :meth:`Fronts.sync` (every second from the server, and at once when a deployment is
made) starts one for every live deployment of several replicas that has none, or whose front
died, and stops those whose deployment is stopping or over. A front's URL goes into its
deployment's record, so that a restarted service binds the same port again (another one, then
recorded, where that port was taken meanwhile); a port asked for at deploy time is recorded the
same way (:meth:`Fronts.place`). Each front has the connection limits of the service's own
server (:mod:`ringtrain.web.connection_limits`), sized for its share of the process's
descriptors: :data:`FRONT_SHARE`.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ringtrain.jobs.errors import ConflictError, JobsError
from ringtrain.jobs.models import JobInfo, JobState
from ringtrain.jobs.service.front_proxy import Backends, create_front
from ringtrain.jobs.service.store import Store
from ringtrain.web.connection_limits import Budget, ConnectionLimits, limited_server
from ringtrain.web.exposure import bind_socket, client_url

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger(__name__)

#: Where every front listens.
HOST = "127.0.0.1"
#: Seconds a stopped front lets requests in flight finish.
DRAIN_S = 5.0
#: The part of the process's open-file limit each front's connections may hold: the fronts live
#: in the job service's process, whose own server keeps a quarter of the limit free.
FRONT_SHARE = 16
#: The states of a deployment that has a front.
_LIVE = (JobState.STAGING, JobState.QUEUED, JobState.PREPARING, JobState.RUNNING,
         JobState.UPLOADING)


@dataclass
class _Front:
    """One running front."""

    url: str
    backends: Backends
    server: uvicorn.Server
    thread: threading.Thread


def wants_front(job: JobInfo) -> bool:
    """Whether ``job`` is a deployment that should have a front now: several replicas, neither
    stopping nor over."""
    return job.serves is not None and job.spec.node_count > 1 and job.state in _LIVE


class Fronts:
    """The service's fronts, by deployment id (thread-safe).

    Args:
        replica_urls: the URLs a deployment's replicas announced so far.
        health_every_s: seconds between two health checks of a replica.
        refresh_s: seconds between two readings of the replicas' URLs.
    """

    def __init__(self, store: Store, replica_urls: Callable[[JobInfo], list[str]], *,
                 health_every_s: float = 1.0, refresh_s: float = 1.0):
        self.store = store
        self.replica_urls = replica_urls
        self.health_every_s = health_every_s
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._running: dict[str, _Front] = {}

    def sync(self) -> None:
        """Start the fronts that should run and do not, stop those that should not."""
        with self._lock:  # listed under the lock: a pass never acts on an older list
            wanted = {j.id: j for j in self.store.list_jobs(states=_LIVE) if wants_front(j)}
            for job_id in [i for i, f in self._running.items()
                           if i not in wanted or not f.thread.is_alive()]:
                self._stop(job_id)
            for job_id, job in wanted.items():
                if job_id not in self._running:
                    try:
                        self._start(job)
                    except OSError as e:  # no port at all: say so, and try again next time
                        log.error("front of deployment %s did not start: %s", job_id, e)

    def url(self, job_id: str) -> str | None:
        """The URL of ``job_id``'s front, if it runs."""
        with self._lock:
            front = self._running.get(job_id)
        return front.url if front is not None else None

    def follow(self, job_id: str, serving: list[str]) -> list[str]:
        """Give ``job_id``'s front the replicas that serve now, as the caller just read them,
        and return those it took out of its turns (none without a front).

        The deployment's state and health are read from the same records the front follows:
        whoever reads them passes them on, so that a replica said to be healthy is one the
        front sends requests to, not one it learns of at its next refresh (a client told
        ``ready`` then had every request go to the replica the front knew)."""
        with self._lock:
            front = self._running.get(job_id)
        if front is None:
            return []
        front.backends.set_urls(serving)
        return front.backends.out_urls()

    def place(self, job_id: str, port: int) -> None:
        """Put ``job_id``'s front on ``port``: recorded, and moved there if a pass of
        :meth:`sync` started it elsewhere meanwhile (under the lock: no pass records another
        port after this one)."""
        with self._lock:
            self.store.set_front(job_id, front_url(port))
            front = self._running.get(job_id)
            if front is not None and front.url != front_url(port):
                self._stop(job_id)

    def close(self) -> None:
        """Stop every front (the service is stopping; a restarted one starts them again)."""
        with self._lock:
            for job_id in list(self._running):
                self._stop(job_id)

    def run(self, stop: threading.Event, every_s: float = 1.0) -> None:
        """:meth:`sync` every ``every_s`` until ``stop`` is set, then :meth:`close`."""
        try:
            while not stop.is_set():
                try:
                    self.sync()
                except Exception:  # one bad pass must not end the fronts
                    log.exception("syncing the deployments' fronts failed")
                stop.wait(every_s)
        finally:
            self.close()

    def _start(self, job: JobInfo) -> None:
        sock = _bind(job)
        url = front_url(sock.getsockname()[1])
        job_id = job.id

        def refresh() -> list[str]:
            return self.replica_urls(self.store.get_job(job_id))

        backends = Backends(self.replica_urls(job))
        app = create_front(backends, refresh=refresh, health_every_s=self.health_every_s,
                           refresh_s=self.refresh_s)
        server = limited_server(app, _front_budget(), log_level="warning",
                                timeout_graceful_shutdown=int(DRAIN_S))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                                  name=f"front-{job_id}", daemon=True)
        thread.start()
        self._running[job_id] = _Front(url, backends, server, thread)
        if url != job.front:
            try:
                self.store.set_front(job_id, url)
            except JobsError:  # deleted meanwhile: the next sync stops the front
                pass
        log.info("front of deployment %s at %s", job_id, url)

    def _stop(self, job_id: str) -> None:
        front = self._running.pop(job_id)
        front.server.should_exit = True
        front.thread.join(DRAIN_S + 5)
        if front.thread.is_alive():
            log.warning("front of deployment %s did not stop within %g s", job_id, DRAIN_S + 5)


def front_url(port: int) -> str:
    """The URL of a front on ``port``."""
    return client_url(HOST, port)


def check_port(port: int) -> None:
    """Raise ConflictError, naming ``port``, if a front could not listen on it now."""
    try:
        _listen(bind_socket(HOST, port)).close()
    except OSError as e:
        raise ConflictError(f"the front cannot listen on port {port} of {HOST}: {e.strerror}; "
                            "choose another (`ringtrain job deploy --port`), or none for a "
                            "free one") from None


def _front_budget() -> Budget:
    """One front's connection limits: the service's, on a :data:`FRONT_SHARE` th of the
    process's descriptors."""
    whole = ConnectionLimits().resolved()
    return ConnectionLimits(max_connections=max(16, whole.max_connections // FRONT_SHARE)
                            ).resolved()


def _bind(job: JobInfo) -> socket.socket:
    """A listening socket for ``job``'s front: on the port of its recorded URL if there is
    one and it is free, else on a free one (OSError if none could be bound)."""
    port = urlsplit(job.front).port if job.front else None
    if port:
        try:
            return _listen(bind_socket(HOST, port))
        except OSError as e:
            log.warning("front of deployment %s: its port %d is taken (%s); it moves to another",
                        job.id, port, e)
    return _listen(bind_socket(HOST, 0))


def _listen(sock: socket.socket) -> socket.socket:
    # Listening before the server's thread runs: a client that has the URL already waits in
    # the backlog instead of being refused.
    try:
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock

