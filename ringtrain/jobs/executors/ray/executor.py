"""The Ray executor: an attempt is a placement group, and a node runner at each node's agent.

``start`` asks Ray for a placement group of ``node_count`` bundles, each holding the CPUs (and
GPUs) of ``process_count_per_node`` ranks (``STRICT_SPREAD``: every bundle on another machine,
when there are several); it never waits for Ray, so the scheduler's lock is held only for a few
calls. The group only reserves resources: once Ray placed it, ``poll`` asks the long-lived agent
of each bundle's machine (:mod:`ringtrain.jobs.executors.ray.agent`) to run that node, so no Python
process starts between placement and the ranks. ``poll`` then reads the nodes' status; a
placement group still pending after ``placement_timeout_s`` ends the attempt with a message
saying what could not be placed (the scheduler fails it, or re-queues it under ``max_retries``).
The first node to fail stops the others, and the attempt ends once every node has answered that
it exited, so the outputs of every node are in the share.

A node that does not see the job's folder works in a private copy (see
:mod:`ringtrain.jobs.executors.ray.node`): while it asks, each ``poll`` sends it the next
piece of a tar of the working dir and the inputs it lacks, and writes the chunks of logs and
(once it exited) outputs its answers carry into the share, at most
:data:`~ringtrain.jobs.executors.ray.transfer.ANSWER_BYTES` a message each way, so the
service's machine does every write to the share and ``job logs --follow`` lags by about one
scheduler tick. A node is done once it exited and the share holds
all its files; a restarted service asks again from the sizes the share holds.

The placement group is detached and named after the job id and attempt (``<id>.<attempt>``; a
node is ``<id>.<attempt>.node<k>`` at its agent), so a restarted service finds a running attempt
again from its stored handle, or from the job alone: an agent starts a node only once, and a
node that no agent knows any more is lost, never started a second time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ringtrain.jobs.errors import InvalidRequestError, RecordError
from ringtrain.jobs.executors.base import Observation
from ringtrain.jobs.executors.local import with_world
from ringtrain.jobs.executors.phase import Phase
from ringtrain.jobs.executors.ray import transfer
from ringtrain.jobs.executors.ray.agent import agent_name, ensure_agent, ensure_agents
from ringtrain.jobs.executors.ray.attempt import AttemptStage, Failure, RayAttempt
from ringtrain.jobs.executors.ray.connection import RayConnection
from ringtrain.jobs.executors.ray.node import NodePlan, NodeStatus
from ringtrain.jobs.models import JobInfo, JobState, NodeInfo
from ringtrain.jobs.share import Share

log = logging.getLogger(__name__)

#: How long an attempt may wait for Ray to place its nodes.
DEFAULT_PLACEMENT_TIMEOUT_S = 60.0
#: How long one poll waits for the agents' answers; an agent still starting answers at a later
#: poll, so the scheduler's tick never waits for it.
_STATUS_WAIT_S = 0.05
#: How long releasing an attempt waits for the agents to stop its nodes.
_STOP_TIMEOUT_S = 5.0
#: How long a failed attempt waits for its other nodes to exit and send their outputs.
_DRAIN_S = 10.0
#: The job folder's subfolders that nodes working in private copies send back.
_CARRIED = transfer.LOG_FOLDERS + transfer.OUTPUT_FOLDERS


@dataclass(frozen=True)
class RayHandle:
    """The Ray executor's launch handle of one attempt.

    Attributes:
        address: the Ray cluster's address.
        placement_group: the placement group's name (``<job id>.<attempt>``).
        node_count: nodes (bundles) of the attempt.
        attempt: the attempt.
        started_at: when it was asked for, against the placement timeout.
    """

    address: str
    placement_group: str
    node_count: int
    attempt: int
    started_at: float

    def key(self, node: int) -> str:
        """Node ``node``'s key at its agent."""
        return f"{self.placement_group}.node{node}"

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


class RayExecutor:
    """Runs attempts on Ray clusters.

    It keeps one :class:`~ringtrain.jobs.executors.ray.attempt.RayAttempt` per placed attempt it
    watches, by placement group name, with the attempt's stage; a restarted service rebuilds
    them from the stored handles and the agents' answers.

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
        self._attempts: dict[str, RayAttempt] = {}  # by placement group name
        self._warm: set[str] = set()  # Ray addresses whose agents this process made sure of

    def start(self, job: JobInfo, nodes: list[NodeInfo]) -> RayHandle:
        if job.attempt > 0:
            self.share.archive_attempt(job.id, job.attempt - 1)
        address = self.address_of(job.cluster)
        try:
            ray = self.connection.connect(address)
        except InvalidRequestError as e:
            raise OSError(str(e)) from None
        from ray.util.placement_group import placement_group

        if address not in self._warm:  # agents made at attach, or by a previous service
            ensure_agents(ray)
            self._warm.add(address)
        spec = job.spec
        handle = RayHandle(address, f"{job.id}.{job.attempt}", spec.node_count, job.attempt,
                           self.clock())
        placement_group([_bundle(job)] * spec.node_count, name=handle.placement_group,
                        strategy="STRICT_SPREAD" if spec.node_count > 1 else "PACK",
                        lifetime="detached")
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
        table = placement_group_table(pg)
        state = table.get("state")
        if state == "RESCHEDULING":
            # Placed once, then a machine of it went: Ray would place that bundle anew, but
            # the ranks on the other machines cannot take a new peer.
            attempt = self._attempts.get(launch.placement_group)
            if attempt is None or attempt.agents is None:  # not watched by this process yet
                placed = attempt.placed if attempt else _bundle_nodes(table)
                return Observation(Phase.LOST, message=self._lost(
                    ray, placed, _dead_node(ray, placed, launch.node_count), "Ray lost it"))
            if attempt.failure is None:
                node = _dead_node(ray, attempt.placed, launch.node_count)
                if not self._shrink(job, attempt, node):
                    self._fail(launch, attempt, Failure(
                        Phase.LOST, None, self._lost(ray, attempt.placed, node, "Ray lost it"),
                        self.clock(), frozenset({node})))
            return self._observe_world(ray, job, launch, attempt)
        if state != "CREATED":
            if job.state == JobState.TERMINATING:  # nothing of it runs yet
                return Observation(Phase.LOST, message="stopped before Ray placed it")
            waited = self.clock() - launch.started_at
            if waited > self.placement_timeout_s:
                return Observation(Phase.LOST, message=self._unplaced(job, waited))
            return Observation(Phase.PREPARING)
        attempt = self._attempts.setdefault(launch.placement_group,
                                            RayAttempt(_bundle_nodes(table)))
        return self._observe_world(ray, job, launch, attempt)

    def _observe_world(self, ray: Any, job: JobInfo, launch: RayHandle,
                       attempt: RayAttempt) -> Observation:
        """:meth:`_observe`, with an elastic attempt's world from the world file node 0's
        ``ringtrain run`` writes (when node 0 works on the share)."""
        return with_world(job, self._observe(ray, job, launch, attempt))

    def _shrink(self, job: JobInfo, attempt: RayAttempt, node: int) -> bool:
        """Whether the attempt goes on without ``node`` (an elastic one's other node than node
        0, which drives it): its driver re-forms the world without that node's ranks."""
        if not job.spec.elastic or node == 0:
            return False
        if node not in attempt.shrunk:
            log.warning("job %s: node %d lost; its other nodes go on without it", job.id, node)
            attempt.shrunk.add(node)
        return True

    def stop(self, job: JobInfo, launch: RayHandle | None, force: bool) -> None:
        handle = launch or self._guess(job)
        ray = self.connection.connect(handle.address)
        for k, agent in self._found_agents(ray, handle):
            agent.stop.remote(handle.key(k), force)

    def set_nodes(self, job: JobInfo, launch: RayHandle | None, nodes: list[int]) -> None:
        # An attempt's nodes are its placement group's bundles: it shrinks when Ray loses one
        # (its driver stops hearing the node), and grows only in its next attempt.
        log.info("job %s: offered nodes %s; a Ray attempt keeps the nodes it was placed on",
                 job.id, nodes)

    def release(self, job: JobInfo, launch: RayHandle | None) -> None:
        handle = launch or self._guess(job)
        ray = self.connection.connect(handle.address)
        from ray.util import get_placement_group, remove_placement_group

        name = handle.placement_group
        agents = self._found_agents(ray, handle)
        attempt = self._attempts.pop(name, None)
        if attempt is not None:
            try:  # a start still in flight lands before the node is forgotten
                ray.get(attempt.starting, timeout=_STOP_TIMEOUT_S)
            except (ray.exceptions.RayError, TimeoutError):
                pass  # its agent is gone, and its ranks with it
            attempt.drop_copies()
        try:  # kill the ranks' process groups, then free the resources they held
            ray.get([a.forget.remote(handle.key(k)) for k, a in agents], timeout=_STOP_TIMEOUT_S)
        except (ray.exceptions.RayError, TimeoutError):
            pass  # a lost node's agent: its watchdogs kill its ranks
        try:
            remove_placement_group(get_placement_group(name))
        except ValueError:
            pass  # never created, or removed already

    def _observe(self, ray: Any, job: JobInfo, launch: RayHandle,
                 attempt: RayAttempt) -> Observation:
        """The attempt's phase from its nodes' answers, once Ray placed it."""
        if attempt.agents is None:  # found by name, or made on a machine that has none yet
            attempt.agents = [ensure_agent(ray, attempt.placed[k])
                              for k in range(launch.node_count)]
        agents = attempt.agents
        if attempt.stage is AttemptStage.STARTING:
            starting = attempt.starting
            ready, _ = ray.wait(starting, num_returns=len(starting), timeout=_STATUS_WAIT_S)
            if len(ready) < len(starting):
                return Observation(Phase.PREPARING)
            for k, ref in enumerate(starting):
                try:
                    ray.get(ref)
                except ray.exceptions.RayError as e:  # its agent died, or could not start
                    return Observation(Phase.LOST,
                                       message=self._lost(ray, attempt.placed, k, _first_line(e)))
            attempt.starting = []
            attempt.move(AttemptStage.RUNNING)
        gone = attempt.gone
        if attempt.asked is None:
            # An attempt not yet known private is sent no sizes: a private node then sends from
            # the start (after a service restart, say), which lands on the same bytes.
            offsets = (transfer.file_sizes(Path(job.job_dir), _CARRIED)
                       if attempt.private else {})
            attempt.asked = {k: agent.status.remote(launch.key(k), offsets)
                             for k, agent in enumerate(agents) if k not in gone}
        refs = attempt.asked
        if not refs:  # every node's agent is gone
            attempt.asked = None
            assert attempt.failure is not None  # nodes are gone only with a failure
            return attempt.failure.observation()
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=_STATUS_WAIT_S)
        answered = {ref.hex() for ref in ready}
        seen: dict[int, NodeStatus] = {}
        unknown = []
        for k, ref in refs.items():
            if ref.hex() not in answered:
                continue
            try:
                status = ray.get(ref)
            except ray.exceptions.RayError as e:  # its agent died (with its machine, say)
                attempt.asked = None
                if attempt.failure is None and self._shrink(job, attempt, k):
                    return Observation(Phase.PREPARING if job.running_at is None
                                       else Phase.RUNNING)
                self._fail(launch, attempt, Failure(
                    Phase.LOST, None, self._lost(ray, attempt.placed, k, _first_line(e)),
                    self.clock(), gone | {k}))
                return self._draining(job, attempt)
            if status is None:
                unknown.append(k)
                continue
            problem = self._take(job, launch, attempt, k, status)
            if problem:
                attempt.asked = None
                return Observation(Phase.EXITED, 1, problem)
            seen[k] = status
        known_started = attempt.stage in (AttemptStage.RUNNING, AttemptStage.DRAINING)
        if unknown and (seen or known_started):
            attempt.asked = None
            return Observation(Phase.LOST, message=self._lost(
                ray, attempt.placed, unknown[0],
                "its agent does not know it: the agent was restarted"))
        if len(seen) + len(unknown) < len(refs):  # an agent still starting, or busy
            if attempt.stage is AttemptStage.DRAINING:
                return self._draining(job, attempt)
            return Observation(Phase.PREPARING if job.running_at is None else Phase.RUNNING)
        attempt.asked = None
        if unknown:  # no node of it started anywhere: start them all
            if job.state == JobState.TERMINATING:
                return Observation(Phase.LOST, message="stopped before its nodes started")
            self._start_nodes(job, launch, attempt)
            return Observation(Phase.PREPARING)
        if attempt.stage is AttemptStage.PLACED:  # found started, after a service restart
            attempt.move(AttemptStage.RUNNING)
        return self._outcome(job, launch, attempt, seen)

    def _outcome(self, job: JobInfo, launch: RayHandle, attempt: RayAttempt,
                 seen: dict[int, NodeStatus]) -> Observation:
        """The attempt's phase once every node still there answered."""
        failed = next((s for s in seen.values() if s.phase is Phase.EXITED and s.exit_code),
                      None)
        if failed is not None and attempt.failure is None:
            self._fail(launch, attempt, Failure(Phase.EXITED, failed.exit_code, failed.message,
                                                self.clock()))
        if all(s.phase is Phase.EXITED and not s.pending for s in seen.values()):
            return (attempt.failure.observation() if attempt.failure
                    else Observation(Phase.EXITED, 0))
        if attempt.stage is AttemptStage.DRAINING:
            return self._draining(job, attempt)
        if any(s.phase is Phase.PREPARING for s in seen.values()):
            return Observation(Phase.PREPARING)
        attempt.drop_copies()  # every node has its working dir
        return Observation(Phase.RUNNING)

    def _fail(self, launch: RayHandle, attempt: RayAttempt, failure: Failure) -> None:
        """Note how the attempt ends and stop its other nodes; their outputs still come back."""
        if attempt.fail(failure):
            for k, agent in enumerate(attempt.agents or []):
                if k not in failure.gone:
                    agent.stop.remote(launch.key(k), True)

    def _draining(self, job: JobInfo, attempt: RayAttempt) -> Observation:
        """A failed attempt's phase while its other nodes stop: where the job was, until they
        have all exited or the drain's bound passed."""
        failure = attempt.failure
        assert failure is not None  # draining follows a failure
        if self.clock() - failure.since >= _DRAIN_S:
            ended = failure.observation()
            incomplete = "; ".join(f"node {k}: {_listed(files)}" for k, files in
                                   sorted(attempt.pending.items()) if files)
            if incomplete:
                ended = Observation(ended.phase, ended.exit_code, (
                    f"{ended.message}; within {_DRAIN_S:g} s these files did not reach the "
                    f"share in full ({incomplete})"))
            return ended
        return Observation(Phase.PREPARING if job.running_at is None else Phase.RUNNING)

    def _start_nodes(self, job: JobInfo, launch: RayHandle, attempt: RayAttempt) -> None:
        spec = job.spec
        environ = self.share.job_environ(job)
        inputs = {n: path for n, path in spec.inputs.items() if "://" not in path}
        first_agent = agent_name(attempt.placed[0])
        elastic = spec.node_range if spec.elastic else None
        attempt.starting = [agent.start.remote(launch.key(k), NodePlan(
            job_dir=job.job_dir, node=k, node_count=spec.node_count,
            process_count_per_node=spec.process_count_per_node, command=spec.command,
            job_preparation=spec.job_preparation, environ=environ, inputs=inputs,
            placement_group=launch.placement_group,
            gpus=spec.process_count_per_node * spec.gpus_per_process,
            first_agent=first_agent, first_key=launch.key(0), node_range=elastic,
            # An elastic attempt's world file names the cluster's nodes the job holds.
            name=f"node{job.nodes[k]}" if elastic and k < len(job.nodes) else None))
            for k, agent in enumerate(attempt.agents or [])]
        attempt.move(AttemptStage.STARTING)

    def _take(self, job: JobInfo, launch: RayHandle, attempt: RayAttempt, node: int,
              status: NodeStatus) -> str | None:
        """Serve a node working in a private copy: its working dir, its logs and outputs.

        Returns:
            Why the share could not take what the node sent, if it could not.
        """
        job_dir = Path(job.job_dir)
        if status.needs_workdir or status.workdir_received:
            attempt.private = True
        if status.needs_workdir and attempt.agents is not None:
            copy = attempt.copies.get(status.missing_inputs)
            if copy is None:
                copy = attempt.copies[status.missing_inputs] = transfer.private_copy(
                    job_dir, {i: job.spec.inputs.get(i, "") for i in status.missing_inputs})
            piece = copy if isinstance(copy, str) else copy.piece(status.workdir_received)
            attempt.agents[node].receive_workdir.remote(launch.key(node), piece)
        attempt.pending[node] = status.pending
        if not job_dir.is_dir():  # removed meanwhile: nothing to write into
            return None
        try:
            transfer.write_chunks(job_dir, list(status.chunks), _CARRIED)
        except (OSError, ValueError) as e:
            return f"cannot write what node {node} sent into the job's folder {job_dir}: {e}"
        return None

    def _lost(self, ray: Any, placed: dict[int, str], node: int, why: str) -> str:
        """A message naming the Ray node that held bundle ``node``."""
        node_id = placed.get(node, "")
        where = next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id),
                     "?")
        return (f"node {node} of the job was lost: Ray node {node_id[:12]} at {where} ({why}); "
                "its ranks were stopped")

    def _unplaced(self, job: JobInfo, waited: float) -> str:
        spec = job.spec
        alive = [n for n in self.connection.nodes(self.address_of(job.cluster)) if n.alive]
        gpus = spec.process_count_per_node * spec.gpus_per_process
        need = f"{spec.process_count_per_node} free CPUs" + (f" and {gpus} free GPUs" if gpus
                                                             else "")
        have = ", ".join(f"{n.cpus_free:g}" + (f" CPUs/{n.gpus_free:g} GPUs" if gpus else "")
                         for n in alive) or "no"
        return (f"Ray could not place {spec.node_count} nodes of {need} each, on "
                f"{'distinct machines' if spec.node_count > 1 else 'a machine'}"
                f", within {waited:.0f} s (placement timeout {self.placement_timeout_s:g} s); the "
                f"Ray cluster has {len(alive)} alive nodes with {have} free"
                f"{'' if gpus else ' CPUs'}")

    def _guess(self, job: JobInfo) -> RayHandle:
        """The handle of the job's current attempt, from its id alone."""
        return RayHandle(self.address_of(job.cluster), f"{job.id}.{job.attempt}",
                         job.spec.node_count, job.attempt, self.clock())

    def _found_agents(self, ray: Any, handle: RayHandle) -> list[tuple[int, Any]]:
        """The agents that may run nodes of the attempt, by node: none before Ray placed it."""
        attempt = self._attempts.get(handle.placement_group)
        if attempt is not None and attempt.agents is not None:
            return list(enumerate(attempt.agents))
        from ray.util import get_placement_group, placement_group_table

        try:
            table = placement_group_table(get_placement_group(handle.placement_group))
        except ValueError:
            return []
        found = []
        for k, node_id in table.get("bundles_to_node_id", {}).items():
            try:
                found.append((int(k), ray.get_actor(agent_name(node_id))))
            except ValueError:
                continue  # gone with its machine
        return found


def _dead_node(ray: Any, placed: dict[int, str], node_count: int) -> int:
    """The first node of the attempt whose Ray machine is no longer alive."""
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    return next((k for k in range(node_count) if placed.get(k) not in alive), 0)


def _bundle_nodes(table: dict[str, Any]) -> dict[int, str]:
    """The Ray node of each placed bundle, from the placement group's table."""
    return {int(k): v for k, v in table.get("bundles_to_node_id", {}).items()}


def _bundle(job: JobInfo) -> dict[str, float]:
    """One node's resources: the CPUs, and GPUs if any, of its ranks."""
    spec = job.spec
    bundle = {"CPU": float(spec.process_count_per_node)}
    if spec.gpus_per_process:
        bundle["GPU"] = float(spec.process_count_per_node * spec.gpus_per_process)
    return bundle


def _listed(files: tuple[str, ...], shown: int = 5) -> str:
    """The first ``shown`` of ``files``, and how many more."""
    more = len(files) - shown
    return ", ".join(files[:shown]) + (f" and {more} more" if more > 0 else "")


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
