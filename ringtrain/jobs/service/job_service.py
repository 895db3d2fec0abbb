"""The job service's operations, shared by the REST API and the scheduler loop.

One lock serialises every change (API calls and scheduler ticks), so a terminate never races a
job's completion; the store still checks each transition on its own.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from ringtrain.jobs.errors import (
    ConflictError,
    DiskFullError,
    InvalidRequestError,
    InvalidTransitionError,
    JobsError,
    NotFoundError,
    SpecError,
    brief,
)
from ringtrain.jobs.models import (
    AllocationState,
    ClusterInfo,
    ClusterSpec,
    JobInfo,
    JobSpec,
    JobState,
)
from ringtrain.jobs.models.spec import MAX_ARG_BYTES, expand_path
from ringtrain.jobs.service.disk_guard import DiskGuard
from ringtrain.jobs.service.executors.backend import ClusterBackend
from ringtrain.jobs.service.executors.routing import Backends
from ringtrain.jobs.service.job_files import JobFiles
from ringtrain.jobs.service.output_quota import DEFAULT_LIMITS, OutputLimits, OutputWatcher
from ringtrain.jobs.service.scheduler import Scheduler
from ringtrain.jobs.service.share import Share
from ringtrain.jobs.service.stager import Stager
from ringtrain.jobs.service.storage_plans import StorageSettings
from ringtrain.jobs.service.store import Store
from ringtrain.jobs.service.uploads import Uploads, checkable, recorded_spec, uploaded_key

log = logging.getLogger(__name__)


class JobService:
    """Clusters and jobs: create, inspect, change, delete.

    Args:
        backends: the backends it runs (one per kind), each with its executor; clusters of
            another backend are refused.
        clock: seconds since the epoch (injectable for tests).
        output_limits: the default caps on a job's outputs.
        output_check_s: how often the outputs of running jobs are measured, at least.
        disk: the free space of the disks it writes to, which refuses submits below its floor
            (default: the share's disk, with the default floor and no reserve).
    """

    def __init__(self, store: Store, share: Share, backends: Iterable[ClusterBackend],
                 clock: Callable[[], float] = time.time,
                 output_limits: OutputLimits = DEFAULT_LIMITS, output_check_s: float = 5.0,
                 storage: StorageSettings | None = None, disk: DiskGuard | None = None):
        self.store = store
        self.share = share
        self.disk = disk or DiskGuard([share.root])
        self.storage = storage
        self.backends = Backends(backends, lambda name: store.get_cluster(name).backend)
        self.scheduler = Scheduler(store, self.backends, clock)
        self.clock = clock
        self.lock = threading.RLock()
        self.wake = threading.Event()  # set after a change the scheduler should act on at once
        #: Called with each tick's duration in seconds (the service's Prometheus histogram).
        self.tick_observers: list[Callable[[float], None]] = []
        self.stager = Stager(self._stage)
        #: What remote clients upload before they submit (their working dirs and inputs).
        self.uploads = Uploads(share.root / "uploads", clock=clock)
        #: What each job left in its folder, as the API reads it.
        self.files = JobFiles(store, share)
        self.output_watcher = OutputWatcher(
            lambda: self.store.list_jobs(states=[JobState.PREPARING, JobState.RUNNING,
                                                 JobState.UPLOADING]),
            self._fail_over_cap, output_limits, output_check_s)

    # -- clusters ----------------------------------------------------------------------------

    def create_cluster(self, spec: ClusterSpec) -> ClusterInfo:
        """Create a cluster, once its backend attached it (a private Ray head started, say).

        Raises:
            ConflictError: the name is taken.
            InvalidRequestError: this service does not run the backend, or it cannot reach or
                start the cluster's machines.
        """
        backend = self.backends.get(spec.backend)
        if spec.name in {c.name for c in self.store.list_clusters()}:  # before attaching
            raise ConflictError(f"cluster {spec.name!r} already exists")
        spec = backend.attach(spec)
        with self.lock:
            info = self.store.add_cluster(spec, self.clock())
        return backend.describe(info)

    def list_clusters(self) -> list[ClusterInfo]:
        """All clusters."""
        return self.store.list_clusters()

    def get_cluster(self, name: str) -> ClusterInfo:
        """One cluster, with what its backend knows of its machines. Raises NotFoundError."""
        info = self.store.get_cluster(name)
        backend = self.backends.find(info.backend)
        return info if backend is None else backend.describe(info)

    def resize_cluster(self, name: str, nodes: int | None = None,
                       slots: int | None = None) -> ClusterInfo:
        """Change a cluster's size (busy nodes leave only after their job ends) and/or its slots
        per node (jobs already running keep their processes).

        Raises:
            NotFoundError: no such cluster.
            ConflictError: it is being deleted.
            InvalidRequestError: neither given, ``nodes`` is negative, ``slots`` is under 1 or
                under what a waiting job asks per node, or ``nodes`` where the cluster's
                backend owns its machines (Ray's).
        """
        if nodes is None and slots is None:
            raise InvalidRequestError("give the new number of nodes, of slots per node, or both")
        if slots is not None:
            info = self._set_slots(name, slots)
        if nodes is None:
            self.wake.set()  # a job that waited for slots may fit now
            return info
        if nodes < 0:
            raise InvalidRequestError(f"nodes must be 0 or more (got {nodes})")
        cluster = self.store.get_cluster(name)
        problem = self.backends.get(cluster.backend).resize_problem(cluster)
        if problem:
            raise InvalidRequestError(problem)
        with self.lock:
            info = self.store.resize_cluster(name, nodes)
        self.wake.set()
        return info

    def _set_slots(self, name: str, slots: int) -> ClusterInfo:
        if slots < 1:
            raise InvalidRequestError(f"slots must be 1 or more (got {slots})")
        with self.lock:
            self.store.get_cluster(name)  # NotFoundError first
            waiting = [j for j in self.store.list_jobs(
                cluster=name, states=[JobState.STAGING, JobState.QUEUED])
                if j.spec.process_count_per_node > slots]
            if waiting:
                job = waiting[0]
                raise InvalidRequestError(
                    f"job {job.id} waits on cluster {name} with process_count_per_node "
                    f"{job.spec.process_count_per_node}, more than {slots} slots; terminate it "
                    "or resize to at least that many slots")
            return self.store.set_cluster_slots(name, slots)

    def delete_cluster(self, name: str) -> ClusterInfo:
        """Delete a cluster: its queued jobs fail, running ones finish, then it is gone.

        Returns:
            The cluster in state ``deleting`` (already removed if no node was busy).
        """
        with self.lock:
            info = self.store.mark_cluster_deleting(name)
            for job in self.store.list_jobs(cluster=name,
                                            states=[JobState.STAGING, JobState.QUEUED]):
                self.store.update_job(job.id, JobState.FAILED, self.clock(),
                                      message=f"cluster {name} was deleted before the job started")
            if info.current_nodes == 0:
                self.store.remove_cluster(name)
        return info

    # -- jobs --------------------------------------------------------------------------------

    def submit(self, cluster: str, spec: JobSpec, idempotency_key: str | None = None, *,
               serves: str | None = None) -> JobInfo:
        """Record a job on a cluster; it queues once its working dir is copied (in the
        background: the job is returned ``staging``, and a failed copy fails it).

        A repeated ``idempotency_key`` returns the job recorded under it, and never creates
        another. ``serves``: for a deployment, the job whose model it serves.

        Raises:
            NotFoundError: no such cluster.
            ConflictError: the cluster is being deleted, or the key was used for another
                spec or cluster.
            SpecError: the spec does not fit the cluster, or an input path is missing.
            DiskFullError: a disk of the service is under its floor of free space (a new job
                writes, and would only fail), or full.
        """
        upload = uploaded_key(spec.working_dir) is not None
        if upload and not idempotency_key:
            raise SpecError([{"field": "working_dir", "message": "an uploaded working dir "
                              "needs the submit's idempotency key, which names the upload"}])
        if idempotency_key is not None and (known := self.store.find_job(idempotency_key)):
            asked = recorded_spec(spec, idempotency_key, Path(known.job_dir)) if upload else spec
            return _same_submission(known, cluster, asked, idempotency_key)
        self.disk.check_room()  # after the key: a retried submit still finds its job
        self._check(cluster, checkable(spec) if upload else spec)
        sent = spec
        for _ in range(100):  # six hex digits can collide, rarely
            job_id = f"{spec.name or 'job'}-{secrets.token_hex(3)}"
            if self.share.job_dir(job_id).exists():
                continue
            if upload:  # inputs name their place in the job's folder
                spec = recorded_spec(sent, idempotency_key or "", self.share.job_dir(job_id))
            job = JobInfo(id=job_id, cluster=cluster, spec=spec, state=JobState.STAGING,
                          created_at=self.clock(), job_dir=str(self.share.job_dir(job_id)),
                          serves=serves)
            try:
                with self.lock:
                    recorded = self.store.add_job(job, idempotency_key)
            except ConflictError:  # the id is taken
                continue
            break
        else:
            raise ConflictError(f"no free job id for the name {spec.name!r}; try another name")
        if recorded.id != job.id:  # a concurrent request with the same key was first
            return _same_submission(recorded, cluster, spec, idempotency_key or "")
        if spec.working_dir:
            self.stager.put(job)
            return job
        self._stage(job)
        return self.store.get_job(job.id)

    def resume_staging(self) -> None:
        """Stage again the jobs a previous server left ``staging`` (stopped mid-copy)."""
        for job in self.store.list_jobs(states=[JobState.STAGING]):
            self.stager.put(job)

    def _check(self, cluster: str, spec: JobSpec) -> None:
        """Refuse a spec that does not fit the cluster or this host."""
        info = self.store.get_cluster(cluster)
        if info.allocation_state == AllocationState.DELETING:
            raise ConflictError(f"cluster {cluster} is being deleted; it takes no new jobs")
        errors = _fit_errors(info, spec) + self.backends.get(info.backend).job_problems(info, spec)
        errors += _local_errors(spec) + _exec_errors(spec) + self._storage_errors(spec)
        if errors:
            raise SpecError(errors)

    def _storage_errors(self, spec: JobSpec) -> list[dict[str, str]]:
        if self.storage is not None:
            return self.storage.spec_problems(spec)
        if spec.outputs_url or any(s.mode == "copy" for s in spec.input_sources().values()):
            return [{"field": "inputs", "message": "this service was started without object "
                                                   "storage settings (ringtrain server has them)"}]
        return []

    def _stage(self, job: JobInfo) -> None:
        """Make the job's folder (copying its working dir), then queue it (unless it was
        terminated, failed or deleted meanwhile)."""
        self.share.remove_job_dir(job.id)  # what a server stopped mid-copy left
        key = uploaded_key(job.spec.working_dir)
        try:
            if key:
                uploads = self.uploads
                self.share.create_job_dir(job.id, job.spec,
                                          lambda folder: uploads.extract_into(key, folder))
            else:
                self.share.create_job_dir(job.id, job.spec)
        except (OSError, JobsError) as e:
            self._end_staging(job.id, JobState.FAILED, f"could not copy the working dir: {e}")
            return
        finally:
            if key:
                self.uploads.remove(key)
        if self._end_staging(job.id, JobState.QUEUED, ""):
            self.wake.set()

    def _end_staging(self, job_id: str, target: JobState, message: str) -> bool:
        with self.lock:
            try:
                self.store.update_job(job_id, target, self.clock(), message=message)
                return True
            except InvalidTransitionError:  # terminated, or its cluster deleted, meanwhile
                return False
            except NotFoundError:  # and deleted too: its folder goes with it
                self.share.remove_job_dir(job_id)
                return False

    def list_jobs(self, experiment: str | None = None, cluster: str | None = None,
                  state: JobState | None = None) -> list[JobInfo]:
        """Jobs in submission order, optionally filtered."""
        return self.store.list_jobs(experiment=experiment, cluster=cluster,
                                    states=None if state is None else [state])

    def get_job(self, job_id: str) -> JobInfo:
        """One job. Raises NotFoundError."""
        return self.store.get_job(job_id)

    def terminate(self, job_id: str) -> JobInfo:
        """Stop a job (see :meth:`Scheduler.terminate`)."""
        with self.lock:
            job = self.scheduler.terminate(job_id)
        self.wake.set()
        return job

    def delete_job(self, job_id: str) -> None:
        """Forget a finished job and delete its folder. Raises ConflictError if not finished."""
        with self.lock:
            self.store.remove_job(job_id)
        self.files.forget(job_id)
        self.share.remove_job_dir(job_id)

    # -- scheduling --------------------------------------------------------------------------

    def tick(self) -> None:
        """One scheduler pass under the service lock."""
        start = time.perf_counter()
        with self.lock:
            self.scheduler.tick()
        for observe in self.tick_observers:
            observe(time.perf_counter() - start)

    def _fail_over_cap(self, job_id: str, message: str) -> None:
        with self.lock:
            try:
                self.scheduler.stop_failing(job_id, message)
            except (NotFoundError, InvalidTransitionError):  # ended or deleted meanwhile
                return
            except DiskFullError:  # not recorded: the next check finds it over its cap again
                return
        self.wake.set()

    def run_loop(self, stop: threading.Event, interval_s: float = 0.1,
                 min_gap_s: float = 0.05) -> None:
        """Resume staging, then tick until ``stop`` is set; the outputs of running jobs are
        measured meanwhile in a thread of their own.

        A change (submit, terminate) wakes the loop early, but ticks stay ``min_gap_s`` apart:
        a tick reads every queued job, and a burst of submits must not keep it reading
        without pause while requests wait for the interpreter. Each tick measures the disks
        first (what ``/v1/health`` and the dashboard show); a tick whose writes a full disk
        refuses changed nothing, and the next one tries again.
        """
        self.resume_staging()
        watcher = threading.Thread(target=self.output_watcher.run, args=(stop,),
                                   name="output-caps", daemon=True)
        watcher.start()
        while not stop.is_set():
            try:
                self.disk.refresh()
                self.tick()
            except DiskFullError:
                pass  # nothing recorded; the store's hook logs a full disk, once a minute
            except Exception:  # one bad tick must not stop the service
                log.exception("scheduler tick failed")
            if stop.wait(min_gap_s):
                return
            self.wake.wait(interval_s - min_gap_s)
            self.wake.clear()


def _fit_errors(info: ClusterInfo, spec: JobSpec) -> list[dict[str, str]]:
    """What of ``spec`` the cluster ``info`` cannot hold, whatever its backend."""
    errors = []
    if info.max_nodes is not None and spec.node_count > info.max_nodes:
        errors.append({"field": "node_count",
                       "message": f"{spec.node_count} nodes, but cluster {info.name} can have "
                                  f"at most {info.max_nodes} (max_nodes; it has "
                                  f"{info.target_nodes} now)"})
    if spec.process_count_per_node > info.slots:
        errors.append({"field": "process_count_per_node",
                       "message": f"at most {info.slots}, the slots per node of cluster "
                                  f"{info.name} (got {spec.process_count_per_node})"})
    return errors


def _local_errors(spec: JobSpec) -> list[dict[str, str]]:
    """The working dir and input paths of ``spec`` that this host does not have."""
    errors = []
    if spec.working_dir and uploaded_key(spec.working_dir) is None:
        problem = _local_problem(spec.working_dir, folder=True)
        if problem:
            errors.append({"field": "working_dir", "message": problem})
    for name, path in spec.inputs.items():
        if not isinstance(path, str) or "://" in path:
            continue  # a store URL: checked against the store's library
        problem = _local_problem(path, folder=False)
        if problem:
            errors.append({"field": f"inputs.{name}", "message": problem})
    return errors


def _exec_errors(spec: JobSpec) -> list[dict[str, str]]:
    """The strings of ``spec`` too large for the kernel to pass to a program."""
    strings = [("command", spec.command), ("job_preparation", spec.job_preparation or "")]
    strings += [(f"environment.{k}", f"{k}={v}") for k, v in spec.environment.items()]
    errors = []
    for field, value in strings:
        size = len(value.encode())
        if size > MAX_ARG_BYTES:
            errors.append({"field": field, "message": (
                f"{size} bytes, but the kernel passes at most {MAX_ARG_BYTES} bytes in one "
                "argument or variable: put a long script in a file of working_dir and run that")})
    return errors


def _same_submission(known: JobInfo, cluster: str, spec: JobSpec, key: str) -> JobInfo:
    """``known``, recorded under ``key``, if it asked for the same; else a ConflictError."""
    if (known.cluster, known.spec) != (cluster, spec):
        raise ConflictError(f"the idempotency key {key!r} was already used for job {known.id}, "
                            "with another spec or cluster; a new job needs a new key")
    return known
def _local_problem(value: str, folder: bool) -> str | None:
    """Why a spec's path is no folder (or no file or folder) on this host, or ``None``."""
    try:
        path = expand_path(value)
        if folder and not path.is_dir():
            return f"{brief(value)} is not a folder on the server's host"
        if not folder and not path.exists():
            return f"{brief(value)} does not exist"
    except ValueError as e:
        return str(e)
    except OSError as e:
        return f"cannot use {brief(value)}: {e.strerror}"
    return None
