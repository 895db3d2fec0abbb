"""What the service observed: clusters, nodes, jobs and files, as the API returns them."""

from __future__ import annotations

from pydantic import BaseModel, Field

from ringtrain.jobs.models.spec import JobSpec
from ringtrain.jobs.models.states import AllocationState, JobState, NodeState


class NodeInfo(BaseModel):
    """One node of a cluster: its state, and the jobs whose ranks (or replicas) hold its slots.

    Jobs share a node as Batch AI and Ray share a machine's cores: each takes
    ``process_count_per_node`` of the cluster's ``slots``.
    """

    cluster: str
    index: int
    state: NodeState
    jobs: list[str] = Field(default_factory=list,
                            description="The jobs holding slots on it, in the order they came.")
    slots_used: int = Field(0, description="The process slots those jobs hold.")


class NodeCounts(BaseModel):
    """How many nodes of a cluster are in each state."""

    idle: int = 0
    preparing: int = 0
    running: int = 0
    leaving: int = 0
    unusable: int = 0


class MachineInfo(BaseModel):
    """One machine of a cluster attached to machines run by someone else, as its backend sees
    it (a Ray cluster: Ray's node table)."""

    id: str = Field(description="The backend's id of the machine (Ray's node id).")
    address: str
    alive: bool
    cpus: float = Field(description="CPUs the node has.")
    cpus_free: float = Field(description="CPUs no task, actor or placement group holds.")
    gpus: float = 0.0
    gpus_free: float = 0.0


class ClusterInfo(BaseModel):
    """A cluster as it stands: its target size, allocation state and node states."""

    name: str
    backend: str
    slots: int = Field(description="Process slots per node.")
    free_slots: int = Field(0, description="Slots no job holds, on nodes jobs may use (neither "
                                           "leaving nor unusable).")
    target_nodes: int = Field(description="Nodes asked for by create or the last resize.")
    max_nodes: int | None = Field(None, description="The most nodes a resize may set.")
    current_nodes: int = Field(description="Nodes that exist now, leaving ones included.")
    allocation_state: AllocationState
    node_counts: NodeCounts
    created_at: float
    address: str | None = Field(None, description="Where an attached backend's machines are.")
    machines: list[MachineInfo] = Field(
        default_factory=list, description="An attached backend's machines when it was asked "
                                          "(one cluster's answer only; empty in lists).")


class JobInfo(BaseModel):
    """A job as it stands. Times are seconds since the epoch; ``None`` until they happen."""

    id: str
    cluster: str
    spec: JobSpec
    state: JobState
    attempt: int = Field(0, description="Retries used so far (0 on the first attempt).")
    created_at: float
    started_at: float | None = Field(None, description="When the current attempt got its nodes.")
    running_at: float | None = Field(None, description="When the current attempt's workers began.")
    ended_at: float | None = None
    exit_code: int | None = None
    message: str = ""
    nodes: list[int] = Field(default_factory=list, description="Cluster nodes of the attempt.")
    terminate_requested_at: float | None = None
    ends_as: JobState | None = Field(
        None, description="While terminating: the final state (failed past max_wall_clock_time).")
    job_dir: str = Field("", description="The job's folder on the share.")
    serves: str | None = Field(
        None, description="A deployment: the job whose saved model its replicas serve.")
    front: str | None = Field(
        None, description="A deployment of several replicas: the URL of the front the service "
                          "runs for it (round robin over the healthy replicas).")

    @property
    def name(self) -> str:
        """The spec's name, or the id when the spec has none."""
        return self.spec.name or self.id


class FileInfo(BaseModel):
    """A file in a job's folder; ``path`` is relative to the folder, with '/' separators."""

    path: str
    size: int
    modified_at: float
