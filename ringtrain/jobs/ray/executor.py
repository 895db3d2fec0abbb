"""The Ray executor: an attempt is a placement group and one :class:`NodeRunner` actor per node.

``start`` asks Ray for a placement group of ``node_count`` bundles of ``process_count_per_node``
CPUs each (``STRICT_SPREAD``: every bundle on another machine, when there are several), then
places node k's actor in bundle k and starts it; it never waits for Ray, so the scheduler's lock
is held only for a few calls. ``poll`` reads the actors' status; a placement group still pending
after ``placement_timeout_s`` ends the attempt with a message saying what could not be placed
(the scheduler fails it, or re-queues it under ``max_retries``).

A node that does not see the job's folder works in a private copy (see
:mod:`ringtrain.jobs.ray.node`): ``poll`` sends it the working dir when it asks, and writes the
log chunks and outputs its answers carry into the share, so the service's machine does every
write to the share and ``job logs --follow`` lags by about one scheduler tick.

Everything is detached and named after the job id and attempt (``<id>.<attempt>`` for the
placement group, ``<id>.<attempt>.node<k>`` for the actors, in the ``ringtrain`` namespace), so a
restarted service finds a running attempt again from its stored handle, or from the job alone,
and never starts it twice.
"""

from __future__ import annotations

import logging
import tarfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ringtrain.jobs.errors import InvalidRequestError, RecordError
from ringtrain.jobs.executors.base import Observation
from ringtrain.jobs.executors.phase import Phase
from ringtrain.jobs.models import JobInfo, JobState, NodeInfo
from ringtrain.jobs.ray import transfer
from ringtrain.jobs.ray.connection import RayConnection
from ringtrain.jobs.ray.node import NodePlan, NodeRunner, NodeStatus
from ringtrain.jobs.share import Share

log = logging.getLogger(__name__)

#: How long an attempt may wait for Ray to place its nodes.
DEFAULT_PLACEMENT_TIMEOUT_S = 60.0
#: How long one poll waits for the actors' answers; an actor still starting answers at a later
#: poll, so the scheduler's tick never waits for it.
_STATUS_WAIT_S = 0.05
#: How long releasing an attempt waits for its actors to stop their ranks.
_STOP_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class RayHandle:
    """The Ray executor's launch handle of one attempt.

    Attributes:
        address: the Ray cluster's address.
        placement_group: the placement group's name (``<job id>.<attempt>``).
        node_count: nodes (bundles and actors) of the attempt.
        attempt: the attempt.
        started_at: when it was asked for, against the placement timeout.
    """

    address: str
    placement_group: str
    node_count: int
    attempt: int
    started_at: float

    def actor(self, node: int) -> str:
        """The name of node ``node``'s actor."""
        return actor_name(self.placement_group, node)

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored with the job."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> RayHandle:
        """The handle :meth:`to_json` gave.

        Raises:
            RecordError: ``data`` is not a Ray handle.
        """
        try:
            handle = cls(**data)
        except TypeError as e:
            raise RecordError(f"the Ray launch handle stored with the job is malformed ({e})") \
                from None
        if not (isinstance(handle.placement_group, str) and isinstance(handle.node_count, int)):
            raise RecordError(f"the Ray launch handle stored with the job is malformed: {data!r}")
        return handle


def actor_name(placement_group: str, node: int) -> str:
    """The name of one node's actor of the attempt whose placement group is ``placement_group``."""
    return f"{placement_group}.node{node}"


class RayExecutor:
    """Runs attempts on Ray clusters.

    Args:
        share: the share holding the job folders, at the same path on the Ray nodes that see it.
        connection: the service's Ray connection.
        address_of: the Ray address of a cluster, by cluster name.
        placement_timeout_s: how long an attempt may wait for its placement group.
        clock: seconds since the epoch.
    """

    def __init__(self, share: Share, connection: RayConnection,
                 address_of: Callable[[str], str],
                 placement_timeout_s: float = DEFAULT_PLACEMENT_TIMEOUT_S,
                 clock: Callable[[], float] = time.time):
        self.share = share
        self.connection = connection
        self.address_of = address_of
        self.placement_timeout_s = placement_timeout_s
        self.clock = clock
        # Status calls in flight, by placement group: asked again once every actor answered.
        self._asked: dict[str, list[Any]] = {}
        # Nodes working in private copies, by placement group: sent the working dir, and
        # whose outputs are in the share.
        self._sent: dict[str, set[int]] = {}
        self._collected: dict[str, set[int]] = {}

    def start(self, job: JobInfo, nodes: list[NodeInfo]) -> RayHandle:
        if job.attempt > 0:
            self.share.archive_attempt(job.id, job.attempt - 1)
        address = self.address_of(job.cluster)
        try:
            ray = self.connection.connect(address)
        except InvalidRequestError as e:
            raise OSError(str(e)) from None
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        spec = job.spec
        handle = RayHandle(address, f"{job.id}.{job.attempt}", spec.node_count, job.attempt,
                           self.clock())
        cpus = spec.process_count_per_node
        pg = placement_group([{"CPU": cpus}] * spec.node_count, name=handle.placement_group,
                             strategy="STRICT_SPREAD" if spec.node_count > 1 else "PACK",
                             lifetime="detached")
        runner = ray.remote(NodeRunner)
        environ = self.share.job_environ(job)
        for k in range(spec.node_count):
            plan = NodePlan(job_dir=job.job_dir, node=k, node_count=spec.node_count,
                            process_count_per_node=cpus, command=spec.command,
                            job_preparation=spec.job_preparation, environ=environ,
                            first_node=handle.actor(0))
            actor = runner.options(
                name=handle.actor(k), lifetime="detached", num_cpus=cpus, max_concurrency=4,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    pg, placement_group_bundle_index=k)).remote(plan)
            actor.run.remote()
        log.info("job %s attempt %d: placement group %s on Ray at %s", job.id, job.attempt,
                 handle.placement_group, address)
        return handle

    def load_handle(self, data: dict[str, Any]) -> RayHandle:
        return RayHandle.from_json(data)

    def poll(self, job: JobInfo, launch: RayHandle | None) -> Observation:
        if launch is None:
            return Observation(Phase.LOST, message="the service stopped while starting the job")
        ray = self.connection.connect(launch.address)
        from ray.util import get_placement_group, placement_group_table

        try:
            pg = get_placement_group(launch.placement_group)
        except ValueError:
            return Observation(Phase.LOST, message=f"Ray has no placement group "
                                                   f"{launch.placement_group} any more")
        # The table, not pg.wait(0): a zero wait can time out before Ray answers at all.
        if placement_group_table(pg).get("state") != "CREATED":
            if job.state == JobState.TERMINATING:  # nothing of it runs yet
                return Observation(Phase.LOST, message="stopped before Ray placed it")
            waited = self.clock() - launch.started_at
            if waited > self.placement_timeout_s:
                return Observation(Phase.LOST, message=self._unplaced(job, waited))
            return Observation(Phase.PREPARING)
        return self._observe(ray, job, launch, pg)

    def stop(self, job: JobInfo, launch: RayHandle | None, force: bool) -> None:
        handle = launch or self._guess(job)
        ray = self.connection.connect(handle.address)
        for actor in self._actors(ray, handle):
            actor.stop.remote(force)
            if force:
                ray.kill(actor, no_restart=True)

    def set_nodes(self, job: JobInfo, launch: RayHandle | None, nodes: list[int]) -> None:
        # The service refuses elastic specs on Ray clusters at submit (JobService._check).
        raise OSError(f"job {job.id}: the ray backend runs no elastic jobs")

    def release(self, job: JobInfo, launch: RayHandle | None) -> None:
        handle = launch or self._guess(job)
        ray = self.connection.connect(handle.address)
        from ray.util import get_placement_group, remove_placement_group

        actors = self._actors(ray, handle)
        for held in (self._asked, self._sent, self._collected):
            held.pop(handle.placement_group, None)
        try:  # kill the ranks' process groups first, then the actors
            ray.get([a.stop.remote(True) for a in actors], timeout=_STOP_TIMEOUT_S)
        except (ray.exceptions.RayError, TimeoutError):
            pass  # a lost node's actor: its watchdogs kill its ranks
        for actor in actors:
            ray.kill(actor, no_restart=True)
        try:
            remove_placement_group(get_placement_group(handle.placement_group))
        except ValueError:
            pass  # never created, or removed already

    def _observe(self, ray: Any, job: JobInfo, launch: RayHandle, pg: Any) -> Observation:
        refs = self._asked.get(launch.placement_group)
        collected = self._collected.setdefault(launch.placement_group, set())
        if refs is None:
            refs = []
            offsets = transfer.log_sizes(Path(job.job_dir))
            for k in range(launch.node_count):
                try:
                    refs.append(ray.get_actor(launch.actor(k)).status.remote(
                        offsets, k not in collected))
                except ValueError:
                    return Observation(Phase.LOST,
                                       message=self._lost(ray, pg, k, "its actor is gone"))
            self._asked[launch.placement_group] = refs
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=_STATUS_WAIT_S)
        answered = {ref.hex() for ref in ready}
        seen: list[NodeStatus] = []
        for k, ref in enumerate(refs):
            if ref.hex() not in answered:
                continue
            try:
                status = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                self._asked.pop(launch.placement_group, None)
                return Observation(Phase.LOST, message=self._lost(ray, pg, k, _first_line(e)))
            problem = self._take(ray, job, launch, k, status)
            if problem:
                self._asked.pop(launch.placement_group, None)
                return Observation(Phase.EXITED, 1, problem)
            seen.append(status)
        failed = [s for s in seen if s.phase is Phase.EXITED and s.exit_code != 0]
        if failed:
            return Observation(Phase.EXITED, failed[0].exit_code, failed[0].message)
        if len(seen) < len(refs):  # an actor still starting, or busy
            return Observation(Phase.PREPARING if job.running_at is None else Phase.RUNNING)
        del self._asked[launch.placement_group]
        if all(s.phase is Phase.EXITED for s in seen):
            return Observation(Phase.EXITED, 0)
        if any(s.phase is Phase.PREPARING for s in seen):
            return Observation(Phase.PREPARING)
        return Observation(Phase.RUNNING)

    def _take(self, ray: Any, job: JobInfo, launch: RayHandle, node: int,
              status: NodeStatus) -> str | None:
        """Serve a node working in a private copy: its working dir, its logs and outputs.

        Returns:
            Why the share could not take what the node sent, if it could not.
        """
        job_dir = Path(job.job_dir)
        if status.needs_workdir and node not in self._sent.setdefault(launch.placement_group,
                                                                      set()):
            try:
                actor = ray.get_actor(launch.actor(node))
            except ValueError:
                return None  # gone since it answered: the next poll finds it lost
            actor.receive_workdir.remote(_workdir_tar(job_dir))
            self._sent[launch.placement_group].add(node)
        if not job_dir.is_dir():  # removed meanwhile: nothing to write into
            return None
        try:
            transfer.write_log_chunks(job_dir, list(status.logs))
            if status.outputs is not None:
                transfer.unpack(status.outputs, job_dir / "outputs")
                self._collected[launch.placement_group].add(node)
        except (OSError, ValueError, tarfile.TarError) as e:
            return f"cannot write what node {node} sent into the job's folder {job_dir}: {e}"
        return None

    def _lost(self, ray: Any, pg: Any, node: int, why: str) -> str:
        """A message naming the Ray node that held bundle ``node``."""
        from ray.util import placement_group_table

        node_id = placement_group_table(pg).get("bundles_to_node_id", {}).get(node, "")
        where = next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id), "?")
        return (f"node {node} of the job was lost: Ray node {node_id[:12]} at {where} ({why}); "
                "its ranks were stopped")

    def _unplaced(self, job: JobInfo, waited: float) -> str:
        spec = job.spec
        alive = [n for n in self.connection.nodes(self.address_of(job.cluster)) if n.alive]
        return (f"Ray could not place {spec.node_count} nodes of {spec.process_count_per_node} "
                f"free CPUs each, on {'distinct machines' if spec.node_count > 1 else 'a machine'}"
                f", within {waited:.0f} s (placement timeout {self.placement_timeout_s:g} s); the "
                f"Ray cluster has {len(alive)} alive nodes with "
                f"{', '.join(f'{n.cpus_free:g}' for n in alive) or 'no'} free CPUs")

    def _guess(self, job: JobInfo) -> RayHandle:
        """The handle of the job's current attempt, from its id alone."""
        return RayHandle(self.address_of(job.cluster), f"{job.id}.{job.attempt}",
                         job.spec.node_count, job.attempt, self.clock())

    def _actors(self, ray: Any, handle: RayHandle) -> list[Any]:
        actors = []
        for k in range(handle.node_count):
            try:
                actors.append(ray.get_actor(handle.actor(k)))
            except ValueError:
                continue  # never started, or dead already
        return actors


def _workdir_tar(job_dir: Path) -> bytes | str:
    """The job's working dir as a tar for a node without the share, or why there is none."""
    if not (job_dir / "wd").is_dir():
        return f"the service has no working dir at {job_dir / 'wd'}"
    try:
        return transfer.pack(job_dir / "wd", "the working dir")
    except transfer.TooLargeError as e:
        return str(e)
    except OSError as e:
        return f"the service cannot read the working dir: {e}"


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
