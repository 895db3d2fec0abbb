"""Serving the job service: ``ringtrain server`` runs the API and the scheduler loop in one process.

One server per home (an flock on ``server.lock``); its address, pid, token and certificate
fingerprint go to ``server.json`` so the CLI finds it. Every request needs the home's token (or
the one given with ``--token``), and must name the server in its Host header
(:mod:`ringtrain.jobs.service.api.auth`). Binding off loopback needs a token given explicitly, the
one remote clients will be handed, and that token must not cross the network in the clear: with
``--tls`` the server speaks HTTPS (:mod:`ringtrain.jobs.service.api.server_cert`); without it,
requests from other machines are refused (:mod:`ringtrain.web.transport_guard`) unless the owner
said ``--insecure``, and binding every interface without either is refused outright.
"""

from __future__ import annotations

import fcntl
import logging
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from fastapi import FastAPI

from ringtrain.errors import ConfigError
from ringtrain.jobs.errors import ConflictError, RecordError
from ringtrain.jobs.home import Home
from ringtrain.jobs.server_info import ServerInfo
from ringtrain.jobs.service.api.auth import allowed_hosts, home_token, is_wildcard
from ringtrain.jobs.service.api.server_cert import CertificateSource
from ringtrain.web.connection_limits import ConnectionLimits, limited_server
from ringtrain.web.exposure import bind_socket, check_bind, client_url, is_loopback

if TYPE_CHECKING:
    from ringtrain.jobs.service.deployments import Deployments
    from ringtrain.jobs.service.job_service import JobService

log = logging.getLogger(__name__)

#: The server process's GIL switch interval (see where it is set).
SWITCH_INTERVAL_S = 0.0005


def check_job_service_bind(host: str, token: str | None, public_host: str | None = None,
                           tls: bool = False, insecure: bool = False) -> None:
    """Refuse (ConfigError) a non-loopback address without a token, and a wildcard one without
    a public name (``public_host``: the name clients use) or without ``tls`` (unless
    ``insecure``: the owner accepts tokens in the clear)."""
    check_bind(host, token, "the job service", "it runs commands on this host")
    if is_wildcard(host) and not public_host:
        raise ConfigError(f"binding the job service to {host} answers on every address of this "
                          "host: pass --public-host NAME, the host name clients put in their URL "
                          "(requests naming another host are refused, against DNS rebinding)")
    if is_wildcard(host) and not (tls or insecure):
        raise ConfigError(f"binding the job service to {host} without TLS would take tokens "
                          "over the network in the clear: pass --tls (a self-signed certificate "
                          "made once in the home, whose fingerprint clients pin with `ringtrain "
                          "login`) or --cert/--key; or --insecure to serve plain HTTP anyway, on "
                          "a network you trust")


def _lock(home: Home) -> IO[str]:
    f = open(home.lock_file, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        try:
            running = ServerInfo.read(home.server_file)
        except RecordError:
            running = None
        where = "" if running is None else f" (pid {running.pid} at {running.url})"
        raise ConflictError(f"a server already runs for {home.root}{where}; "
                            "`ringtrain server stop` stops it") from None
    return f


def serve(home: Home, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
          public_host: str | None = None, options: Mapping[str, Any] | None = None,
          tls: CertificateSource | None = None, insecure: bool = False,
          limits: ConnectionLimits | None = None) -> None:
    """Run the service until SIGTERM/SIGINT. Running jobs keep running after it stops.

    Args:
        port: the port; 0 picks a free one.
        token: the bearer token clients must send (required off loopback); by default the
            home's own (:func:`ringtrain.jobs.service.api.auth.home_token`).
        public_host: the name remote clients use in their URL (required for a wildcard host).
        options: the backends' own flags of ``ringtrain server``, by ``dest``.
        tls: serve HTTPS, with the certificate it names (given files, or the home's
            self-signed one, made on the first such start).
        insecure: answer requests from other machines over plain HTTP too (their token
            crosses the network in the clear); without, they get 403 saying why.
        limits: the request header timeout and the caps on connections (default:
            :class:`~ringtrain.web.connection_limits.ConnectionLimits`' own).

    Raises:
        ConfigError: as :func:`check_job_service_bind`, a certificate that cannot serve, or
            ``limits`` that leave the service too few open files.
        ConflictError: another server already serves this home.
        RecordError: the home's token file is unsafe or damaged.
    """
    # Imported here: `ringtrain server stop|status` and the job runner never load the web stack.
    from ringtrain.jobs.service.api.app import create_app
    from ringtrain.jobs.service.deployments import Deployments

    check_job_service_bind(host, token, public_host, tls is not None, insecure)
    budget = (limits or ConnectionLimits()).resolved()
    home.ensure()
    token = token or home_token(home)
    lock = _lock(home)
    try:  # made under the lock: two servers of one home never make two certificates
        cert = None if tls is None else tls.load(home, (host, public_host or ""))
        sock = bind_socket(host, port)
    except BaseException:
        lock.close()
        raise
    service = _job_service(home, options or {})
    deployments = Deployments(service, fronts=True)
    bound_port = sock.getsockname()[1]
    app = create_app(service, token=token, home=str(home.root),
                     lifespan=_lifespan(service, deployments),
                     allowed_hosts=allowed_hosts(host, bound_port, public_host),
                     deployments=deployments, refuse_plain_http_from_network=not insecure)
    info = ServerInfo(pid=os.getpid(), url=client_url(host, bound_port, tls=cert is not None),
                      host=host, port=bound_port, token=token, home=str(home.root),
                      started_at=time.time(), fingerprint=cert.fingerprint if cert else None)
    info.write(home.server_file)
    log.info("ringtrain job service at %s (home %s)", info.url, home.root)
    if cert is not None:
        log.info("TLS certificate %s%s, fingerprint %s", cert.files.cert,
                 " (self-signed)" if cert.self_signed else "", cert.fingerprint)
    elif not is_loopback(host) and not insecure:
        log.warning("serving plain HTTP on %s: requests from other machines are refused (their "
                    "token would cross the network in the clear); pass --tls to serve them",
                    host)
    try:
        # The event loop shares the GIL with the threads that walk folders and read logs: at
        # Python's default 5 ms interval a health check waits several such slices (300 ms
        # with a million-file download made in a thread, on 2 cores), at 0.5 ms a tenth.
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        # proxy_headers off: a peer's address and scheme are the socket's, never what an
        # X-Forwarded-* header claims (the transport guard decides on them).
        server = limited_server(app, budget, log_level="warning", timeout_graceful_shutdown=2,
                                proxy_headers=False,
                                **(cert.files.uvicorn_options() if cert else {}))
        server.run(sockets=[sock])
    finally:
        try:
            current = ServerInfo.read(home.server_file)
        except RecordError:
            current = None  # not ours to remove
        if current is not None and current.pid == os.getpid():
            home.server_file.unlink(missing_ok=True)
        service.store.close()
        lock.close()


def _job_service(home: Home, options: Mapping[str, Any]) -> JobService:
    """The service of ``home``, with every backend of the registry, refusing new jobs below
    ``--min-free-mb`` of free space on its disks."""
    from ringtrain.jobs.service.disk_guard import DiskGuard
    from ringtrain.jobs.service.executors.registry import BackendContext, create_backends
    from ringtrain.jobs.service.job_service import JobService
    from ringtrain.jobs.service.share import Share
    from ringtrain.jobs.service.storage_plans import DEFAULT_CACHE_GB, StorageSettings
    from ringtrain.jobs.service.store import SQLiteStore
    from ringtrain.storage.secrets import SecretStore
    from ringtrain.storage.transfers import DEFAULT_CONCURRENCY

    disk = DiskGuard([home.root, home.share_root], options.get("min_free_mb"),
                     reserve=home.reserve_file)
    store = SQLiteStore(home.db_path, on_full=disk.on_full)
    share = Share(home.share_root)
    storage = StorageSettings(
        SecretStore(home.secrets_folder), Path(options.get("cache_dir") or home.cache_folder),
        home.plans_folder,
        cache_max_bytes=int(float(options.get("cache_max_gb") or DEFAULT_CACHE_GB) * 1e9),
        concurrency=int(options.get("stage_concurrency") or DEFAULT_CONCURRENCY))

    def context(name: str) -> BackendContext:
        return BackendContext(share, home.root / name,
                              lambda cluster: store.get_cluster(cluster).address or "", storage)

    return JobService(store, share, create_backends(context, options), storage=storage,
                      disk=disk)


def _lifespan(service: JobService, deployments: Deployments
              ) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The scheduler's and the fronts' threads, for as long as the app serves.

    The first tick re-adopts the jobs of a previous server: live runners are watched on, dead
    ones are settled from their status files (or failed / re-queued). The fronts' loop starts
    the fronts of the deployments found again, on their recorded ports.
    """
    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        stop = threading.Event()
        loop = threading.Thread(target=service.run_loop, args=(stop,), name="scheduler",
                                daemon=True)
        fronts = threading.Thread(target=deployments.run_fronts, args=(stop,), name="fronts",
                                  daemon=True)
        loop.start()
        fronts.start()
        try:
            yield
        finally:
            stop.set()
            service.wake.set()
            loop.join(timeout=10)
            fronts.join(timeout=30)

    return lifespan
