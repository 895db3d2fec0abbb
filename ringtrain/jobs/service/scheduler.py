"""The scheduler: supervises running attempts and starts queued jobs in synchronous ticks.

Rules: jobs are placed on slots, as Batch AI and Ray place tasks on cores: a job takes
``process_count_per_node`` slots on each of ``node_count`` nodes, and starts only when that many
nodes have them free at once (gang allocation); jobs share a node up to the cluster's ``slots``,
packed onto the fullest nodes that fit, so that whole nodes stay free for larger jobs. High
priority before normal before low, first come first served within a priority. The first job that
waits holds a reservation: a later job may start before it (backfill) only where that cannot
delay it — on slots it will not need once the running jobs have ended, or when the later job's
``max_wall_clock_time`` ends it before the running jobs' limits free the slots the waiting job
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

from ringtrain.jobs.errors import ConflictError, DiskFullError, JobsError, RecordError
from ringtrain.jobs.models import (
    AllocationState,
    ClusterInfo,
    JobInfo,
    JobState,
    NodeInfo,
    NodeState,
)
from ringtrain.jobs.service.executors.base import Executor, LaunchHandle, Observation
from ringtrain.jobs.service.executors.phase import Phase
from ringtrain.jobs.service.store import Store

log = logging.getLogger(__name__)

ACTIVE = (JobState.PREPARING, JobState.RUNNING, JobState.UPLOADING, JobState.TERMINATING)
#: The states of a job whose processes run and may be stopped.
STARTED = (JobState.PREPARING, JobState.RUNNING, JobState.UPLOADING)


class Scheduler:
    """Moves jobs through their states by observing the executor.

    Args:
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
            except DiskFullError:
                # Nothing was recorded: the next tick observes the job again and retries (the
                # store's hook logs a full disk, once a minute, not once a job and tick).
                continue
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
        are gone. Raises ConflictError if it is already terminating or finished."""
        job = self.store.get_job(job_id)
        now = self.clock()
        if job.state in (JobState.STAGING, JobState.QUEUED):
            return self.store.update_job(job_id, JobState.TERMINATED, now,
                                         message="terminated before it started")
        if job.state not in STARTED:
            raise ConflictError(f"job {job_id} is already {job.state.value}; nothing to terminate")
        job = self.store.update_job(job_id, JobState.TERMINATING, now,
                                    message="terminating on request")
        self._stop(job)
        return job

    def stop_failing(self, job_id: str, message: str) -> None:
        """Stop a preparing or running job that broke a rule of the service: it ends failed,
        with ``message``. A job in any other state is left as it is."""
        job = self.store.get_job(job_id)
        if job.state not in STARTED:
            return
        self._stop(self.store.update_job(job_id, JobState.TERMINATING, self.clock(),
                                         ends_as=JobState.FAILED, message=message))

    def _stop(self, job: JobInfo) -> None:
        try:
            launch = self._launch(job.id)
        except RecordError:
            launch = None  # stopped by its job id alone; the next tick ends it (_supervise)
        self.executor.stop(job, launch, force=False)

    def _launch(self, job_id: str) -> LaunchHandle | None:
        """The handle of the job's attempt; ``None`` if the service stopped before storing it.
        Raises RecordError if the stored handle is not one of this executor."""
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
            if job.state in (JobState.PREPARING, JobState.RUNNING) \
                    and seen.phase is Phase.UPLOADING:
                job = self.store.update_job(job.id, JobState.UPLOADING, now,
                                            message="uploading the outputs")
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
            free = _free_slots(self.store.list_nodes(job.cluster),
                               self.store.get_cluster(job.cluster).slots)
            offered = _place({i: f for i, f in free.items() if i not in lost and i not in nodes},
                             1, job.spec.process_count_per_node, most - len(nodes))
            nodes += offered or []
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
        free = _free_slots(nodes, cluster.slots)
        queued = self.store.list_jobs(cluster=cluster.name, states=[JobState.QUEUED])
        # Stable sort: submission order (the store's order) is kept within a priority.
        queued.sort(key=lambda j: -j.spec.priority.rank)
        now = self.clock()
        reservation: _Reservation | None = None
        for job in queued:
            need, per = job.spec.node_count, job.spec.process_count_per_node
            chosen = _place(free, need, per)
            if need > cluster.target_nodes:
                chosen = None  # waits for a resize, so no slot it could use now is held for it
            elif reservation is None and chosen is None:
                reservation = self._reserve(need, per, free, nodes, now)
            elif chosen is not None and reservation is not None:
                chosen = reservation.admit(self._latest_end(job, now), need, per, free)
            if chosen is None:
                self._note_waiting(job, cluster, free)
            elif self._start(job, [n for n in nodes if n.index in chosen], now):
                for index in chosen:
                    free[index] -= per

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

    def _reserve(self, need: int, per: int, free: dict[int, int], nodes: list[NodeInfo],
                 now: float) -> _Reservation:
        """The reservation of a job needing ``per`` slots on ``need`` nodes: the latest time it
        can start, given the running jobs' wall-clock limits, and the slots it will not need
        then."""
        held: dict[str, list[int]] = {}
        for node in nodes:  # a leaving node goes away with its jobs: it frees nothing
            if node.index in free:
                for job_id in node.jobs:
                    held.setdefault(job_id, []).append(node.index)
        jobs = {job_id: self.store.get_job(job_id) for job_id in held}
        ends = sorted((self._latest_end(job, now), job_id) for job_id, job in jobs.items())
        later, start = dict(free), now
        chosen = _place(later, need, per)
        for end, job_id in ends:
            if chosen is not None:
                break
            for index in held[job_id]:
                later[index] += jobs[job_id].spec.process_count_per_node
            start = end
            # The nodes that are busy now are the ones to wait for: those free now stay lendable.
            chosen = _place(later, need, per, prefer_busy=free)
        if chosen is None:  # unusable nodes: no end of a running job frees enough
            return _Reservation(math.inf, {})
        return _Reservation(start, {i: f - (per if i in chosen else 0) for i, f in later.items()})

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

    def _note_waiting(self, job: JobInfo, cluster: ClusterInfo, free: dict[int, int]) -> None:
        need, per = job.spec.node_count, job.spec.process_count_per_node
        if need > cluster.target_nodes:
            message = (f"waiting: needs {need} nodes but cluster {cluster.name} has "
                       f"{cluster.target_nodes}; resize it (`ringtrain cluster resize`)")
        elif per == cluster.slots:  # it fills whole nodes
            idle = sum(f == cluster.slots for f in free.values())
            message = f"waiting for {need} idle nodes ({idle} idle now)"
        else:
            fits = sum(f >= per for f in free.values())
            message = (f"waiting for {need} node{'s' if need > 1 else ''} with {per} free "
                       f"slot{'s' if per > 1 else ''} each ({fits} have them now)")
        if job.message != message:
            self.store.set_message(job.id, message)


def _listed(nodes: Iterable[int]) -> str:
    return ", ".join(map(str, nodes))


def _losses(seen: Observation) -> str:
    """``lost node 1 (worker 1 on node1.localhost was killed by signal SIGKILL)``, or ""."""
    return "; ".join(f"lost node {loss.node} ({loss.reason})" for loss in seen.lost)


def _free_slots(nodes: list[NodeInfo], slots: int) -> dict[int, int]:
    """Free slots by node index, of the nodes a job may be placed on (not leaving, usable)."""
    return {n.index: slots - n.slots_used for n in nodes
            if n.state not in (NodeState.LEAVING, NodeState.UNUSABLE)}


def _place(free: dict[int, int], need: int, per: int, most: int | None = None,
           prefer_busy: dict[int, int] | None = None) -> list[int] | None:
    """The nodes for a job taking ``per`` slots on each of ``need`` nodes (up to ``most``,
    for an elastic job's offer), or None when fewer nodes have them.

    The fullest nodes that fit come first (best fit), so that whole nodes stay free for jobs
    that need them; with ``prefer_busy`` (the free slots now) the nodes busiest now come first.
    """
    fits = [i for i, f in free.items() if f >= per]
    if len(fits) < need:
        return None
    now = prefer_busy or {}
    fits.sort(key=lambda i: (now.get(i, 0), free[i], i))
    return sorted(fits[:need if most is None else most])


@dataclass
class _Reservation:
    """What the first waiting job of a cluster is owed.

    Attributes:
        start: when enough slots are free for it at the latest (infinity when a running job has
            no wall-clock limit on the way).
        spare: free slots by node by then that it will not need; backfilled jobs that may still
            run then use them up.
    """

    start: float
    spare: dict[int, int]

    def admit(self, end: float, need: int, per: int, free: dict[int, int]) -> list[int] | None:
        """The nodes on which a job ending by ``end`` and taking ``per`` slots on each of
        ``need`` nodes may start before it, or None."""
        if end <= self.start < math.inf:
            return _place(free, need, per)
        chosen = _place({i: min(f, self.spare.get(i, 0)) for i, f in free.items()}, need, per)
        for index in chosen or []:
            self.spare[index] -= per
        return chosen
