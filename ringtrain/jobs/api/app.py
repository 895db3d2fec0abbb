"""The REST API: one FastAPI app over a :class:`~ringtrain.jobs.service.JobService`.

Errors of the service become JSON ``{"detail", "errors"}`` with the status each error class
names (404 unknown id, 409 wrong state, 422 invalid spec or malformed id, 400 bad path, 413 body
too large). With a token, every request (``/openapi.json`` and ``/docs`` included) must name an
allowed Host and carry ``Authorization: Bearer <token>``, or the dashboard's cookie
(:mod:`ringtrain.jobs.api.guard`). The dashboard, its event stream and ``/metrics`` are added by
:mod:`ringtrain.jobs.api.dashboard`.

Routes are plain functions, which FastAPI runs in its thread pool, and the log stream reads in
worker threads too; a folder's archive is made by a process of its own
(:mod:`ringtrain.jobs.archive_process`). What does run on the event loop, decoding and
validating a body, is bounded by :class:`~ringtrain.jobs.api.limits.BodyLimit` and linear, so no
request stalls the others.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator, Callable, Collection, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Annotated, Any, BinaryIO

from fastapi import APIRouter, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ringtrain import __version__
from ringtrain.jobs.api.dashboard import add_dashboard_routes
from ringtrain.jobs.api.guard import RequestGuard
from ringtrain.jobs.api.limits import BodyLimit
from ringtrain.jobs.api.logs import CHUNK, check_log, follow_file
from ringtrain.jobs.api.schemas import (
    API_PREFIX,
    IDEMPOTENCY_KEY_PATTERN,
    IDEMPOTENCY_KEY_RULE,
    DeployRequest,
    ErrorResponse,
    Health,
    ResizeRequest,
    SubmitRequest,
)
from ringtrain.jobs.archive_process import ArchiveProducers
from ringtrain.jobs.deployments import Deployments
from ringtrain.jobs.errors import BusyError, JobsError, NotFoundError, SpecError, brief
from ringtrain.jobs.models import ClusterInfo, ClusterSpec, JobInfo, JobState
from ringtrain.jobs.models.deployment import DeploymentInfo
from ringtrain.jobs.models.ids import JOB_ID_PATTERN, NAME_PATTERN
from ringtrain.jobs.models.spec import MAX_ERRORS, MAX_PATH_BYTES, field_errors
from ringtrain.jobs.monitor.service_metrics import LatencyMiddleware, ServiceMetrics
from ringtrain.jobs.paging import DEFAULT_PAGE, MAX_PAGE, FilePage
from ringtrain.jobs.service import JobService
from ringtrain.web.offline_docs import add_offline_docs

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 404, 409, 413, 422, 503)}

ClusterName = Annotated[str, Path(pattern=NAME_PATTERN, description="A cluster's name.")]
JobIdPath = Annotated[str, Path(pattern=JOB_ID_PATTERN, description="A job's id.")]
NameFilter = Annotated[str | None, Query(pattern=NAME_PATTERN)]
FilePath = Annotated[str, Query(max_length=MAX_PATH_BYTES,
                                description="Relative to the job's folder, e.g. outputs/model.")]
CursorQuery = Annotated[str | None, Query(
    max_length=MAX_PATH_BYTES,
    description="Go on after this path (relative to the job's folder): a listing's next_cursor, "
                "or the last file of an archive received whole.")]


def create_app(service: JobService, token: str | None = None, home: str = "",
               lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]] | None = None,
               allowed_hosts: Collection[str] | None = None,
               deployments: Deployments | None = None) -> FastAPI:
    """Build the app.

    Args:
        service: the operations behind the routes.
        token: the bearer token every request must carry. The server always passes one;
            ``None`` is for an app called in-process only, which nothing else can reach.
        home: the service home, reported by ``/v1/health``.
        lifespan: runs around serving (the server starts its scheduler loop there).
        allowed_hosts: the Host header values to answer (see :func:`ringtrain.jobs.auth.
            allowed_hosts`); ``None`` answers any.
        deployments: the deployments' operations (the server's runs their fronts); default:
            ones of ``service`` without fronts.
    """
    app = FastAPI(title="ringtrain job service", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None,  # /docs: offline (add_offline_docs)
                  description="Clusters, training jobs, their logs and output files, and "
                              "deployments of their models.")
    metrics = ServiceMetrics(service)
    producers = ArchiveProducers(str(service.share.root))
    add_offline_docs(app, "ringtrain job service")
    # The guard is added last so that it runs first: no body is read for a caller without the token.
    app.add_middleware(BodyLimit)
    app.add_middleware(LatencyMiddleware, metrics=metrics)
    if token is not None:
        app.add_middleware(RequestGuard, token=token, allowed_hosts=allowed_hosts)

    @app.exception_handler(JobsError)
    async def _jobs_error(_request: Request, e: JobsError) -> JSONResponse:
        body = ErrorResponse(detail=str(e), errors=getattr(e, "errors", []))
        headers = {"Retry-After": str(e.retry_after_s)} if isinstance(e, BusyError) else None
        return JSONResponse(body.model_dump(), status_code=e.http_status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, e: RequestValidationError) -> JSONResponse:
        details = list(e.errors())
        # Only the errors shown are rewritten: a body can carry a great many (unknown fields).
        shown = [{**err, "loc": _field(err["loc"])} for err in details[:MAX_ERRORS]]
        errors = field_errors(shown + details[MAX_ERRORS:])
        lines = "\n".join(f"  {x['field']}: {x['message']}" for x in errors)
        body = ErrorResponse(detail=f"invalid request:\n{lines}", errors=errors)
        return JSONResponse(body.model_dump(), status_code=422)

    r = APIRouter(prefix=API_PREFIX, responses=_ERRORS)

    @r.get("/health")
    async def health() -> Health:
        # On the event loop, not the thread pool: it answers at once however busy that is.
        return Health(pid=os.getpid(), home=home, version=__version__)

    @r.post("/clusters", status_code=201)
    def create_cluster(spec: ClusterSpec) -> ClusterInfo:
        return service.create_cluster(spec)

    @r.get("/clusters")
    def list_clusters() -> list[ClusterInfo]:
        return service.list_clusters()

    @r.get("/clusters/{name}")
    def get_cluster(name: ClusterName) -> ClusterInfo:
        return service.get_cluster(name)

    @r.patch("/clusters/{name}")
    def resize_cluster(name: ClusterName, body: ResizeRequest) -> ClusterInfo:
        return service.resize_cluster(name, body.nodes, body.slots)

    @r.delete("/clusters/{name}")
    def delete_cluster(name: ClusterName) -> ClusterInfo:
        return service.delete_cluster(name)

    @r.post("/jobs", status_code=201)
    def submit(body: SubmitRequest, idempotency_key: str | None = Header(
            None, max_length=1024,
            description="The client's name for this submission: a retry with the same key "
                        f"returns the same job (409 if its spec differs); "
                        f"{IDEMPOTENCY_KEY_RULE}.")) -> JobInfo:
        return service.submit(body.cluster, body.spec, _checked_key(idempotency_key))

    @r.get("/jobs")
    def list_jobs(experiment: NameFilter = None, cluster: NameFilter = None,
                  state: JobState | None = None,
                  idempotency_key: str | None = Query(
                      None, max_length=1024,
                      description="Only the job submitted with this Idempotency-Key.")
                  ) -> list[JobInfo]:
        key = _checked_key(idempotency_key)
        if key is not None:
            job = service.store.find_job(key)
            return [] if job is None else [job]
        return service.list_jobs(experiment, cluster, state)

    @r.get("/jobs/{job_id}")
    def get_job(job_id: JobIdPath) -> JobInfo:
        return service.get_job(job_id)

    @r.post("/jobs/{job_id}/terminate")
    def terminate(job_id: JobIdPath) -> JobInfo:
        return service.terminate(job_id)

    @r.delete("/jobs/{job_id}", status_code=204)
    def delete_job(job_id: JobIdPath) -> None:
        service.delete_job(job_id)

    @r.get("/jobs/{job_id}/files")
    def list_files(job_id: JobIdPath, path: FilePath = "",
                   limit: int = Query(DEFAULT_PAGE, description=f"Files per page, 1..{MAX_PAGE}."),
                   cursor: CursorQuery = None) -> FilePage:
        return service.list_files(job_id, path, limit, cursor)

    @r.get("/jobs/{job_id}/archive", response_class=StreamingResponse,
           responses={200: {"content": {"application/x-tar": {}}}})
    async def archive(job_id: JobIdPath, path: FilePath = "", after: CursorQuery = None
                      ) -> StreamingResponse:
        # The path is checked (400/404) before the 200 is sent; the archive is made while it
        # is sent, by a process of its own.
        await run_in_threadpool(service.check_archive, job_id, path, after)
        return StreamingResponse(await producers.start(job_id, path, after),
                                 media_type="application/x-tar")

    @r.get("/jobs/{job_id}/download", response_class=StreamingResponse,
           responses={200: {"content": {"application/octet-stream": {}}}})
    def download(job_id: JobIdPath, path: FilePath) -> StreamingResponse:
        # The descriptor opened (without following links) is the one served.
        f = service.open_file(job_id, path)
        return StreamingResponse(_read(f, os.fstat(f.fileno()).st_size),
                                 media_type="application/octet-stream")

    @r.get("/jobs/{job_id}/logs", response_class=StreamingResponse,
           responses={200: {"content": {"text/plain": {}}}})
    def logs(job_id: JobIdPath, rank: int = 0, stream: str = "stdout",
             follow: bool = Query(False, description="Stream until the job ends."),
             offset: int = Query(0, description="Start at this byte (to resume); at most the "
                                                "log's size.")
             ) -> StreamingResponse:
        relpath = service.log_path(job_id, rank, stream)
        folder = service.share.job_dir(job_id)
        # A link, pipe or bad offset: 400 before streaming.
        offset = check_log(folder, relpath, offset, follow)

        def done() -> bool:
            try:
                return not follow or service.log_ended(job_id, stream)
            except NotFoundError:  # deleted while followed
                return True

        body: AsyncIterator[bytes] = follow_file(folder, relpath, done, offset)
        return StreamingResponse(body, media_type="text/plain; charset=utf-8")

    deployments = deployments or Deployments(service)

    @r.post("/jobs/{job_id}/deploy", status_code=201)
    def deploy(job_id: JobIdPath, body: DeployRequest) -> DeploymentInfo:
        return deployments.deploy(job_id, body.replicas, body.cluster)

    @r.get("/deployments")
    def list_deployments() -> list[DeploymentInfo]:
        return deployments.list()

    @r.get("/deployments/{deployment_id}")
    def get_deployment(deployment_id: JobIdPath) -> DeploymentInfo:
        return deployments.get(deployment_id)

    @r.post("/deployments/{deployment_id}/stop")
    def stop_deployment(deployment_id: JobIdPath) -> DeploymentInfo:
        return deployments.stop(deployment_id)

    app.include_router(r)
    add_dashboard_routes(app, service, metrics, deployments)
    return app


def _checked_key(key: str | None) -> str | None:
    """An Idempotency-Key as sent, if it follows the rule.

    Raises:
        SpecError: it does not (422, naming the rule).
    """
    if key is not None and not re.fullmatch(IDEMPOTENCY_KEY_PATTERN, key):
        raise SpecError([{"field": "Idempotency-Key",
                          "message": f"must be {IDEMPOTENCY_KEY_RULE} (got {brief(key)})"}],
                        "request")
    return key


def _read(f: BinaryIO, size: int) -> Iterator[bytes]:
    """The first ``size`` bytes of ``f`` (its size when opened), then close it."""
    with f:
        while size > 0 and (chunk := f.read(min(CHUNK, size))):
            size -= len(chunk)
            yield chunk


def _field(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """A request error's location as users name the field (``spec.outputs.3`` → ``outputs.3``)."""
    names = [p for p in loc if p not in ("body", "query", "path", "header")]
    return tuple(names[1:] if names[:1] == ["spec"] else names)
