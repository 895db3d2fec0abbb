"""The per-machine agent: one long-lived Ray actor on each Ray node, starting the jobs' nodes there.

Starting a Ray actor costs a new Python worker process (seconds on a busy machine), so a job's
nodes are not actors of their own: each Ray node has one :class:`NodeAgent`, detached and named
after the Ray node (``agent.<node id>`` in the ``ringtrain`` namespace), pinned to its node and
holding no resources; every ringtrain cluster on that Ray cluster shares it, so a machine costs
one idle worker process however many clusters use it. It runs a :class:`NodeRunner` per node
of an attempt, keyed ``<job id>.<attempt>.node<k>``; the attempt's placement group only reserves
the CPUs and GPUs its ranks use. The service creates the agents when a cluster is attached and
whenever a placed attempt lands on a node without one, and finds them again by name after a
restart. An agent dies with its node (its raylet), and its ranks with it.

The actor's worker imports this module, so it imports nothing heavy (see :mod:`.node`).
"""

from __future__ import annotations

import threading
from typing import Any

from ringtrain.jobs.service.executors.ray.node import NodePlan, NodeRunner, NodeStatus
from ringtrain.jobs.service.monitor.host import HostSampler

#: Calls one agent serves at once: status polls of every attempt on its node, and starts/stops.
_CONCURRENCY = 64


def agent_name(node_id: str) -> str:
    """The Ray actor name of the agent on the Ray node ``node_id``."""
    return f"agent.{node_id}"


def ensure_agent(ray: Any, node_id: str) -> Any:
    """The agent on the Ray node ``node_id``, created if there is none.

    Creation is asynchronous: the handle answers once the agent's worker has started.
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return ray.remote(NodeAgent).options(
        name=agent_name(node_id), get_if_exists=True, lifetime="detached", num_cpus=0,
        max_concurrency=_CONCURRENCY, max_restarts=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()


def ensure_agents(ray: Any) -> None:
    """Make sure every alive node of the Ray cluster has its agent (at attach time, so that a
    job's first start does not wait for one)."""
    for node in ray.nodes():
        if node["Alive"]:
            ensure_agent(ray, node["NodeID"])


class NodeAgent:
    """The agent actor (``ray.remote`` is applied by :func:`ensure_agent`).

    Every method but :meth:`start` answers for a key it does not hold: a status of ``None`` tells
    the executor the attempt never started here, or was lost with a previous agent.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runners: dict[str, NodeRunner] = {}
        self._usage = HostSampler(max_age_s=1.0)

    def start(self, key: str, plan: NodePlan) -> None:
        """Start node ``plan.node`` of an attempt under ``key`` (once: a repeated call does
        nothing, so a restarted service cannot start it twice)."""
        with self._lock:
            if key in self._runners:
                return
            runner = self._runners[key] = NodeRunner(plan, self._rendezvous_of(plan))
        runner.run()

    def status(self, key: str, offsets: dict[str, int] | None = None) -> NodeStatus | None:
        """The node's status (see :meth:`NodeRunner.status`); ``None`` for an unknown key."""
        runner = self._runners.get(key)
        return None if runner is None else runner.status(offsets)

    def usage(self) -> dict[str, Any]:
        """This machine's CPU, memory and GPUs (see :class:`~ringtrain.jobs.service.monitor.host.
        HostSampler`), for the dashboard's clusters page."""
        return self._usage.sample()

    def rendezvous(self, key: str) -> tuple[str, int] | None:
        """Where node 0 of the attempt ``key`` serves the rendezvous store, if it is here."""
        runner = self._runners.get(key)
        return None if runner is None else runner.rendezvous()

    def receive_workdir(self, key: str, piece: tuple[int, bytes, int] | str) -> None:
        """Hand a piece of a private copy's working dir (or why there is none) to the node."""
        runner = self._runners.get(key)
        if runner is not None:
            runner.receive_workdir(piece)

    def stop(self, key: str, force: bool) -> None:
        """Signal the node's processes (see :meth:`NodeRunner.stop`)."""
        runner = self._runners.get(key)
        if runner is not None:
            runner.stop(force)

    def forget(self, key: str) -> None:
        """Kill what is left of the node and drop it: its attempt was released."""
        with self._lock:
            runner = self._runners.pop(key, None)
        if runner is not None:
            runner.discard()

    def _rendezvous_of(self, plan: NodePlan) -> Any:
        """How the node finds node 0's rendezvous address: here, or from node 0's agent."""
        def ask() -> tuple[str, int] | None:
            first = self._runners.get(plan.first_key)
            if first is not None:
                return first.rendezvous()
            import ray

            agent = ray.get_actor(plan.first_agent)
            # ray.get's overloads type an actor method's result as a list
            return ray.get(agent.rendezvous.remote(plan.first_key),  # type: ignore[return-value]
                           timeout=60)
        return ask
