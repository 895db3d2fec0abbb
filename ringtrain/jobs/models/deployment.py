"""Deployments: a job's saved model served by replicas of ``ringtrain serve``, run as a job.

A deployment is recorded as a job (so it queues, holds nodes, logs, stops and is found again after
a restart exactly like one) whose ``serves`` names the job it serves. Each replica is one rank of
that job: a keeper (:mod:`ringtrain.jobs.service.replica_keeper`) running a ``ringtrain serve``
process on a loopback port of its node and starting it again when it dies, which records the
replica's state and URL in ``outputs/endpoints/replica.<rank>.json``
(:mod:`ringtrain.jobs.replica_record`). The deployment's state is read from the job's state,
those records and its front's health checks (:func:`deployment_state`). A deployment of several
replicas also gets a front, one URL for them all, run by the service
(:mod:`ringtrain.jobs.service.deployment_fronts`).
"""

from __future__ import annotations

import posixpath
from collections.abc import Collection, Iterable, Sequence
from enum import Enum

from pydantic import BaseModel, Field

from ringtrain.jobs.errors import ConflictError, InvalidRequestError, NotFoundError
from ringtrain.jobs.models.info import FileInfo, JobInfo
from ringtrain.jobs.models.states import JobState
from ringtrain.jobs.replica_record import ReplicaRecord, ReplicaState

#: The files of a saved model (:mod:`ringtrain.models.saved`, which the service cannot import:
#: it loads torch).
MODEL_FILES = ("model.json", "model.pt")
#: A Keras model's folder: its metadata and Keras' own file (examples/keras_cifar_cnn.py).
KERAS_MODEL_FILES = ("model.json", "model.keras")
#: The output folder where replicas announce themselves, and each one's file in it.
ENDPOINTS_OUTPUT = "endpoints"
ENDPOINT_FILE = "replica.{rank}.json"
#: The most replicas one deployment may ask for, and the most restarts in a row each may make.
MAX_REPLICAS = 64
MAX_RESTARTS = 100
#: The highest TCP port.
MAX_PORT = 65535


class DeploymentState(str, Enum):
    """Where a deployment is in its life. ``stopped`` and ``failed`` are final."""

    STARTING = "starting"  # queued for nodes, or replicas still loading the model
    READY = "ready"  # every replica serves (with a front: passed its last health check)
    DEGRADED = "degraded"  # some replica does not serve now (restarting, given up, or out)
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"  # no replica is left (each gave up), or the job itself failed


class ReplicaStatus(BaseModel):
    """One replica as it stands."""

    index: int = Field(description="The replica, as in `ringtrain deployment logs ID --replica K`.")
    state: ReplicaState
    url: str | None = Field(None, description="Where it serves (or served last).")
    healthy: bool = Field(False, description="It serves and, with a front, passed the front's "
                                             "last health check: requests go to it.")
    restarts: int = Field(0, description="Its server's restarts in a row so far.")
    message: str = Field("", description="Why it does not serve (restarting, failed).")


class DeploymentInfo(BaseModel):
    """A deployment as it stands: its job, the model it serves, and the URLs that answer."""

    id: str = Field(description="The deployment's job id (`ringtrain job logs ID --rank K`).")
    serves: str = Field(description="The job whose saved model it serves.")
    state: DeploymentState
    replicas: int
    urls: list[str] = Field(default_factory=list,
                            description="The URL of each replica that listens, by replica.")
    url: str | None = Field(
        None, description="The one URL for clients: with several replicas, the front's (the "
                          "service sends each request to the next healthy replica); with one, "
                          "the replica's. None until it answers, and once stopped.")
    healthy: list[str] = Field(
        default_factory=list,
        description="The replicas requests go to now: those that serve and, with a front, "
                    "passed its last health check.")
    replica_status: list[ReplicaStatus] = Field(
        default_factory=list, description="Each replica's state, by replica (none once the "
                                          "deployment has ended).")
    model: str = Field("", description="The model folder on the share.")
    message: str = ""
    job: JobInfo


def replica_statuses(records: Sequence[ReplicaRecord | None],
                     out: Collection[str] = ()) -> list[ReplicaStatus]:
    """Each replica's status from its record (``None``: it announced nothing yet, so it is
    starting). A serving replica is healthy unless its URL is ``out``: taken out of its
    front's turns (it failed the front's last health check, or a request)."""
    statuses = []
    for index, record in enumerate(records):
        if record is None:
            statuses.append(ReplicaStatus(index=index, state=ReplicaState.STARTING))
            continue
        healthy = record.state is ReplicaState.SERVING and record.url not in out
        statuses.append(ReplicaStatus(index=index, state=record.state, url=record.url,
                                      healthy=healthy, restarts=record.restarts,
                                      message=record.message))
    return statuses


def deployment_state(job: JobInfo, replicas: Sequence[ReplicaStatus]) -> DeploymentState:
    """The state of a deployment whose job is ``job`` and whose replicas are ``replicas``
    (read only while the job runs)."""
    if job.state != JobState.RUNNING:
        return {JobState.TERMINATING: DeploymentState.STOPPING,
                JobState.TERMINATED: DeploymentState.STOPPED,
                JobState.FAILED: DeploymentState.FAILED,
                # The keepers end by themselves only once they gave up: no replica is left.
                JobState.SUCCEEDED: DeploymentState.FAILED}.get(job.state,
                                                                DeploymentState.STARTING)
    if len(replicas) >= job.spec.node_count and all(r.healthy for r in replicas):
        return DeploymentState.READY
    if replicas and all(r.state is ReplicaState.FAILED for r in replicas):
        return DeploymentState.FAILED
    if all(r.healthy or r.state is ReplicaState.STARTING for r in replicas):
        return DeploymentState.STARTING  # the first servers are still loading the model
    return DeploymentState.DEGRADED


def deployment_message(job: JobInfo, state: DeploymentState,
                       records: Sequence[ReplicaRecord | None]) -> str:
    """What a deployment in ``state`` says: its job's message, and when it is degraded or
    failed, why each replica that does not serve does not."""
    notes = [f"replica {index} {r.state.value}: {r.message}" for index, r in enumerate(records)
             if r is not None and r.message and r.state is not ReplicaState.SERVING]
    if state not in (DeploymentState.DEGRADED, DeploymentState.FAILED):
        notes = []
    return "; ".join(m for m in (job.message, *notes) if m)


def check_ports(replicas: int, port: int, replica_port: int) -> None:
    """Check the ports a deployment asks for: its front's ``port`` and its replicas'
    ``replica_port``, ``replica_port + 1``, ... (0: free ones).

    Raises:
        InvalidRequestError: a port out of range, the front's port for one replica (which has
            no front), or the front's port among the replicas'.
    """
    if not 0 <= port <= MAX_PORT:
        raise InvalidRequestError(f"the front's port must be 1..{MAX_PORT}, or 0 for a free "
                                  f"one (got {port})")
    if port and replicas == 1:
        raise InvalidRequestError("a deployment of one replica has no front to put on port "
                                  f"{port}: give the replica's own port (--replica-port)")
    last = replica_port + replicas - 1
    if replica_port and not 1 <= replica_port <= last <= MAX_PORT:
        raise InvalidRequestError(f"the replicas' ports {replica_port}..{last} must lie within "
                                  f"1..{MAX_PORT} (replica K listens on --replica-port + K)")
    if port and replica_port and replica_port <= port <= last:
        raise InvalidRequestError(f"port {port} cannot be both the front's and replica "
                                  f"{port - replica_port}'s")


def find_model_folder(files: Iterable[FileInfo]) -> str | None:
    """The folder (relative to the job's folder) of the saved model among a job's output files:
    one holding both :data:`MODEL_FILES` (or :data:`KERAS_MODEL_FILES`), the shallowest first
    (a model saved at the end, rather than a checkpoint kept deeper), then by path; ``None`` if
    there is none.

    ``files`` is read once and only the names of model files are kept, so a job with millions of
    outputs costs a walk, not their list.
    """
    wanted = set(MODEL_FILES) | set(KERAS_MODEL_FILES)
    names: dict[str, set[str]] = {}
    for f in files:
        folder, name = posixpath.split(f.path)
        if name in wanted:
            names.setdefault(folder, set()).add(name)
    found = [folder for folder, held in names.items()
             if set(MODEL_FILES) <= held or set(KERAS_MODEL_FILES) <= held]
    return min(found, key=lambda folder: (folder.count("/"), folder)) if found else None


def servable_model(job: JobInfo, outputs: Iterable[FileInfo]) -> str:
    """The folder of the saved model that ``job`` left, relative to the job's folder, among
    ``outputs`` (the files under its ``outputs`` folder, read only once the job is known to have
    succeeded).

    Raises:
        InvalidRequestError: the job is a deployment.
        ConflictError: the job has not succeeded.
        NotFoundError: no saved model is among its outputs.
    """
    if job.serves is not None:
        raise InvalidRequestError(f"{job.id} is a deployment (of job {job.serves}); name the "
                                  "job that trained the model")
    if job.state != JobState.SUCCEEDED:
        raise ConflictError(f"job {job.id} is {job.state.value}: only a job that succeeded has a "
                            f"model to serve (see `ringtrain job show {job.id}`)")
    folder = find_model_folder(outputs)
    if folder is None:
        raise NotFoundError(
            f"job {job.id} saved no model in its outputs: a model is a folder with "
            f"{' and '.join(MODEL_FILES)} or {' and '.join(KERAS_MODEL_FILES)} "
            f"(ringtrain.models.saved.save_model writes the first into an "
            f"output such as $RINGTRAIN_OUTPUT_MODEL; see `ringtrain job files {job.id} outputs`)")
    return folder
