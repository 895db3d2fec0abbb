"""The scheduler: supervises running attempts and starts queued jobs in synchronous ticks.

Rules: a job starts only when all the nodes it needs are idle (gang allocation); high priority
before normal before low, first come first served within a priority. The first job that waits
for nodes holds a reservation: a later job may start before it (backfill) only where that cannot
delay it — on nodes it will not need once the running jobs have ended, or when the later job's
``max_wall_clock_time`` ends it before the running jobs' limits free the nodes the waiting job
needs. A job needing more nodes than the cluster has holds no reservation: it cannot start
before a resize, so it blocks nobody. An elastic job (``min_nodes``/``max_nodes``) gives back
the nodes it loses while it runs, fails below ``min_nodes``, and is offered idle nodes up to
``max_nodes`` while no queued job could use them. Time comes from an injectable clock, so tests
drive wall-clock limits without sleeping.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ringtrain.jobs.errors import ConflictError, JobsError, RecordError
from ringtrain.jobs.executors.base import Executor, LaunchHandle, Observation
from ringtrain.jobs.executors.phase import Phase
from ringtrain.jobs.models import (
    AllocationState,
    ClusterInfo,
    JobInfo,
    JobState,
    NodeInfo,
    NodeState,
)
from ringtrain.jobs.store import Store

log = logging.getLogger(__name__)

ACTIVE = (JobState.PREPARING, JobState.RUNNING, JobState.TERMINATING)


class Scheduler:
    """Moves jobs through their states by observing the executor.

    Args:
        store: where jobs, clusters and nodes live.
        executor: runs attempts.
        clock: seconds since the epoch (``time.time`` unless a test injects one).
        stop_grace_s: how long a stopped job gets between SIGTERM and SIGKILL.
    """

    def __init__(self, store: Store, executor: Executor, clock: Callable[[], float] = time.time,
                 stop_grace_s: float = 5.0):
        self.store = store
        self.executor = executor
        self.clock = clock
        self.stop_grace_s = stop_grace_s

    def tick(self) -> None:
        """Observe every active job once, then start what the free nodes allow."""
        for job in self.store.list_jobs(states=ACTIVE):
            try:
                self._supervise(job, self.clock())
            except JobsError:
                # One job's inconsistent record must not stall every other job's supervision.
                log.exception("job %s: supervision failed", job.id)
        for cluster in self.store.list_clusters():
            if cluster.allocation_state == AllocationState.DELETING:
                if cluster.current_nodes == 0:
                    self.store.remove_cluster(cluster.name)
                    log.info("cluster %s deleted", cluster.name)
                continue
            self._allocate(cluster)

    def terminate(self, job_id: str) -> JobInfo:
        """Stop a job: a staging or queued one ends at once, a started one once its processes
        are gone.

        Raises:
            NotFoundError: no such job.
            ConflictError: the job is already terminating or finished.
        """
        job = self.store.get_job(job_id)
        now = self.clock()
        if job.state in (JobState.STAGING, JobState.QUEUED):
            return self.store.update_job(job_id, JobState.TERMINATED, now,
                                         message="terminated before it started")
        if job.state not in (JobState.PREPARING, JobState.RUNNING):
            raise ConflictError(f"job {job_id} is already {job.state.value}; nothing to terminate")
        job = self.store.update_job(job_id, JobState.TERMINATING, now,
                                    message="terminating on request")
        try:
            launch = self._launch(job_id)
        except RecordError:
            launch = None  # stopped by its job id alone; the next tick ends it (_supervise)
        self.executor.stop(job, launch, force=False)
        return job

    def stop_failing(self, job_id: str, message: str) -> None:
        """Stop a preparing or running job that broke a rule of the service: it ends failed,
        with ``message``. A job in any other state is left as it is."""
        job = self.store.get_job(job_id)
        if job.state not in (JobState.PREPARING, JobState.RUNNING):
            return
        job = self.store.update_job(job_id, JobState.TERMINATING, self.clock(),
                                    ends_as=JobState.FAILED, message=message)
        try:
            launch = self._launch(job_id)
        except RecordError:
            launch = None  # stopped by its job id alone
        self.executor.stop(job, launch, force=False)

    def _launch(self, job_id: str) -> LaunchHandle | None:
        """The handle of the job's attempt; ``None`` if the service stopped before storing it.

        Raises:
            RecordError: the stored handle is not one of this executor.
        """
        data = self.store.get_launch(job_id)
        return None if data is None else self.executor.load_handle(data)

    def _supervise(self, job: JobInfo, now: float) -> None:
        try:
            launch = self._launch(job.id)
        except RecordError as e:
            # Nothing can be watched through a handle that cannot be read: the attempt ends,
            # and releasing it still finds its processes by their job id.
            self._finish(job, Observation(Phase.LOST, message=str(e)), None, now)
            return
        seen = self.executor.poll(job, launch)
        if seen.phase in (Phase.EXITED, Phase.LOST):
            self._finish(job, seen, launch, now)
        elif job.state == JobState.TERMINATING:
            if now - (job.terminate_requested_at or now) >= self.stop_grace_s:
                self.executor.stop(job, launch, force=True)
        else:
            if job.state == JobState.PREPARING and seen.phase is Phase.RUNNING:
                job = self.store.update_job(job.id, JobState.RUNNING, now)
            if job.state == JobState.RUNNING and seen.world is not None:
                job = self._follow_world(job, seen, launch, now)
                if job.state == JobState.TERMINATING:
                    return
            limit = job.spec.max_wall_clock_time
            if limit is not None and job.started_at is not None and now - job.started_at > limit:
                job = self.store.update_job(
                    job.id, JobState.TERMINATING, now, ends_as=JobState.FAILED,
                    message=f"exceeded max_wall_clock_time of {limit:g} s; stopped")
                self.executor.stop(job, launch, force=False)

    def _follow_world(self, job: JobInfo, seen: Observation, launch: LaunchHandle | None,
                      now: float) -> JobInfo:
        """An elastic job: give back the nodes it lost (failing it below min_nodes), offer it
        idle nodes up to max_nodes while no job waits for them, and say so in its message."""
        assert seen.world is not None
        lost = {loss.node: loss.reason for loss in seen.lost}
        nodes = [n for n in job.nodes if n not in lost]
        least, most = job.spec.node_range
        if len(nodes) < least:
            job = self.store.update_job(
                job.id, JobState.TERMINATING, now, ends_as=JobState.FAILED,
                message=f"{_losses(seen)}; {len(nodes)} node(s) left, fewer than min_nodes "
                        f"({least}); stopped")
            log.warning("job %s: %s", job.id, job.message)
            self.executor.stop(job, launch, force=False)
            return job
        if len(nodes) < most and not self._waiting_jobs(job.cluster):
            # A node this attempt lost stays out of it: its driver would not use it again.
            idle = [n.index for n in self.store.list_nodes(job.cluster)
                    if n.state == NodeState.IDLE and n.index not in lost]
            nodes += idle[:most - len(nodes)]
        running = [n for n in nodes if n in seen.world]
        message = f"elastic: running on nodes {_listed(running)}"
        if len(running) < len(nodes):
            message += (f"; nodes {_listed(n for n in nodes if n not in running)} join at "
                        "the next commit")
        if lost:
            message += f"; {_losses(seen)}"
        if nodes != job.nodes:
            log.warning("job %s: %s", job.id, message)
            job = self.store.set_job_nodes(job.id, nodes, message)
            try:
                self.executor.set_nodes(job, launch, nodes)
            except OSError as e:  # the attempt runs on; the next change offers the nodes again
                log.error("job %s: cannot offer nodes %s (%s)", job.id, _listed(nodes), e)
        elif message != job.message:
            self.store.set_message(job.id, message)
            job = self.store.get_job(job.id)
        return job

    def _waiting_jobs(self, cluster: str) -> bool:
        """Whether a queued job of ``cluster`` could start on it (needs no resize)."""
        size = self.store.get_cluster(cluster).target_nodes
        return any(j.spec.node_count <= size
                   for j in self.store.list_jobs(cluster=cluster, states=[JobState.QUEUED]))

    def _finish(self, job: JobInfo, seen: Observation, launch: LaunchHandle | None,
                now: float) -> None:
        self.executor.release(job, launch)
        code = seen.exit_code
        if job.state == JobState.TERMINATING:
            final = job.ends_as or JobState.TERMINATED
            message = job.message if final == JobState.FAILED else "terminated on request"
            self.store.update_job(job.id, final, now, exit_code=code, message=message)
        elif seen.phase is Phase.EXITED and code == 0:
            self.store.update_job(job.id, JobState.SUCCEEDED, now, exit_code=0,
                                  message=_losses(seen))
        else:
            reason = seen.message or f"exited with code {code}"
            retries = job.spec.max_retries
            if job.attempt < retries:
                self.store.update_job(
                    job.id, JobState.QUEUED, now,
                    message=f"attempt {job.attempt + 1} failed ({reason}); re-queued, retry "
                            f"{job.attempt + 1} of {retries}")
            else:
                self.store.update_job(job.id, JobState.FAILED, now, exit_code=code,
                                      message=reason)
        log.info("job %s: %s", job.id, self.store.get_job(job.id).state.value)

    def _allocate(self, cluster: ClusterInfo) -> None:
        nodes = self.store.list_nodes(cluster.name)
        idle = [n for n in nodes if n.state == NodeState.IDLE]
        queued = self.store.list_jobs(cluster=cluster.name, states=[JobState.QUEUED])
        # Stable sort: submission order (the store's order) is kept within a priority.
        queued.sort(key=lambda j: -j.spec.priority.rank)
        now = self.clock()
        reservation: _Reservation | None = None
        for job in queued:
            need = job.spec.node_count
            fits = need <= len(idle)
            if need > cluster.target_nodes:
                pass  # waits for a resize, so no node it could use now is held back for it
            elif reservation is None and not fits:
                reservation = self._reserve(need, len(idle), nodes, now)
            elif fits and (reservation is None or reservation.admit(
                    self._latest_end(job, now), need)):
                idle = idle[need:] if self._start(job, idle[:need], now) else idle
                continue
            self._note_waiting(job, cluster, len(idle))

    def _start(self, job: JobInfo, nodes: list[NodeInfo], now: float) -> bool:
        """Give ``nodes`` to ``job`` and start its attempt; False if that could not start."""
        # A retry keeps the message saying why the attempt before it failed (a lost node, say)
        # until it ends; a first attempt clears what it said while it waited.
        job = self.store.update_job(job.id, JobState.PREPARING, now,
                                    nodes=[n.index for n in nodes],
                                    message=None if job.attempt else "")
        try:
            self.store.set_launch(job.id, self.executor.start(job, nodes).to_json())
        except OSError as e:
            log.exception("job %s could not start", job.id)
            self.store.update_job(job.id, JobState.FAILED, now,
                                  message=f"could not start the job: {e}")
            return False
        return True

    def _reserve(self, need: int, idle: int, nodes: list[NodeInfo], now: float) -> _Reservation:
        """The reservation of a job needing ``need`` nodes: the latest time it can start, given
        the running jobs' wall-clock limits, and how many nodes it will not need then."""
        held: dict[str, int] = {}
        for node in nodes:  # a leaving node goes away with its job: it frees nothing
            if node.job_id is not None and node.state != NodeState.LEAVING:
                held[node.job_id] = held.get(node.job_id, 0) + 1
        ends = sorted((self._latest_end(self.store.get_job(job_id), now), count)
                      for job_id, count in held.items())
        free, start = idle, now
        for end, count in ends:
            if free >= need:
                break
            free, start = free + count, end
        if free < need:  # unusable nodes: no end of a running job frees enough
            return _Reservation(math.inf, 0)
        return _Reservation(start, free - need)

    def _latest_end(self, job: JobInfo, now: float) -> float:
        """When the job's attempt (if started now, for a queued one) ends at the latest: its
        wall-clock limit plus the stop grace; infinity without a limit."""
        if job.state == JobState.TERMINATING:
            return (job.terminate_requested_at or now) + self.stop_grace_s
        limit = job.spec.max_wall_clock_time
        if limit is None:
            return math.inf
        started = now if job.state == JobState.QUEUED or job.started_at is None else job.started_at
        return started + limit + self.stop_grace_s

    def _note_waiting(self, job: JobInfo, cluster: ClusterInfo, idle: int) -> None:
        need = job.spec.node_count
        if need > cluster.target_nodes:
            message = (f"waiting: needs {need} nodes but cluster {cluster.name} has "
                       f"{cluster.target_nodes}; resize it (`ringtrain cluster resize`)")
        else:
            message = f"waiting for {need} idle nodes ({idle} idle now)"
        if job.message != message:
            self.store.set_message(job.id, message)


def _listed(nodes: Iterable[int]) -> str:
    return ", ".join(map(str, nodes))


def _losses(seen: Observation) -> str:
    """``lost node 1 (worker 1 on node1.localhost was killed by signal SIGKILL)``, or ""."""
    return "; ".join(f"lost node {loss.node} ({loss.reason})" for loss in seen.lost)


@dataclass
class _Reservation:
    """What the first waiting job of a cluster is owed.

    Attributes:
        start: when enough nodes are idle for it at the latest (infinity when a running job has
            no wall-clock limit on the way).
        spare: nodes idle by then that it will not need; backfilled jobs that may still run
            then use them up.
    """

    start: float
    spare: int

    def admit(self, end: float, need: int) -> bool:
        """Whether a job ending by ``end`` and needing ``need`` nodes may start before it."""
        if end <= self.start < math.inf:
            return True
        if need <= self.spare:
            self.spare -= need
            return True
        return False
