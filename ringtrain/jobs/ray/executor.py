"""The Ray executor: an attempt is a placement group, and a node runner at each node's agent.

``start`` asks Ray for a placement group of ``node_count`` bundles, each holding the CPUs (and
GPUs) of ``process_count_per_node`` ranks (``STRICT_SPREAD``: every bundle on another machine,
when there are several); it never waits for Ray, so the scheduler's lock is held only for a few
calls. The group only reserves resources: once Ray placed it, ``poll`` asks the long-lived agent
of each bundle's machine (:mod:`ringtrain.jobs.ray.agent`) to run that node, so no Python
process starts between placement and the ranks. ``poll`` then reads the nodes' status; a
placement group still pending after ``placement_timeout_s`` ends the attempt with a message
saying what could not be placed (the scheduler fails it, or re-queues it under ``max_retries``).
The first node to fail stops the others, and the attempt ends once every node has answered that
it exited, so the outputs of every node are in the share.

A node that does not see the job's folder works in a private copy (see
:mod:`ringtrain.jobs.ray.node`): while it asks, each ``poll`` sends it the next piece of a tar of
the working dir and the inputs it lacks, and writes the chunks of logs and (once it exited)
outputs its answers carry into the share, at most :data:`~ringtrain.jobs.ray.transfer.ANSWER_BYTES`
a message each way, so the service's machine does every write to the share and ``job logs
--follow`` lags by about one scheduler tick. A node is done once it exited and the share holds
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
from ringtrain.jobs.models import JobInfo, JobState, NodeInfo
from ringtrain.jobs.ray import transfer
from ringtrain.jobs.ray.agent import agent_name, ensure_agent, ensure_agents
from ringtrain.jobs.ray.connection import RayConnection
from ringtrain.jobs.ray.node import NodePlan, NodeStatus
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


@dataclass(frozen=True)
class _Failure:
    """How an attempt ends (a node failed, or was lost), kept while its other nodes stop and
    send their outputs.

    Attributes:
        phase: what the attempt ends as: exited (with ``exit_code``), or lost.
        exit_code: the failed node's exit code.
        message: what happened, naming the node.
        since: when it was seen, against the drain's bound.
        gone: nodes whose agents are gone, asked nothing any more.
    """

    phase: Phase
    exit_code: int | None
    message: str
    since: float
    gone: frozenset[int] = frozenset()

    def observation(self) -> Observation:
        """What the executor reports once the attempt ends."""
        return Observation(self.phase, self.exit_code, self.message)


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
        # By placement group: the Ray node of each bundle, and its agent.
        self._placed: dict[str, dict[int, str]] = {}
        self._agents: dict[str, list[Any]] = {}
        # By placement group: start calls in flight; attempts known started at their agents;
        # status calls in flight (asked again once every agent answered); a node's failure.
        self._starting: dict[str, list[Any]] = {}
        self._started: set[str] = set()
        self._asked: dict[str, dict[int, Any]] = {}
        self._failed: dict[str, _Failure] = {}
        # By placement group, for nodes working in private copies: the tars of their working
        # dirs (by the inputs sent with it), and the files each node had not sent in full yet.
        self._copies: dict[str, dict[tuple[str, ...], transfer.PrivateCopy | str]] = {}
        self._pending: dict[str, dict[int, tuple[str, ...]]] = {}
        # Attempts with a node in a private copy: only their polls list the job's carried files
        # (the listing walks outputs/, which jobs on the share need not pay for every tick).
        self._private: set[str] = set()
        self._warm: set[str] = set()  # Ray addresses whose agents this process made sure of
        # By placement group, for elastic attempts: nodes lost while the others go on without
        # them (their driver re-forms the world), asked nothing any more.
        self._shrunk: dict[str, set[int]] = {}

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
            if launch.placement_group not in self._agents:  # not watched by this process yet
                self._placed.setdefault(launch.placement_group, _bundle_nodes(table))
                return Observation(Phase.LOST, message=self._lost(
                    ray, launch, self._dead_node(ray, launch), "Ray lost it"))
            if launch.placement_group not in self._failed:
                node = self._dead_node(ray, launch)
                if not self._shrink(job, launch, node):
                    self._fail(launch, _Failure(Phase.LOST, None,
                                                self._lost(ray, launch, node, "Ray lost it"),
                                                self.clock(), frozenset({node})))
            return self._observe_world(ray, job, launch)
        if state != "CREATED":
            if job.state == JobState.TERMINATING:  # nothing of it runs yet
                return Observation(Phase.LOST, message="stopped before Ray placed it")
            waited = self.clock() - launch.started_at
            if waited > self.placement_timeout_s:
                return Observation(Phase.LOST, message=self._unplaced(job, waited))
            return Observation(Phase.PREPARING)
        self._placed.setdefault(launch.placement_group, _bundle_nodes(table))
        return self._observe_world(ray, job, launch)

    def _observe_world(self, ray: Any, job: JobInfo, launch: RayHandle) -> Observation:
        """:meth:`_observe`, with an elastic attempt's world from the world file node 0's
        ``ringtrain run`` writes (when node 0 works on the share)."""
        seen = self._observe(ray, job, launch)
        if not job.spec.elastic or seen.phase is Phase.LOST:
            return seen
        try:
            return with_world(job, seen)
        except RecordError as e:  # the attempt goes on; only its world is not known
            log.warning("job %s: %s", job.id, e)
            return seen

    def _shrink(self, job: JobInfo, launch: RayHandle, node: int) -> bool:
        """Whether the attempt goes on without ``node`` (an elastic one's other node than node
        0, which drives it): its driver re-forms the world without that node's ranks."""
        if not job.spec.elastic or node == 0:
            return False
        lost = self._shrunk.setdefault(launch.placement_group, set())
        if node not in lost:
            log.warning("job %s: node %d lost; its other nodes go on without it", job.id, node)
            lost.add(node)
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
        try:  # a start still in flight lands before the node is forgotten
            ray.get(self._starting.pop(name, []), timeout=_STOP_TIMEOUT_S)
        except (ray.exceptions.RayError, TimeoutError):
            pass  # its agent is gone, and its ranks with it
        agents = self._found_agents(ray, handle)
        self._drop_copies(name)
        for held in (self._placed, self._agents, self._asked, self._failed, self._pending,
                     self._shrunk):
            held.pop(name, None)
        self._started.discard(name)
        self._private.discard(name)
        try:  # kill the ranks' process groups, then free the resources they held
            ray.get([a.forget.remote(handle.key(k)) for k, a in agents], timeout=_STOP_TIMEOUT_S)
        except (ray.exceptions.RayError, TimeoutError):
            pass  # a lost node's agent: its watchdogs kill its ranks
        try:
            remove_placement_group(get_placement_group(name))
        except ValueError:
            pass  # never created, or removed already

    def _observe(self, ray: Any, job: JobInfo, launch: RayHandle) -> Observation:
        """The attempt's phase from its nodes' answers, once Ray placed it."""
        name = launch.placement_group
        agents = self._agents.get(name)
        if agents is None:  # found by name, or made on a machine that has none yet
            agents = self._agents[name] = [ensure_agent(ray, self._placed[name][k])
                                           for k in range(launch.node_count)]
        if name in self._starting:
            starting = self._starting[name]
            ready, _ = ray.wait(starting, num_returns=len(starting), timeout=_STATUS_WAIT_S)
            if len(ready) < len(starting):
                return Observation(Phase.PREPARING)
            for k, ref in enumerate(starting):
                try:
                    ray.get(ref)
                except ray.exceptions.RayError as e:  # its agent died, or could not start
                    return Observation(Phase.LOST,
                                       message=self._lost(ray, launch, k, _first_line(e)))
            del self._starting[name]
            self._started.add(name)
        failure = self._failed.get(name)
        gone = (failure.gone if failure else frozenset()) | self._shrunk.get(name, set())
        refs = self._asked.get(name)
        if refs is None:
            # An attempt not yet known private is sent no sizes: a private node then sends from
            # the start (after a service restart, say), which lands on the same bytes.
            offsets = (transfer.file_sizes(Path(job.job_dir), _CARRIED)
                       if name in self._private else {})
            refs = self._asked[name] = {k: agent.status.remote(launch.key(k), offsets)
                                        for k, agent in enumerate(agents) if k not in gone}
        if not refs:  # every node's agent is gone
            del self._asked[name]
            return self._failed[name].observation()
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
                del self._asked[name]
                if name not in self._failed and self._shrink(job, launch, k):
                    return Observation(Phase.PREPARING if job.running_at is None
                                       else Phase.RUNNING)
                self._fail(launch, _Failure(
                    Phase.LOST, None, self._lost(ray, launch, k, _first_line(e)), self.clock(),
                    gone | {k}))
                return self._draining(job, name)
            if status is None:
                unknown.append(k)
                continue
            problem = self._take(job, launch, k, status)
            if problem:
                del self._asked[name]
                return Observation(Phase.EXITED, 1, problem)
            seen[k] = status
        if unknown and (seen or name in self._started):
            del self._asked[name]
            return Observation(Phase.LOST, message=self._lost(
                ray, launch, unknown[0], "its agent does not know it: the agent was restarted"))
        if len(seen) + len(unknown) < len(refs):  # an agent still starting, or busy
            if name in self._failed:
                return self._draining(job, name)
            return Observation(Phase.PREPARING if job.running_at is None else Phase.RUNNING)
        del self._asked[name]
        if unknown:  # no node of it started anywhere: start them all
            if job.state == JobState.TERMINATING:
                return Observation(Phase.LOST, message="stopped before its nodes started")
            self._start_nodes(job, launch, agents)
            return Observation(Phase.PREPARING)
        self._started.add(name)
        return self._outcome(job, launch, seen)

    def _outcome(self, job: JobInfo, launch: RayHandle,
                 seen: dict[int, NodeStatus]) -> Observation:
        """The attempt's phase once every node still there answered."""
        name = launch.placement_group
        failed = next((s for s in seen.values() if s.phase is Phase.EXITED and s.exit_code),
                      None)
        if failed is not None and name not in self._failed:
            self._fail(launch, _Failure(Phase.EXITED, failed.exit_code, failed.message,
                                        self.clock()))
        if all(s.phase is Phase.EXITED and not s.pending for s in seen.values()):
            failure = self._failed.get(name)
            return failure.observation() if failure else Observation(Phase.EXITED, 0)
        if name in self._failed:
            return self._draining(job, name)
        if any(s.phase is Phase.PREPARING for s in seen.values()):
            return Observation(Phase.PREPARING)
        self._drop_copies(name)  # every node has its working dir
        return Observation(Phase.RUNNING)

    def _drop_copies(self, name: str) -> None:
        """Remove the attempt's private copy tars from the service's temporary folder."""
        for copy in self._copies.pop(name, {}).values():
            if isinstance(copy, transfer.PrivateCopy):
                copy.close()

    def _fail(self, launch: RayHandle, failure: _Failure) -> None:
        """Note how the attempt ends and stop its other nodes; their outputs still come back.

        A second failure while they stop only adds the nodes it lost to the first.
        """
        name = launch.placement_group
        first = self._failed.get(name)
        if first is not None:
            self._failed[name] = _Failure(first.phase, first.exit_code, first.message,
                                          first.since, first.gone | failure.gone)
            return
        self._failed[name] = failure
        for k, agent in enumerate(self._agents[name]):
            if k not in failure.gone:
                agent.stop.remote(launch.key(k), True)

    def _draining(self, job: JobInfo, name: str) -> Observation:
        """A failed attempt's phase while its other nodes stop: where the job was, until they
        have all exited or the drain's bound passed."""
        failure = self._failed[name]
        if self.clock() - failure.since >= _DRAIN_S:
            ended = failure.observation()
            incomplete = "; ".join(f"node {k}: {_listed(files)}" for k, files in
                                   sorted(self._pending.get(name, {}).items()) if files)
            if incomplete:
                ended = Observation(ended.phase, ended.exit_code, (
                    f"{ended.message}; within {_DRAIN_S:g} s these files did not reach the "
                    f"share in full ({incomplete})"))
            return ended
        return Observation(Phase.PREPARING if job.running_at is None else Phase.RUNNING)

    def _start_nodes(self, job: JobInfo, launch: RayHandle, agents: list[Any]) -> None:
        spec, name = job.spec, launch.placement_group
        environ = self.share.job_environ(job)
        inputs = {n: path for n, path in spec.inputs.items() if "://" not in path}
        first_agent = agent_name(self._placed[name][0])
        elastic = spec.node_range if spec.elastic else None
        self._starting[name] = [agent.start.remote(launch.key(k), NodePlan(
            job_dir=job.job_dir, node=k, node_count=spec.node_count,
            process_count_per_node=spec.process_count_per_node, command=spec.command,
            job_preparation=spec.job_preparation, environ=environ, inputs=inputs,
            placement_group=name, gpus=spec.process_count_per_node * spec.gpus_per_process,
            first_agent=first_agent, first_key=launch.key(0), node_range=elastic,
            # An elastic attempt's world file names the cluster's nodes the job holds.
            name=f"node{job.nodes[k]}" if elastic and k < len(job.nodes) else None))
            for k, agent in enumerate(agents)]

    def _take(self, job: JobInfo, launch: RayHandle, node: int,
              status: NodeStatus) -> str | None:
        """Serve a node working in a private copy: its working dir, its logs and outputs.

        Returns:
            Why the share could not take what the node sent, if it could not.
        """
        job_dir = Path(job.job_dir)
        name = launch.placement_group
        if status.needs_workdir or status.workdir_received:
            self._private.add(name)
        if status.needs_workdir:
            copies = self._copies.setdefault(name, {})
            copy = copies.get(status.missing_inputs)
            if copy is None:
                copy = copies[status.missing_inputs] = transfer.private_copy(
                    job_dir, {i: job.spec.inputs.get(i, "") for i in status.missing_inputs})
            piece = copy if isinstance(copy, str) else copy.piece(status.workdir_received)
            self._agents[name][node].receive_workdir.remote(launch.key(node), piece)
        self._pending.setdefault(name, {})[node] = status.pending
        if not job_dir.is_dir():  # removed meanwhile: nothing to write into
            return None
        try:
            transfer.write_chunks(job_dir, list(status.chunks), _CARRIED)
        except (OSError, ValueError) as e:
            return f"cannot write what node {node} sent into the job's folder {job_dir}: {e}"
        return None

    def _dead_node(self, ray: Any, launch: RayHandle) -> int:
        """The first node of the attempt whose Ray machine is no longer alive."""
        placed = self._placed.get(launch.placement_group, {})
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        return next((k for k in range(launch.node_count) if placed.get(k) not in alive), 0)

    def _lost(self, ray: Any, launch: RayHandle, node: int, why: str) -> str:
        """A message naming the Ray node that held bundle ``node``."""
        node_id = self._placed.get(launch.placement_group, {}).get(node, "")
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
        if handle.placement_group in self._agents:
            return list(enumerate(self._agents[handle.placement_group]))
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
