"""Lifecycles of jobs and nodes: enums with explicit transition tables.

The tables are the single definition of which moves are legal; the store enforces them on every
write (:func:`check_job_transition`, :func:`check_node_transition`), so no caller can move a job
from ``succeeded`` back to ``running`` by mistake.
"""

from __future__ import annotations

from enum import Enum

from ringtrain.jobs.errors import InvalidTransitionError


class JobState(str, Enum):
    """Where a job is in its life. ``succeeded``, ``failed`` and ``terminated`` are final."""

    STAGING = "staging"  # its working dir is being copied; it queues once that is done
    QUEUED = "queued"
    PREPARING = "preparing"
    RUNNING = "running"
    UPLOADING = "uploading"  # its ranks ended; its outputs go to outputs_url
    TERMINATING = "terminating"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TERMINATED = "terminated"

    def is_terminal(self) -> bool:
        """True for the states a job never leaves."""
        return not JOB_TRANSITIONS[self]


_J = JobState
JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    # staging -> failed: the copy failed, or its cluster was deleted meanwhile.
    _J.STAGING: frozenset({_J.QUEUED, _J.TERMINATED, _J.FAILED}),
    # queued -> failed: its cluster was deleted before it could start.
    _J.QUEUED: frozenset({_J.PREPARING, _J.TERMINATED, _J.FAILED}),
    # preparing/running -> succeeded|failed directly: the job may end between two observations;
    # -> queued: a failed attempt re-queued under max_retries.
    _J.PREPARING: frozenset({_J.RUNNING, _J.UPLOADING, _J.TERMINATING, _J.SUCCEEDED, _J.FAILED,
                             _J.QUEUED}),
    _J.RUNNING: frozenset({_J.UPLOADING, _J.TERMINATING, _J.SUCCEEDED, _J.FAILED, _J.QUEUED}),
    _J.UPLOADING: frozenset({_J.TERMINATING, _J.SUCCEEDED, _J.FAILED, _J.QUEUED}),
    # terminating -> failed: stopped by the service for exceeding max_wall_clock_time.
    _J.TERMINATING: frozenset({_J.TERMINATED, _J.FAILED}),
    _J.SUCCEEDED: frozenset(),
    _J.FAILED: frozenset(),
    _J.TERMINATED: frozenset(),
}


def check_job_transition(job_id: str, current: JobState, target: JobState) -> None:
    """Refuse a job state change that the table does not allow.

    Raises:
        InvalidTransitionError: ``current -> target`` is not in :data:`JOB_TRANSITIONS`.
    """
    if target not in JOB_TRANSITIONS[current]:
        allowed = ", ".join(sorted(s.value for s in JOB_TRANSITIONS[current])) or "none (final)"
        raise InvalidTransitionError(
            f"job {job_id} is {current.value}; it cannot become {target.value} "
            f"(allowed from {current.value}: {allowed})")


class NodeState(str, Enum):
    """The state of one node of a cluster, as Azure Batch AI reported them."""

    IDLE = "idle"
    PREPARING = "preparing"
    RUNNING = "running"
    LEAVING = "leaving"  # removed by a shrink; leaves once its job ends
    UNUSABLE = "unusable"  # a backend found it broken; the local backend never does


_N = NodeState
NODE_TRANSITIONS: dict[NodeState, frozenset[NodeState]] = {
    _N.IDLE: frozenset({_N.PREPARING, _N.UNUSABLE}),
    _N.PREPARING: frozenset({_N.RUNNING, _N.IDLE, _N.LEAVING, _N.UNUSABLE}),
    # Jobs share a node's slots: when its running jobs end, one that came later may still
    # be preparing there.
    _N.RUNNING: frozenset({_N.IDLE, _N.PREPARING, _N.LEAVING, _N.UNUSABLE}),
    _N.LEAVING: frozenset(),  # a leaving node is removed, never reused
    _N.UNUSABLE: frozenset({_N.IDLE}),
}


def check_node_transition(node: str, current: NodeState, target: NodeState) -> None:
    """Refuse a node state change that the table does not allow.

    Raises:
        InvalidTransitionError: ``current -> target`` is not in :data:`NODE_TRANSITIONS`.
    """
    if target not in NODE_TRANSITIONS[current]:
        raise InvalidTransitionError(
            f"node {node} is {current.value}; it cannot become {target.value}")


class AllocationState(str, Enum):
    """A cluster's allocation: steady, resizing (nodes still leaving) or deleting."""

    STEADY = "steady"
    RESIZING = "resizing"
    DELETING = "deleting"


class Priority(str, Enum):
    """Job priority; higher priorities start first, FIFO within one."""

    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"

    @property
    def rank(self) -> int:
        """Sort key: larger starts first."""
        return {"low": 0, "normal": 1, "high": 2}[self.value]
