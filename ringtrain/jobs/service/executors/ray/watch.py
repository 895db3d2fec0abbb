"""How the Ray executor follows an attempt once Ray placed it: each node's agent starts it and
answers for it, the first node to fail stops the others, and the attempt ends once every node
said it exited (a failed attempt waits at most :data:`DRAIN_S` for their outputs). A node that
works in a private copy is sent its working dir, and what its answers carry is written into the
share.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ringtrain.jobs.models import JobInfo, JobState
from ringtrain.jobs.service.executors.base import Observation
from ringtrain.jobs.service.executors.phase import Phase
from ringtrain.jobs.service.executors.ray import transfer
from ringtrain.jobs.service.executors.ray.agent import agent_name, ensure_agent
from ringtrain.jobs.service.executors.ray.attempt import (
    AttemptStage,
    Failure,
    RayAttempt,
    RayHandle,
)
from ringtrain.jobs.service.executors.ray.node import NodePlan, NodeStatus
from ringtrain.jobs.service.share import Share

log = logging.getLogger(__name__)

#: How long one poll waits for the agents' answers; an agent still starting answers at a later
#: poll, so the scheduler's tick never waits for it.
STATUS_WAIT_S = 0.05
#: How long a failed attempt waits for its other nodes to exit and send their outputs.
DRAIN_S = 10.0
#: The job folder's subfolders that nodes working in private copies send back.
CARRIED = transfer.LOG_FOLDERS + transfer.OUTPUT_FOLDERS


class AttemptWatch:
    """The placed attempts' side of a Ray executor (``clock``: seconds since the epoch)."""

    def __init__(self, share: Share, clock: Callable[[], float]):
        self.share = share
        self.clock = clock

    def shrink(self, job: JobInfo, attempt: RayAttempt, node: int) -> bool:
        """Whether the attempt goes on without ``node`` (an elastic one's other node than node
        0, which drives it): its driver re-forms the world without that node's ranks."""
        if not job.spec.elastic or node == 0:
            return False
        if node not in attempt.shrunk:
            log.warning("job %s: node %d lost; its other nodes go on without it", job.id, node)
            attempt.shrunk.add(node)
        return True

    def observe(self, ray: Any, job: JobInfo, launch: RayHandle,
                attempt: RayAttempt) -> Observation:
        """The attempt's phase from its nodes' answers, once Ray placed it."""
        if attempt.agents is None:  # found by name, or made on a machine that has none yet
            attempt.agents = [ensure_agent(ray, attempt.placed[k])
                              for k in range(launch.node_count)]
        if attempt.stage is AttemptStage.STARTING:
            waiting = self._started(ray, attempt)
            if waiting is not None:
                return waiting
        refs = self._ask(job, launch, attempt)
        if not refs:  # every node's agent is gone
            attempt.asked = None
            assert attempt.failure is not None  # nodes are gone only with a failure
            return attempt.failure.observation()
        answers = self._answers(ray, job, launch, attempt, refs)
        if isinstance(answers, Observation):
            return answers
        seen, unknown = answers
        known_started = attempt.stage in (AttemptStage.RUNNING, AttemptStage.DRAINING)
        if unknown and (seen or known_started):
            attempt.asked = None
            return Observation(Phase.LOST, message=lost(
                ray, attempt.placed, unknown[0],
                "its agent does not know it: the agent was restarted"))
        if len(seen) + len(unknown) < len(refs):  # an agent still starting, or busy
            if attempt.stage is AttemptStage.DRAINING:
                return self.draining(job, attempt)
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

    def _started(self, ray: Any, attempt: RayAttempt) -> Observation | None:
        """While its nodes' start calls are in flight: ``PREPARING``, or ``LOST`` if an agent
        could not start its node; ``None`` once every node was started."""
        starting = attempt.starting
        ready, _ = ray.wait(starting, num_returns=len(starting), timeout=STATUS_WAIT_S)
        if len(ready) < len(starting):
            return Observation(Phase.PREPARING)
        for k, ref in enumerate(starting):
            try:
                ray.get(ref)
            except ray.exceptions.RayError as e:  # its agent died, or could not start
                return Observation(Phase.LOST,
                                   message=lost(ray, attempt.placed, k, _first_line(e)))
        attempt.starting = []
        attempt.move(AttemptStage.RUNNING)
        return None

    def _ask(self, job: JobInfo, launch: RayHandle, attempt: RayAttempt) -> dict[int, Any]:
        """The status calls to the agents of the nodes still there (made once per answer)."""
        if attempt.asked is None:
            # An attempt not yet known private is sent no sizes: a private node then sends from
            # the start (after a service restart, say), which lands on the same bytes.
            offsets = (transfer.file_sizes(Path(job.job_dir), CARRIED)
                       if attempt.private else {})
            attempt.asked = {k: agent.status.remote(launch.key(k), offsets)
                             for k, agent in enumerate(attempt.agents or [])
                             if k not in attempt.gone}
        return attempt.asked

    def _answers(self, ray: Any, job: JobInfo, launch: RayHandle, attempt: RayAttempt,
                 refs: dict[int, Any]
                 ) -> Observation | tuple[dict[int, NodeStatus], list[int]]:
        """The nodes that answered, and those whose agent does not know them; or what the
        attempt is now, if an answer ends it (an agent gone, what a node sent refused)."""
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=STATUS_WAIT_S)
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
                if attempt.failure is None and self.shrink(job, attempt, k):
                    return Observation(Phase.PREPARING if job.running_at is None
                                       else Phase.RUNNING)
                self.fail(launch, attempt, Failure(
                    Phase.LOST, None, lost(ray, attempt.placed, k, _first_line(e)),
                    self.clock(), attempt.gone | {k}))
                return self.draining(job, attempt)
            if status is None:
                unknown.append(k)
                continue
            problem = self.take(job, launch, attempt, k, status)
            if problem:
                attempt.asked = None
                return Observation(Phase.EXITED, 1, problem)
            seen[k] = status
        return seen, unknown

    def _outcome(self, job: JobInfo, launch: RayHandle, attempt: RayAttempt,
                 seen: dict[int, NodeStatus]) -> Observation:
        """The attempt's phase once every node still there answered."""
        failed = next((s for s in seen.values() if s.phase is Phase.EXITED and s.exit_code),
                      None)
        if failed is not None and attempt.failure is None:
            self.fail(launch, attempt, Failure(Phase.EXITED, failed.exit_code, failed.message,
                                                self.clock()))
        if all(s.phase is Phase.EXITED and not s.pending for s in seen.values()):
            return (attempt.failure.observation() if attempt.failure
                    else Observation(Phase.EXITED, 0))
        if attempt.stage is AttemptStage.DRAINING:
            return self.draining(job, attempt)
        if any(s.phase is Phase.PREPARING for s in seen.values()):
            return Observation(Phase.PREPARING)
        attempt.drop_copies()  # every node has its working dir
        return Observation(Phase.RUNNING)

    def fail(self, launch: RayHandle, attempt: RayAttempt, failure: Failure) -> None:
        """Note how the attempt ends and stop its other nodes; their outputs still come back."""
        if attempt.fail(failure):
            for k, agent in enumerate(attempt.agents or []):
                if k not in failure.gone:
                    agent.stop.remote(launch.key(k), True)

    def draining(self, job: JobInfo, attempt: RayAttempt) -> Observation:
        """A failed attempt's phase while its other nodes stop: where the job was, until they
        have all exited or the drain's bound passed."""
        failure = attempt.failure
        assert failure is not None  # draining follows a failure
        if self.clock() - failure.since >= DRAIN_S:
            ended = failure.observation()
            incomplete = "; ".join(f"node {k}: {_listed(files)}" for k, files in
                                   sorted(attempt.pending.items()) if files)
            if incomplete:
                ended = Observation(ended.phase, ended.exit_code, (
                    f"{ended.message}; within {DRAIN_S:g} s these files did not reach the "
                    f"share in full ({incomplete})"))
            return ended
        return Observation(Phase.PREPARING if job.running_at is None else Phase.RUNNING)

    def _start_nodes(self, job: JobInfo, launch: RayHandle, attempt: RayAttempt) -> None:
        spec = job.spec
        environ = self.share.job_environ(job)
        inputs = {n: path for n, path in spec.inputs.items()
                  if isinstance(path, str) and "://" not in path}
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

    def take(self, job: JobInfo, launch: RayHandle, attempt: RayAttempt, node: int,
              status: NodeStatus) -> str | None:
        """Serve a node working in a private copy: its working dir, its logs and outputs; why
        the share could not take what the node sent, if it could not."""
        job_dir = Path(job.job_dir)
        if status.needs_workdir or status.workdir_received:
            attempt.private = True
        if status.needs_workdir and attempt.agents is not None:
            copy = attempt.copies.get(status.missing_inputs)
            if copy is None:
                copy = attempt.copies[status.missing_inputs] = transfer.private_copy(
                    job_dir, {i: str(job.spec.inputs.get(i, "")) for i in status.missing_inputs})
            piece = copy if isinstance(copy, str) else copy.piece(status.workdir_received)
            attempt.agents[node].receive_workdir.remote(launch.key(node), piece)
        attempt.pending[node] = status.pending
        if not job_dir.is_dir():  # removed meanwhile: nothing to write into
            return None
        try:
            transfer.write_chunks(job_dir, list(status.chunks), CARRIED)
        except (OSError, ValueError) as e:
            return f"cannot write what node {node} sent into the job's folder {job_dir}: {e}"
        return None


def lost(ray: Any, placed: dict[int, str], node: int, why: str) -> str:
    """A message naming the Ray node that held bundle ``node``."""
    node_id = placed.get(node, "")
    where = next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id),
                 "?")
    return (f"node {node} of the job was lost: Ray node {node_id[:12]} at {where} ({why}); "
            "its ranks were stopped")


def _listed(files: tuple[str, ...], shown: int = 5) -> str:
    """The first ``shown`` of ``files``, and how many more."""
    more = len(files) - shown
    return ", ".join(files[:shown]) + (f" and {more} more" if more > 0 else "")


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
