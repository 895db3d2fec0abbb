"""Deployments: serve a succeeded job's saved model with replicas of ``ringtrain serve``.

A deployment is a job (see :mod:`ringtrain.jobs.models.deployment`): the scheduler places its
replicas on the cluster's nodes like any job's ranks, its logs are the ranks' logs, stopping it
terminates the job, and a restarted service finds it again from its record and its runner, as it
finds jobs. Each rank keeps one replica serving (:mod:`ringtrain.jobs.service.replica_keeper`).
What this module adds is the spec of that job, the reading of its state and URLs from the
replicas' records, and, for a deployment of several replicas, its front
(:mod:`ringtrain.jobs.service.deployment_fronts`).
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Iterator
from pathlib import Path

from ringtrain.jobs import envvars
from ringtrain.jobs.errors import InvalidRequestError, NotFoundError, RecordError
from ringtrain.jobs.files.record_file import read_record
from ringtrain.jobs.job_folder import OUTPUTS
from ringtrain.jobs.models import FileInfo, JobInfo, JobSpec, JobState
from ringtrain.jobs.models.deployment import (
    ENDPOINT_FILE,
    ENDPOINTS_OUTPUT,
    MAX_REPLICAS,
    MAX_RESTARTS,
    DeploymentInfo,
    check_ports,
    deployment_message,
    deployment_state,
    replica_statuses,
    servable_model,
)
from ringtrain.jobs.models.spec import InputSource
from ringtrain.jobs.replica_record import DEFAULT_MAX_RESTARTS, ReplicaRecord, ReplicaState
from ringtrain.jobs.service.deployment_fronts import Fronts, check_port, front_url, wants_front
from ringtrain.jobs.service.job_service import JobService

#: Seconds a stopped replica lets requests in flight finish: within the scheduler's stop grace,
#: so that a stop is a drain and not a kill.
DRAIN_S = 3


def serve_command(max_restarts: int = DEFAULT_MAX_RESTARTS, replica_port: int = 0) -> str:
    """The command of a deployment's ranks: each keeps one replica serving on port
    ``replica_port`` + its rank (0: a free one), restarting it up to ``max_restarts`` times in
    a row, and records it in its file of the endpoints output, named by its rank."""
    # `python` is the service's interpreter (the executor puts it first on PATH). `--token ''`:
    # a token in the service's own environment is the job service's, not one for model clients.
    port = f"$(({replica_port} + $HOROVOD_RANK))" if replica_port else "0"
    record = f"${envvars.output_var(ENDPOINTS_OUTPUT)}/{ENDPOINT_FILE.format(rank='$HOROVOD_RANK')}"
    return (f'exec python -m ringtrain.jobs.service.replica_keeper --record "{record}" '
            f"--port {port} --max-restarts {max_restarts} -- "
            f'"${envvars.input_var("model")}" --token \'\' --drain {DRAIN_S}')


class Deployments:
    """Create, inspect and stop deployments through a :class:`JobService`.

    Args:
        fronts: run a front (one URL, round robin over the healthy replicas) for each
            deployment of several replicas; the server passes ``True``, an app called
            in-process has none (:meth:`sync_fronts` then does nothing).
    """

    def __init__(self, service: JobService, fronts: bool = False):
        self.service = service
        self.fronts = Fronts(service.store, self._urls) if fronts else None

    def sync_fronts(self) -> None:
        """Start and stop fronts so that each live deployment of several replicas has one."""
        if self.fronts is not None:
            self.fronts.sync()

    def run_fronts(self, stop: threading.Event) -> None:
        """Keep the fronts in step with the deployments until ``stop`` is set, then stop them
        all (the server runs this in a thread)."""
        if self.fronts is not None:
            self.fronts.run(stop)

    def deploy(self, job_id: str, replicas: int = 1, cluster: str | None = None, *,
               port: int = 0, replica_port: int = 0,
               max_restarts: int = DEFAULT_MAX_RESTARTS) -> DeploymentInfo:
        """Serve the saved model of a succeeded job with ``replicas`` servers, one per node of
        ``cluster`` (default: the job's own); the new deployment is ``starting``.

        Args:
            port: the front's port on 127.0.0.1 (several replicas only; 0: a free one).
            replica_port: replica K's port is ``replica_port + K`` (0: free ones).
            max_restarts: how many times in a row each replica's server may be started again
                after it died, before that replica gives up.

        Raises:
            NotFoundError: no such job or cluster, or no saved model in the job's outputs.
            ConflictError: the job has not succeeded, or the front's port is in use.
            InvalidRequestError: ``replicas``, ``max_restarts`` or a port is out of range, or
                the job is a deployment.
            SpecError: the cluster has fewer nodes (``max_nodes``) than replicas.
        """
        if not 1 <= replicas <= MAX_REPLICAS:
            raise InvalidRequestError(f"replicas must be 1..{MAX_REPLICAS} (got {replicas})")
        if not 0 <= max_restarts <= MAX_RESTARTS:
            raise InvalidRequestError(f"max_restarts must be 0..{MAX_RESTARTS} "
                                      f"(got {max_restarts})")
        check_ports(replicas, port, replica_port)
        source = self.service.get_job(job_id)
        folder = servable_model(source, self._outputs(job_id))
        if port:  # the front binds it later: refuse now a port it could not have
            check_port(port)
        base = (source.spec.name or "job")[:56]
        stored = source.spec.outputs_location(source.id)
        model: str | InputSource = str(Path(source.job_dir) / folder)
        if stored:  # the outputs went to a store: the replicas load the model from there
            model = InputSource(url=stored + str(folder).removeprefix(f"{OUTPUTS}/"),
                                secret=source.spec.outputs_secret)
        spec = JobSpec(name=f"{base}-serve", experiment=source.spec.experiment,
                       node_count=replicas, command=serve_command(max_restarts, replica_port),
                       inputs={"model": model}, outputs=[ENDPOINTS_OUTPUT])
        job = self.service.submit(cluster or source.cluster, spec, serves=job_id)
        if port and self.fronts is not None:
            self.fronts.place(job.id, port)
        elif port:  # recorded: a server's fronts start there
            self.service.store.set_front(job.id, front_url(port))
        self.sync_fronts()  # its URL is in the answer: the front waits for the replicas
        return self._info(self.service.get_job(job.id))

    def list(self) -> list[DeploymentInfo]:
        """Every deployment the service knows, in creation order (stopped ones too)."""
        return [self._info(j) for j in self.service.list_jobs() if j.serves is not None]

    def get(self, deployment_id: str) -> DeploymentInfo:
        """One deployment. Raises NotFoundError if no job has that id, or it is no deployment."""
        job = self.service.get_job(deployment_id)
        if job.serves is None:
            raise NotFoundError(f"{deployment_id} is a job, not a deployment "
                                "(see `ringtrain deployment list`)")
        return self._info(job)

    def stop(self, deployment_id: str) -> DeploymentInfo:
        """Stop a deployment's servers; they finish the requests in flight first. Raises
        ConflictError if it has stopped already."""
        self.get(deployment_id)
        stopped = self.service.terminate(deployment_id)
        self.sync_fronts()  # the front stops with it: its requests in flight finish first
        return self._info(stopped)

    def _outputs(self, job_id: str) -> Iterator[FileInfo]:
        """The files under a job's ``outputs``, walked as they are read; none if it has none."""
        try:
            yield from self.service.files.iter_files(job_id, OUTPUTS)
        except NotFoundError:  # a job without outputs
            return

    def _info(self, job: JobInfo) -> DeploymentInfo:
        live = not job.state.is_terminal()
        # A stopped deployment's records say nothing more; a failed one's say why.
        ended_by_itself = job.state in (JobState.SUCCEEDED, JobState.FAILED)
        records = self._records(job) if live or ended_by_itself else []
        out = self.fronts.follow(job.id, _serving(records)) if self.fronts is not None and live \
            else []
        statuses = replica_statuses(records, out) if live else []
        urls = [r.url for r in statuses if r.url and r.state is ReplicaState.SERVING]
        state = deployment_state(job, statuses)
        front = self.fronts.url(job.id) if self.fronts is not None else None
        if job.spec.node_count == 1:  # one replica needs no front: its own URL is the one
            url = urls[0] if urls else None
        else:
            url = front if wants_front(job) else None
        return DeploymentInfo(id=job.id, serves=job.serves or "", state=state,
                              replicas=job.spec.node_count, urls=urls, url=url,
                              healthy=[r.url for r in statuses if r.url and r.healthy],
                              replica_status=statuses, model=_model_of(job),
                              message=deployment_message(job, state, records), job=job)

    # builtins: inside the class ``list`` is the method above
    def _records(self, job: JobInfo) -> builtins.list[ReplicaRecord | None]:
        """Each replica's record, by replica; ``None`` for one that wrote none yet (a file
        damaged counts as none: the keeper writes it whole)."""
        records: builtins.list[ReplicaRecord | None] = []
        for rank in range(job.spec.node_count):
            relpath = f"{OUTPUTS}/{ENDPOINTS_OUTPUT}/{ENDPOINT_FILE.format(rank=rank)}"
            try:  # the job writes this file: read as every record of a job's folder is
                records.append(read_record(Path(job.job_dir), relpath, relpath,
                                           ReplicaRecord.from_json))
            except RecordError:
                records.append(None)
        return records

    def _urls(self, job: JobInfo) -> builtins.list[str]:
        """The URLs of the replicas that serve now, by replica (what the front sends to)."""
        return _serving(self._records(job))


def _serving(records: list[ReplicaRecord | None]) -> list[str]:
    """The URLs of the replicas whose records say they serve, by replica."""
    return [r.url for r in records if r is not None and r.url and r.state is ReplicaState.SERVING]


def _model_of(job: JobInfo) -> str:
    model = job.spec.inputs.get("model", "")
    return model if isinstance(model, str) else model.url
