"""Specs (what was requested), states with their transition tables, and infos (what is)."""

from ringtrain.jobs.models.info import (
    ClusterInfo,
    FileInfo,
    JobInfo,
    MachineInfo,
    NodeCounts,
    NodeInfo,
)
from ringtrain.jobs.models.spec import ClusterSpec, JobSpec, parse_job_spec
from ringtrain.jobs.models.specfile import load_job_spec
from ringtrain.jobs.models.states import (
    AllocationState,
    JobState,
    NodeState,
    Priority,
    check_job_transition,
    check_node_transition,
)

__all__ = [
    "AllocationState", "ClusterInfo", "ClusterSpec", "FileInfo", "JobInfo", "JobSpec", "JobState",
    "MachineInfo", "NodeCounts", "NodeInfo", "NodeState", "Priority",
    "check_job_transition", "check_node_transition", "load_job_spec", "parse_job_spec",
]
