"""The REST API: one FastAPI app over a :class:`~ringtrain.jobs.service.job_service.JobService`.

Errors of the service become JSON ``{"detail", "errors"}`` with the status each error class
names (404 unknown id, 409 wrong state, 422 invalid spec or malformed id, 400 bad path, 403 out
of the token's scope, 413 body too large). With a token, every request (``/openapi.json`` and
``/docs`` included) must name an allowed Host and carry ``Authorization: Bearer <token>``, or the
dashboard's cookie (:mod:`ringtrain.jobs.service.api.guard`): the admin token, or a scoped one
held to its scope (:mod:`ringtrain.jobs.service.api.scope_guard`). The routes come in routers by
concern: the records (:mod:`.job_routes`), what a job left (:mod:`.file_routes`), the scoped
tokens (:mod:`.token_routes`) and the dashboard with its event stream and ``/metrics``
(:mod:`.dashboard`).

Routes are plain functions, which FastAPI runs in its thread pool, and the log stream reads in
worker threads too; a folder's archive is made by a process of its own
(:mod:`ringtrain.jobs.service.archive_process`). What does run on the event loop, decoding and
validating a body, is bounded by :class:`~ringtrain.jobs.service.api.limits.BodyLimit` and
linear, so no request stalls the others.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from contextlib import AbstractAsyncContextManager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from ringtrain import __version__
from ringtrain.jobs.disk_space import disk_full_error, is_disk_full
from ringtrain.jobs.errors import BusyError, JobsError
from ringtrain.jobs.models.schemas import API_PREFIX, ErrorResponse, Health
from ringtrain.jobs.models.spec import MAX_ERRORS, field_errors
from ringtrain.jobs.service.api.dashboard import add_dashboard_routes
from ringtrain.jobs.service.api.file_routes import file_routes
from ringtrain.jobs.service.api.guard import RequestGuard
from ringtrain.jobs.service.api.job_routes import cluster_routes, deployment_routes, job_routes
from ringtrain.jobs.service.api.limits import BodyLimit
from ringtrain.jobs.service.api.login_codes import LoginCodes
from ringtrain.jobs.service.api.metrics import ServiceMetrics
from ringtrain.jobs.service.api.params import ERRORS
from ringtrain.jobs.service.api.scope_guard import ScopeGuard
from ringtrain.jobs.service.api.token_routes import token_routes
from ringtrain.jobs.service.api.upload_routes import upload_routes
from ringtrain.jobs.service.archive_process import ArchiveProducers
from ringtrain.jobs.service.deployments import Deployments
from ringtrain.jobs.service.job_service import JobService
from ringtrain.jobs.service.tokens import Tokens
from ringtrain.web.offline_docs import add_offline_docs
from ringtrain.web.request_timing import RequestTiming
from ringtrain.web.transport_guard import PlainHttpGuard


def create_app(service: JobService, token: str | None = None, home: str = "",
               lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]] | None = None,
               allowed_hosts: Collection[str] | None = None,
               deployments: Deployments | None = None,
               refuse_plain_http_from_network: bool = False) -> FastAPI:
    """Build the app.

    Args:
        token: the admin token: it, or a scoped token the service issued
            (:mod:`ringtrain.jobs.service.tokens`), must come with every request. The server
            always passes one; ``None`` is for an app called in-process only, which nothing
            else can reach.
        home: the service home, reported by ``/v1/health``.
        lifespan: runs around serving (the server starts its scheduler loop there).
        allowed_hosts: the Host header values to answer (see
            :func:`ringtrain.jobs.service.api.auth.allowed_hosts`); ``None`` answers any.
        deployments: the deployments' operations (the server's runs their fronts); default:
            ones of ``service`` without fronts.
        refuse_plain_http_from_network: answer 403 to requests from other machines over plain
            HTTP, before their token is looked at (:mod:`ringtrain.web.transport_guard`); the
            server sets it unless started with ``--insecure``.
    """
    app = FastAPI(title="ringtrain job service", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None,  # /docs: offline (add_offline_docs)
                  description="Clusters, training jobs, their logs and output files, and "
                              "deployments of their models.")
    metrics = ServiceMetrics(service)
    tokens = Tokens(service.store.tokens, service.clock)
    login_codes = LoginCodes()
    add_offline_docs(app, "ringtrain job service")
    # The guard is added last so that it runs first: no body is read for a caller without the token.
    app.add_middleware(BodyLimit)
    app.add_middleware(RequestTiming, observe=metrics.observe_request)
    if token is not None:
        # The scope check runs right after the guard that found the caller.
        app.add_middleware(ScopeGuard, store=service.store, tokens=tokens)
        app.add_middleware(RequestGuard, token=token, allowed_hosts=allowed_hosts, tokens=tokens,
                           login_codes=login_codes)
    if refuse_plain_http_from_network:  # outermost: a token sent in the clear is never read
        app.add_middleware(PlainHttpGuard, remedy="start the server with --tls (clients then "
                                                  "pin its certificate: `ringtrain login "
                                                  "https://HOST:PORT`), or with --insecure on a "
                                                  "network you trust")
    _add_error_handlers(app, service.share.root)

    @app.get(API_PREFIX + "/health", responses=ERRORS)
    async def health() -> Health:
        # On the event loop, not the thread pool: it answers at once however busy that is
        # (the disk's free space is the scheduler loop's last measure, not a look at the disk).
        return Health(pid=os.getpid(), home=home, version=__version__,
                      disk=service.disk.status())

    deployments = deployments or Deployments(service)
    for router in (cluster_routes(service), job_routes(service),
                   file_routes(service, ArchiveProducers(str(service.share.root))),
                   deployment_routes(deployments), token_routes(tokens),
                   upload_routes(service.uploads)):
        app.include_router(router)
    add_dashboard_routes(app, service, metrics, deployments, login_codes)
    return app


def _add_error_handlers(app: FastAPI, share_root: Path) -> None:
    """Errors of the service and of request validation as ``{"detail", "errors"}``; a full
    disk's ``OSError`` as the service's DiskFullError (naming ``share_root`` when the error
    names no file)."""
    @app.exception_handler(JobsError)
    async def _jobs_error(_request: Request, e: JobsError) -> JSONResponse:
        body = ErrorResponse(detail=str(e), errors=getattr(e, "errors", []))
        headers = {"Retry-After": str(e.retry_after_s)} if isinstance(e, BusyError) else None
        return JSONResponse(body.model_dump(), status_code=e.http_status, headers=headers)

    @app.exception_handler(OSError)
    async def _os_error(request: Request, e: OSError) -> JSONResponse:
        # A write into a job's folder or an upload that found no room is the client's to
        # retry once space is freed (507, naming the disk), not a fault of the service (500).
        if not is_disk_full(e):
            raise e
        where = Path(os.fsdecode(e.filename)).parent if e.filename else share_root
        return await _jobs_error(request, disk_full_error(where))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, e: RequestValidationError) -> JSONResponse:
        details = list(e.errors())
        # Only the errors shown are rewritten: a body can carry a great many (unknown fields).
        shown = [{**err, "loc": _field(err["loc"])} for err in details[:MAX_ERRORS]]
        errors = field_errors(shown + details[MAX_ERRORS:])
        lines = "\n".join(f"  {x['field']}: {x['message']}" for x in errors)
        body = ErrorResponse(detail=f"invalid request:\n{lines}", errors=errors)
        return JSONResponse(body.model_dump(), status_code=422)


def _field(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """A request error's location as users name the field (``spec.outputs.3`` → ``outputs.3``).

    Only the first element says where in the request (``body``, ``query``...): the rest are
    names, and a query parameter may well be called ``path``.
    """
    names = list(loc[1:] if loc and loc[0] in ("body", "query", "path", "header", "cookie")
                 else loc)
    return tuple(names[1:] if names[:1] == ["spec"] else names)
