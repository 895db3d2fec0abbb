"""The Store protocol: where clusters, nodes and jobs live, with transitions enforced on write.

A store keeps node allocation consistent with job states: moving a job to ``preparing`` claims
``process_count_per_node`` slots on each of its nodes (jobs share a node up to the cluster's
``slots``), moving it to ``running`` marks them running, and moving it to a final state (or back
to ``queued`` for a retry) releases them, removing a node a shrink marked ``leaving`` once its
last job is gone. A node's state follows its jobs: ``running`` while one runs there,
``preparing`` while they prepare, ``idle`` without any. Each call is one transaction.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from ringtrain.jobs.models import ClusterInfo, ClusterSpec, JobInfo, JobState, NodeInfo
from ringtrain.jobs.service.store.token_table import TokenTable


class Store(Protocol):
    """Durable records of clusters, nodes and jobs.

    Every method raises ``NotFoundError`` for an unknown cluster or job, and
    ``InvalidTransitionError`` for a state change the transition tables refuse.
    """

    #: The scoped tokens' records, kept with the rest (:mod:`.token_table`).
    tokens: TokenTable

    def add_cluster(self, spec: ClusterSpec, now: float) -> ClusterInfo:
        """Create a cluster with ``spec.nodes`` idle nodes. Raises ConflictError (name taken)."""
        ...

    def get_cluster(self, name: str) -> ClusterInfo:
        """One cluster."""
        ...

    def list_clusters(self) -> list[ClusterInfo]:
        """All clusters, by name."""
        ...

    def list_nodes(self, cluster: str) -> list[NodeInfo]:
        """The nodes of a cluster, by index."""
        ...

    def resize_cluster(self, name: str, nodes: int) -> ClusterInfo:
        """Set the target size: add idle nodes, remove idle ones, mark busy ones ``leaving``.

        Raises InvalidRequestError past the cluster's ``max_nodes``."""
        ...

    def set_cluster_slots(self, name: str, slots: int) -> ClusterInfo:
        """Set the process slots per node (for jobs that start from now on).

        Raises ConflictError if the cluster is being deleted."""
        ...

    def mark_cluster_deleting(self, name: str) -> ClusterInfo:
        """Start deleting: like a resize to zero, after which the cluster is removed."""
        ...

    def remove_cluster(self, name: str) -> None:
        """Forget a cluster that has no nodes left. Raises ConflictError if it still has some."""
        ...

    def add_job(self, job: JobInfo, idempotency_key: str | None = None) -> JobInfo:
        """Record ``job`` and return it; or, for a key recorded before (a retried submit), return
        the earlier job. Raises ConflictError if the id is taken."""
        ...

    def get_job(self, job_id: str) -> JobInfo:
        """One job."""
        ...

    def find_job(self, idempotency_key: str) -> JobInfo | None:
        """The job recorded under an idempotency key, if any."""
        ...

    def list_jobs(self, *, experiment: str | None = None, cluster: str | None = None,
                  states: Iterable[JobState] | None = None) -> list[JobInfo]:
        """Jobs in submission order, optionally filtered."""
        ...

    def update_job(self, job_id: str, target: JobState, now: float, *,
                   nodes: list[int] | None = None, message: str | None = None,
                   exit_code: int | None = None, ends_as: JobState | None = None) -> JobInfo:
        """Move a job to ``target`` at time ``now`` (the scheduler's clock), updating its nodes
        as the module docstring says.

        ``nodes`` (for ``preparing``) are the nodes to claim ``process_count_per_node`` free slots
        on; ``message`` replaces the job's; ``exit_code`` goes with a final state; ``ends_as``
        (for ``terminating``) is the final state once its processes are gone.
        """
        ...

    def set_job_nodes(self, job_id: str, nodes: list[int], message: str | None = None
                      ) -> JobInfo:
        """Change the nodes of a started (preparing or running) elastic job: slots on nodes it
        gains are claimed, slots on nodes it loses released (a leaving node without jobs is
        removed); ``message`` replaces the job's.

        Raises ConflictError if the job is not started, or a node to claim lacks free slots.
        """
        ...

    def set_message(self, job_id: str, message: str) -> None:
        """Replace a job's message without changing its state (why a queued job waits)."""
        ...

    def set_launch(self, job_id: str, launch: dict[str, Any]) -> None:
        """Record the executor's handle of the job's current attempt (pids, ids)."""
        ...

    def set_front(self, job_id: str, url: str) -> None:
        """Record the URL of a deployment's front (which the service runs)."""
        ...

    def get_launch(self, job_id: str) -> dict[str, Any] | None:
        """The executor's handle of the current attempt, if it was started."""
        ...

    def remove_job(self, job_id: str) -> None:
        """Forget a job in a final state. Raises ConflictError if it is not final."""
        ...

    def revision(self) -> int:
        """How many writes the store committed since it was opened (in this process)."""
        ...

    def changes_since(self, revision: int) -> tuple[int, list[str]]:
        """The current :meth:`revision` and the ids of the jobs written after ``revision``,
        oldest change first (removed ones included)."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...
