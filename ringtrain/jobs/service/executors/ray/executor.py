"""The Ray executor: an attempt is a placement group, and a node runner at each node's agent.

``start`` asks Ray for a placement group of ``node_count`` bundles, each holding the CPUs (and
GPUs) of ``process_count_per_node`` ranks (``STRICT_SPREAD``: every bundle on another machine,
when there are several); it never waits for Ray, so the scheduler's lock is held only for a few
calls. The group only reserves resources: once Ray placed it, ``poll`` asks the long-lived agent
of each bundle's machine (:mod:`ringtrain.jobs.service.executors.ray.agent`) to run that node,
so no Python process starts between placement and the ranks. ``poll`` then reads the nodes' status;
a placement group still pending after ``placement_timeout_s`` ends the attempt with a message
saying what could not be placed (the scheduler fails it, or re-queues it under ``max_retries``).
The first node to fail stops the others, and the attempt ends once every node has answered that
it exited, so the outputs of every node are in the share.

A node that does not see the job's folder works in a private copy: each ``poll`` sends it the
next piece of its working dir and writes the logs and outputs its answers carry into the share
(:mod:`ringtrain.jobs.service.executors.ray.transfer`), so ``job logs --follow`` lags by about
one scheduler tick. A node is done once it exited and the share holds all its files.

The placement group is detached and named after the job id and attempt (``<id>.<attempt>``; a
node is ``<id>.<attempt>.node<k>`` at its agent), so a restarted service finds a running attempt
again from its stored handle, or from the job alone: an agent starts a node only once, and a
node that no agent knows any more is lost, never started a second time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ringtrain.jobs.errors import InvalidRequestError
from ringtrain.jobs.models import JobInfo, JobState, NodeInfo
from ringtrain.jobs.service.executors.base import Observation
from ringtrain.jobs.service.executors.node_launch import with_world
from ringtrain.jobs.service.executors.phase import Phase
from ringtrain.jobs.service.executors.ray.agent import agent_name, ensure_agents
from ringtrain.jobs.service.executors.ray.attempt import Failure, RayAttempt, RayHandle
from ringtrain.jobs.service.executors.ray.connection import RayConnection
from ringtrain.jobs.service.executors.ray.watch import AttemptWatch, lost
from ringtrain.jobs.service.share import Share

log = logging.getLogger(__name__)

#: How long an attempt may wait for Ray to place its nodes.
DEFAULT_PLACEMENT_TIMEOUT_S = 60.0
#: How long releasing an attempt waits for the agents to stop its nodes.
_STOP_TIMEOUT_S = 5.0


class RayExecutor:
    """Runs attempts on Ray clusters.

    It keeps one :class:`~ringtrain.jobs.service.executors.ray.attempt.RayAttempt` per placed
    attempt it watches, by placement group name, with the attempt's stage; a restarted service
    rebuilds them from the stored handles and the agents' answers.

    Args:
        share: the share holding the job folders, at the same path on the Ray nodes that see it.
        address_of: the Ray address of a cluster, by cluster name.
        placement_timeout_s: how long an attempt may wait for its placement group.
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
        self.watch = AttemptWatch(share, clock)
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
                return Observation(Phase.LOST, message=lost(
                    ray, placed, _dead_node(ray, placed, launch.node_count), "Ray lost it"))
            if attempt.failure is None:
                node = _dead_node(ray, attempt.placed, launch.node_count)
                if not self.watch.shrink(job, attempt, node):
                    self.watch.fail(launch, attempt, Failure(
                        Phase.LOST, None, lost(ray, attempt.placed, node, "Ray lost it"),
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
        """:meth:`AttemptWatch.observe`, with an elastic attempt's world from the world file
        node 0's ``ringtrain run`` writes (when node 0 works on the share)."""
        return with_world(job, self.watch.observe(ray, job, launch, attempt))

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
