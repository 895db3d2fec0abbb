"""The dashboard's routes: the page and its assets, the event stream, scalars, host usage and
the service's Prometheus metrics (and, from :mod:`ringtrain.jobs.service.api.job_processes`, ranks'
usage and stack dumps and running jobs' progress).

The page is static (shipped in ``ringtrain/jobs/service/api/static``, no build step, nothing from
the network) and fetches everything else from the API with the cookie the guard set. Its
Content-Security-Policy allows scripts, styles and connections to this server only and no
inline script, so even text a job wrote that slipped into the page as markup could not run.

The event stream (``/v1/events``, server-sent events) carries a snapshot of clusters and jobs
first, then only what changed: it looks at the store's revision four times a second, which
costs an integer comparison while nothing happens, and reads the changed jobs when something
did. Host usage follows every few seconds. A job's scalars and logs are fetched by its page
while it is open (``/v1/jobs/{id}/scalars`` once a second, ``/logs?follow=true`` streamed).
A token limited to one experiment gets that experiment's jobs only, in the stream and in the
usage (:mod:`ringtrain.jobs.service.api.experiment_view`).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import Response, StreamingResponse

from ringtrain.jobs.errors import NotFoundError
from ringtrain.jobs.models import JobInfo
from ringtrain.jobs.models.paging import check_range
from ringtrain.jobs.models.schemas import API_PREFIX, LoginCode
from ringtrain.jobs.service.api.caller import CallerDep
from ringtrain.jobs.service.api.experiment_view import StreamView, usage_of
from ringtrain.jobs.service.api.guard import DASHBOARD_PATH, LOGIN_PATH
from ringtrain.jobs.service.api.job_processes import ACTIVE, add_process_routes, leader_pid
from ringtrain.jobs.service.api.login_codes import Grant, LoginCodes
from ringtrain.jobs.service.api.metrics import ServiceMetrics
from ringtrain.jobs.service.api.params import JobIdPath
from ringtrain.jobs.service.deployments import Deployments
from ringtrain.jobs.service.job_service import JobService
from ringtrain.jobs.service.monitor.host import HostSampler
from ringtrain.jobs.service.monitor.job_usage import JobUsageSampler
from ringtrain.jobs.service.monitor.replica_metrics import ReplicaScraper
from ringtrain.jobs.service.monitor.scalars import MAX_POINTS

#: The assets the page loads, by the name in their URL, with their media type.
ASSETS = {"app.js": "text/javascript", "chart.js": "text/javascript", "style.css": "text/css"}
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_PAGE_HEADERS = {"Content-Security-Policy": _CSP, "X-Content-Type-Options": "nosniff",
                 "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}
#: Seconds between looks at the store's revision, and between host samples sent.
POLL_S = 0.25
HOST_EVERY_S = 2.0
KEEPALIVE_S = 15.0


def job_summary(job: JobInfo) -> dict[str, Any]:
    """What the jobs table shows of a job (the job's page fetches the rest)."""
    return {"id": job.id, "name": job.name, "experiment": job.spec.experiment,
            "cluster": job.cluster, "state": job.state.value, "attempt": job.attempt,
            "node_count": job.spec.node_count,
            "process_count_per_node": job.spec.process_count_per_node,
            "created_at": job.created_at, "started_at": job.started_at,
            "running_at": job.running_at, "ended_at": job.ended_at,
            "exit_code": job.exit_code, "message": job.message[:500], "serves": job.serves}


def _static(name: str) -> bytes:
    return (resources.files("ringtrain.jobs.service.api") / "static" / name).read_bytes()


def add_dashboard_routes(app: FastAPI, service: JobService, metrics: ServiceMetrics,
                         deployments: Deployments, login_codes: LoginCodes) -> None:
    """Add the page, its assets, the event stream, scalars, host usage, ``/metrics`` and the
    login codes' route (the guard redeems them)."""
    @app.get(DASHBOARD_PATH, include_in_schema=False)
    def page() -> Response:
        return Response(_static("index.html"), media_type="text/html; charset=utf-8",
                        headers=_PAGE_HEADERS)

    @app.get(DASHBOARD_PATH + "/static/{name}", include_in_schema=False)
    def asset(name: str) -> Response:
        if name not in ASSETS:
            raise NotFoundError(f"no dashboard asset {name!r}")
        return Response(_static(name), media_type=f"{ASSETS[name]}; charset=utf-8",
                        headers=_PAGE_HEADERS)

    @app.get("/metrics", include_in_schema=False)
    def prometheus() -> Response:
        return Response(metrics.exposition(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    r = _dashboard_routes(service, deployments)
    add_process_routes(r, service)

    @r.post("/dashboard/login-codes", status_code=201)
    def login_code(caller: CallerDep) -> LoginCode:
        """A code that signs a browser in once, as this caller, within a minute: what
        ``ringtrain dashboard --open`` opens instead of a URL with the token."""
        token_id = None if caller.token is None else caller.token.id
        code = login_codes.issue(Grant(token_id))
        return LoginCode(code=code, url_path=f"{LOGIN_PATH}?code={code}",
                         expires_in_s=login_codes.ttl_s)

    app.include_router(r)


def _dashboard_routes(service: JobService, deployments: Deployments) -> APIRouter:
    """What the page reads besides the records: scalars, usage, replicas' traffic, events."""
    r = APIRouter(prefix=API_PREFIX)
    sampler = _Usage(service)
    summaries = _Summaries(service)
    scraper = ReplicaScraper()

    @r.get("/jobs/{job_id}/scalars")
    def scalars(job_id: JobIdPath, cursor: int = Query(
            0, description="Points already received (the last response's cursor).")
            ) -> dict[str, Any]:
        """A job's training scalars: TensorBoard event files under its outputs and the step
        profiler's metrics. ``points`` are ``[series, step, wall_time, value]``."""
        check_range("cursor", cursor, 0, MAX_POINTS, "pass the last response's cursor")
        return service.files.job_scalars(job_id, cursor)

    @r.get("/host")
    def host(caller: CallerDep) -> dict[str, Any]:
        """The service host's CPU, memory and GPU use (where the local clusters' nodes run),
        with ``jobs``: each running local job's CPU (percent of one core), resident memory
        (bytes) and process count, ``machines``: each attached cluster's machines, and
        ``disk``: the free space of the service's disk and the floor under which it refuses
        new jobs (as ``/v1/health`` has it)."""
        sample = sampler.sample()
        if caller.experiment is None:
            return sample
        return usage_of(sample, {j.id for j in service.store.list_jobs(
            experiment=caller.experiment, states=ACTIVE)})

    @r.get("/deployment-metrics")
    def deployment_metrics(caller: CallerDep) -> dict[str, list[dict[str, Any]]]:
        """Each live deployment's replicas, from their ``/metrics``: request rate, p50 and p99
        latency (seconds) and mean batch size since the previous call, and errors (4xx and
        5xx answers) in all."""
        live = [d for d in deployments.list() if d.urls and caller.sees_job(d.job)]
        urls = [u for d in live for u in d.urls]
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(urls)))) as pool:
            scraped = dict(zip(urls, pool.map(scraper.scrape, urls)))
        return {d.id: [scraped[u] for u in d.urls] for d in live}

    # Not in the OpenAPI schema: a stream that never ends is no operation for generated clients.
    @r.get("/events", include_in_schema=False)
    async def events(request: Request, caller: CallerDep) -> StreamingResponse:
        """Server-sent events: ``snapshot`` (clusters, jobs, host), then ``jobs`` (changed
        and removed jobs), ``clusters`` and ``host`` as they change."""
        view = StreamView(caller)
        return StreamingResponse(_stream(request, service, summaries, sampler, view),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    return r


class _Usage:
    """The host's sample with the usage of each running job on it, and of each machine of the
    clusters whose backend samples its own machines."""

    def __init__(self, service: JobService):
        self.service = service
        self.host = HostSampler(HOST_EVERY_S)
        self.jobs = JobUsageSampler(HOST_EVERY_S)
        self._machines_lock = threading.Lock()
        self._machines_last: dict[str, dict[str, Any]] = {}
        self._machines_at = -HOST_EVERY_S

    def sample(self) -> dict[str, Any]:
        leaders = {}
        for job in self.service.store.list_jobs(states=ACTIVE):
            pid = leader_pid(self.service, job)
            if pid is not None:
                leaders[job.id] = pid
        disk = self.service.disk.status()
        return {**self.host.sample(), "jobs": self.jobs.sample(leaders),
                "machines": self._machines(), "disk": disk and disk.model_dump()}

    def _machines(self) -> dict[str, dict[str, Any]]:
        """Each attached cluster's machines as its backend samples them, by cluster and machine
        id (asked at most once per period, however many dashboards are open)."""
        now = time.monotonic()
        with self._machines_lock:
            if now - self._machines_at < HOST_EVERY_S:
                return self._machines_last
            out = {}
            for c in self.service.store.list_clusters():
                backend = self.service.backends.find(c.backend)
                usage = None if backend is None else backend.machine_usage(c)
                if usage is not None:
                    out[c.name] = usage
            self._machines_last, self._machines_at = out, time.monotonic()
            return out


def _event(name: str, data: Any) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _clusters(service: JobService) -> list[dict[str, Any]]:
    out = []
    for c in service.store.list_clusters():
        nodes = service.store.list_nodes(c.name)
        out.append({**c.model_dump(mode="json"),
                    "nodes": [n.model_dump(mode="json") for n in nodes]})
    return out


class _Summaries:
    """Every job's summary, kept current from the store's change log: the snapshot of a new
    dashboard costs reading the jobs changed since the previous one, not every job again."""

    def __init__(self, service: JobService):
        self.service = service
        self._lock = threading.Lock()
        self._revision = -1
        self._jobs: dict[str, dict[str, Any]] = {}

    def all(self) -> tuple[int, list[dict[str, Any]]]:
        """The store's revision and every job's summary as of (at least) that revision."""
        store = self.service.store
        with self._lock:
            if self._revision < 0:
                revision = store.revision()  # before the read: later changes are read again
                self._jobs = {j.id: job_summary(j) for j in store.list_jobs()}
            else:
                revision, ids = store.changes_since(self._revision)
                for job_id in ids:
                    try:
                        self._jobs[job_id] = job_summary(store.get_job(job_id))
                    except NotFoundError:
                        self._jobs.pop(job_id, None)
            self._revision = revision
            return revision, list(self._jobs.values())


def _snapshot(service: JobService, summaries: _Summaries, sampler: _Usage,
              view: StreamView) -> tuple[int, dict[str, Any]]:
    revision, jobs = summaries.all()
    jobs = view.jobs(jobs)  # first: the clusters and the host name only the jobs shown
    return revision, {"revision": revision, "clusters": view.clusters(_clusters(service)),
                      "jobs": jobs, "host": view.host(sampler.sample())}


def _changes(service: JobService, since: int, view: StreamView) -> tuple[int, dict[str, Any]]:
    revision, ids = service.store.changes_since(since)
    jobs, removed = [], []
    for job_id in ids:
        try:
            jobs.append(job_summary(service.store.get_job(job_id)))
        except NotFoundError:
            removed.append(job_id)
    jobs = view.jobs(jobs)
    return revision, {"revision": revision, "jobs": jobs, "removed": view.removed(removed),
                      "clusters": view.clusters(_clusters(service))}


async def _stream(request: Request, service: JobService, summaries: _Summaries,
                  sampler: _Usage, view: StreamView) -> AsyncIterator[bytes]:
    revision, snapshot = await asyncio.to_thread(_snapshot, service, summaries, sampler, view)
    yield _event("snapshot", snapshot)
    host_at = sent_at = time.monotonic()
    while not await request.is_disconnected():
        await asyncio.sleep(POLL_S)
        now = time.monotonic()
        if service.store.revision() != revision:
            revision, changes = await asyncio.to_thread(_changes, service, revision, view)
            if changes["jobs"] or changes["removed"] or changes["clusters"]:
                yield _event("changes", changes)
                sent_at = now
        if now - host_at >= HOST_EVERY_S:
            host_at = now
            yield _event("host", view.host(await asyncio.to_thread(sampler.sample)))
            sent_at = now
        if now - sent_at >= KEEPALIVE_S:
            yield b": keep-alive\n\n"
            sent_at = now
