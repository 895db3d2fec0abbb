"""The routes of the records: clusters, jobs and deployments (``/v1/...``).

Which of them a scoped token reaches is the scope guard's rule
(:mod:`ringtrain.jobs.service.api.scope_guard`); the lists here leave out the jobs of experiments
the caller does not see, and a submit goes into the caller's experiment
(:mod:`ringtrain.jobs.service.api.caller`).
"""

from __future__ import annotations

import re

from fastapi import APIRouter, Header, Query

from ringtrain.jobs.errors import ConflictError, SpecError, brief
from ringtrain.jobs.models import ClusterInfo, ClusterSpec, JobInfo, JobState
from ringtrain.jobs.models.deployment import DeploymentInfo
from ringtrain.jobs.models.schemas import (
    API_PREFIX,
    IDEMPOTENCY_KEY_PATTERN,
    IDEMPOTENCY_KEY_RULE,
    DeployRequest,
    ResizeRequest,
    SubmitRequest,
)
from ringtrain.jobs.service.api.caller import Caller, CallerDep
from ringtrain.jobs.service.api.params import ERRORS, ClusterName, JobIdPath, NameFilter
from ringtrain.jobs.service.deployments import Deployments
from ringtrain.jobs.service.job_service import JobService
from ringtrain.jobs.service.uploads import uploaded_key


def cluster_routes(service: JobService) -> APIRouter:
    """Create, list, show, resize and delete clusters."""
    r = APIRouter(prefix=API_PREFIX, responses=ERRORS)

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

    return r


def job_routes(service: JobService) -> APIRouter:
    """Submit, list, show, terminate and delete jobs (their files: :mod:`.file_routes`)."""
    r = APIRouter(prefix=API_PREFIX, responses=ERRORS)

    @r.post("/jobs", status_code=201)
    def submit(body: SubmitRequest, caller: CallerDep, idempotency_key: str | None = Header(
            None, max_length=1024,
            description="The client's name for this submission: a retry with the same key "
                        f"returns the same job (409 if its spec differs); "
                        f"{IDEMPOTENCY_KEY_RULE}.")) -> JobInfo:
        key = _checked_key(idempotency_key)
        spec = caller.submitted(body.spec)
        if key is not None and caller.experiment is not None:
            _check_key_unseen(service, caller, key)
        if uploaded_key(spec.working_dir) is not None:
            if key is None:
                raise SpecError([{"field": "Idempotency-Key", "message": (
                    "an uploaded working dir is named by the submit's key: send one")}],
                    "request")
            if service.store.find_job(key) is None:  # a repeated submit: its upload is gone
                service.uploads.require_complete(key, caller.owner)
        return service.submit(body.cluster, spec, key)

    @r.get("/jobs")
    def list_jobs(caller: CallerDep, experiment: NameFilter = None, cluster: NameFilter = None,
                  state: JobState | None = None,
                  idempotency_key: str | None = Query(
                      None, max_length=1024,
                      description="Only the job submitted with this Idempotency-Key.")
                  ) -> list[JobInfo]:
        key = _checked_key(idempotency_key)
        if key is not None:
            job = service.store.find_job(key)
            return [] if job is None or not caller.sees_job(job) else [job]
        if caller.experiment is not None and experiment not in (None, caller.experiment):
            return []  # another experiment's jobs: none the caller may see
        return service.list_jobs(experiment or caller.experiment, cluster, state)

    @r.get("/jobs/{job_id}")
    def get_job(job_id: JobIdPath) -> JobInfo:
        return service.get_job(job_id)

    @r.post("/jobs/{job_id}/terminate")
    def terminate(job_id: JobIdPath) -> JobInfo:
        return service.terminate(job_id)

    @r.delete("/jobs/{job_id}", status_code=204)
    def delete_job(job_id: JobIdPath) -> None:
        service.delete_job(job_id)

    return r


def deployment_routes(deployments: Deployments) -> APIRouter:
    """Deploy a job's model, list, show and stop deployments."""
    r = APIRouter(prefix=API_PREFIX, responses=ERRORS)

    @r.post("/jobs/{job_id}/deploy", status_code=201)
    def deploy(job_id: JobIdPath, body: DeployRequest) -> DeploymentInfo:
        return deployments.deploy(job_id, body.replicas, body.cluster, port=body.port,
                                  replica_port=body.replica_port,
                                  max_restarts=body.max_restarts)

    @r.get("/deployments")
    def list_deployments(caller: CallerDep) -> list[DeploymentInfo]:
        return [d for d in deployments.list() if caller.sees_job(d.job)]

    @r.get("/deployments/{deployment_id}")
    def get_deployment(deployment_id: JobIdPath) -> DeploymentInfo:
        return deployments.get(deployment_id)

    @r.post("/deployments/{deployment_id}/stop")
    def stop_deployment(deployment_id: JobIdPath) -> DeploymentInfo:
        return deployments.stop(deployment_id)

    return r


def _check_key_unseen(service: JobService, caller: Caller, key: str) -> None:
    """Refuse a key that named a job the caller does not see, without naming that job (the
    service's own answer would).

    Raises:
        ConflictError: the key was used for a job of another experiment.
    """
    known = service.store.find_job(key)
    if known is not None and not caller.sees_job(known):
        raise ConflictError("this idempotency key was already used, for another spec; a new "
                            "job needs a new key")


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
