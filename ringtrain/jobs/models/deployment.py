"""Deployments: a job's saved model served by replicas of ``ringtrain serve``, run as a job.

A deployment is recorded as a job (so it queues, holds nodes, logs, stops and is found again after
a restart exactly like one) whose ``serves`` names the job it serves. Each replica is one rank of
that job: a ``ringtrain serve`` process on a free loopback port of its node, which writes its URL
to ``outputs/endpoints/replica.<rank>.json`` once the model is loaded and the port listens. The
deployment's state is read from the job's state and those files (:func:`deployment_state`). A
deployment of several replicas also gets a front, one URL for them all, run by the service
(:mod:`ringtrain.jobs.service.deployment_fronts`).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from enum import Enum

from pydantic import BaseModel, Field

from ringtrain.jobs.errors import ConflictError, InvalidRequestError, NotFoundError
from ringtrain.jobs.models.info import FileInfo, JobInfo
from ringtrain.jobs.models.states import JobState

#: The files of a saved model (:mod:`ringtrain.models.saved`, which the service cannot import:
#: it loads torch).
MODEL_FILES = ("model.json", "model.pt")
#: A Keras model's folder: its metadata and Keras' own file (examples/keras_cifar_cnn.py).
KERAS_MODEL_FILES = ("model.json", "model.keras")
#: The output folder where replicas announce themselves, and each one's file in it.
ENDPOINTS_OUTPUT = "endpoints"
ENDPOINT_FILE = "replica.{rank}.json"
#: The most replicas one deployment may ask for.
MAX_REPLICAS = 64


class DeploymentState(str, Enum):
    """Where a deployment is in its life. ``stopped`` and ``failed`` are final."""

    STARTING = "starting"  # queued for nodes, or replicas still loading the model
    READY = "ready"  # every replica listens
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"  # a replica exited (the others are stopped with it), or it never started


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
        description="With a front: the replicas it sends requests to now (those that passed "
                    "their last health check).")
    model: str = Field("", description="The model folder on the share.")
    message: str = ""
    job: JobInfo


def deployment_state(job: JobInfo, listening: int) -> DeploymentState:
    """The state of a deployment whose job is ``job`` and of which ``listening`` replicas announced
    their URL."""
    if job.state == JobState.RUNNING and listening >= job.spec.node_count:
        return DeploymentState.READY
    return {JobState.TERMINATING: DeploymentState.STOPPING,
            JobState.TERMINATED: DeploymentState.STOPPED,
            JobState.FAILED: DeploymentState.FAILED,
            # A server only exits when stopped: one that ended by itself did not serve.
            JobState.SUCCEEDED: DeploymentState.FAILED}.get(job.state, DeploymentState.STARTING)


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
