"""What the local executor and its job runners leave each other, as typed records.

Three records cross a process boundary, each as JSON:

- :class:`RunnerHandle`, the launch handle: the job runner's pid and start time, stored with the
  job so that a restarted server finds the attempt again;
- :class:`LaunchSpec`, ``launcher/launch.json``: what the job runner is to run;
- :class:`RunnerStatus`, ``launcher/status.json``: the job runner's phase, and how it ended.

``ringtrain run``'s own result and world files are every executor's:
:mod:`ringtrain.jobs.service.executors.node_launch` reads them.

A server may meet a handle or status file of a job started before an upgrade, so the field names
never change, and fields added later need a default. Reading refuses anything else with a
:class:`~ringtrain.jobs.errors.RecordError` that names the file and the field. This module, like
the job runner, uses only the standard library.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ringtrain.jobs.errors import RecordError
from ringtrain.jobs.files.record_file import naming, read_record
from ringtrain.jobs.job_folder import LAUNCHER
from ringtrain.jobs.service.executors.phase import Phase
from ringtrain.record_fields import FieldError, field, items, json_object

#: The job runner's files, relative to the job's folder.
LAUNCH_FILE = f"{LAUNCHER}/launch.json"
STATUS_FILE = f"{LAUNCHER}/status.json"
#: The job runner's own stdout and stderr (and ``ringtrain run``'s, which it does not redirect).
RUNNER_LOG = f"{LAUNCHER}/launcher.log"
#: Elastic attempts: the nodes the service offers (the job runner starts a node's
#: ``ringtrain run`` for each).
HOSTS_FILE = f"{LAUNCHER}/hosts.txt"


@dataclass(frozen=True)
class RunnerHandle:
    """The local executor's launch handle of one attempt.

    Attributes:
        pid: the job runner's pid, which also leads its process group.
        start_ticks: its start time from /proc, telling it from a later process with the same
            pid; ``None`` if it was gone before the time could be read.
        attempt: the attempt it runs.
        cgroup: the attempt's cgroup folder, if it has one
            (:mod:`ringtrain.jobs.service.executors.local.cgroups`).
    """

    pid: int
    start_ticks: int | None
    attempt: int
    cgroup: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored with the job."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> RunnerHandle:
        """The handle :meth:`to_json` gave.

        Raises:
            RecordError: ``data`` lacks a field or has one of the wrong type.
        """
        with naming("the launch handle stored with the job"):
            data = json_object(data)
            return cls(pid=field(data, "pid", int),
                       start_ticks=field(data, "start_ticks", (int, type(None)), None),
                       attempt=field(data, "attempt", int),
                       cgroup=field(data, "cgroup", (str, type(None)), None))


@dataclass(frozen=True)
class LaunchSpec:
    """The launch file: one attempt as the job runner is to run it.

    Attributes:
        job_dir: the job's folder on the share.
        attempt: the attempt (0 for the first).
        command: the shell command every rank runs.
        node_count: nodes of the attempt.
        process_count_per_node: ranks per node.
        job_preparation: the shell command run once per node first, if any.
        runner: the command prefix that launches the ranks (``ringtrain run``'s).
        nodes: the cluster nodes the attempt holds.
        cgroup: the cgroup folder the runner moves itself into first, if any.
        min_nodes: elastic attempts: the fewest nodes to keep running on (``None``: a fixed
            world of node_count nodes).
        max_nodes: elastic attempts: the most nodes to grow to.
    """

    job_dir: str
    attempt: int
    command: str
    node_count: int
    process_count_per_node: int
    job_preparation: str | None
    runner: tuple[str, ...]
    nodes: tuple[int, ...]
    cgroup: str | None = None
    min_nodes: int | None = None
    max_nodes: int | None = None

    def write(self, path: Path) -> None:
        """Write the launch file (before the runner starts, so never read half-written)."""
        path.write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def read(cls, path: Path) -> LaunchSpec:
        """Read a launch file.

        Raises:
            RecordError: the file is missing, not JSON, or lacks a field.
        """
        source = f"the launch file {path}"
        spec = read_record(path.parent, path.name, source, cls._from_json)
        if spec is None:
            raise RecordError(f"{source} does not exist")
        return spec

    @classmethod
    def _from_json(cls, data: Any) -> LaunchSpec:
        data = json_object(data)
        return cls(job_dir=field(data, "job_dir", str), attempt=field(data, "attempt", int),
                   command=field(data, "command", str), node_count=field(data, "node_count", int),
                   process_count_per_node=field(data, "process_count_per_node", int),
                   job_preparation=field(data, "job_preparation", (str, type(None)), None),
                   runner=items(data, "runner", str), nodes=items(data, "nodes", int),
                   cgroup=field(data, "cgroup", (str, type(None)), None),
                   min_nodes=field(data, "min_nodes", (int, type(None)), None),
                   max_nodes=field(data, "max_nodes", (int, type(None)), None))


@dataclass(frozen=True)
class RunnerStatus:
    """The status file: where the job runner of one attempt is.

    Attributes:
        phase: preparing, running or exited (never lost: a runner that writes is not lost).
        attempt: the attempt it runs; a retry's runner writes a new file.
        pid: the job runner's pid.
        exit_code: once exited: 0 for success.
        message: once exited: why it failed, naming the log to read.
        stopped: once exited: whether the service stopped it.
    """

    phase: Phase
    attempt: int
    pid: int
    exit_code: int | None = None
    message: str = ""
    stopped: bool = False

    def __post_init__(self) -> None:
        if self.phase is Phase.LOST:
            raise ValueError("a job runner never reports itself lost")
        if self.phase is Phase.EXITED and self.exit_code is None:
            raise ValueError("an exited status needs an exit code")

    def write(self, job_dir: Path) -> None:
        """Replace the job's status file atomically (a reader never sees half of it)."""
        path = job_dir / STATUS_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({**asdict(self), "phase": self.phase.value}))
        os.replace(tmp, path)

    @classmethod
    def read(cls, job_dir: Path) -> RunnerStatus | None:
        """The last status the job's runner wrote, or ``None`` if it wrote none yet.

        Raises:
            RecordError: the file is not JSON, lacks a field or has a wrong one.
        """
        return read_record(job_dir, STATUS_FILE,
                           f"the job runner's status file {job_dir / STATUS_FILE}", cls._from_json)

    @classmethod
    def _from_json(cls, data: Any) -> RunnerStatus:
        data = json_object(data)
        raw_phase = field(data, "phase", str)
        try:
            phase = Phase(raw_phase)
        except ValueError:
            raise FieldError(f"has an unknown phase {raw_phase!r}") from None
        fields = dict(attempt=field(data, "attempt", int), pid=field(data, "pid", int),
                      exit_code=field(data, "exit_code", (int, type(None)), None),
                      message=field(data, "message", str, ""),
                      stopped=field(data, "stopped", bool, False))
        try:
            return cls(phase, **fields)
        except ValueError as e:  # fields that contradict each other
            raise FieldError(str(e)) from None
