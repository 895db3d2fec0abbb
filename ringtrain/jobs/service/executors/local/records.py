"""What the local executor and its job runners leave each other, as typed JSON records: the
launch handle stored with the job (:class:`RunnerHandle`, so that a restarted server finds the
attempt again), the launch file (:class:`LaunchSpec`) and the status file (:class:`RunnerStatus`).

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
#: Space the job runner holds from its start for its final report, given up when the disk fills.
RESERVE_FILE = f"{LAUNCHER}/space.reserve"
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
        cgroup: the attempt's cgroup folder, if it has one.
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
        """The handle :meth:`to_json` gave. Raises RecordError for a missing or wrong field."""
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
        attempt: the attempt (0 for the first).
        runner: the command prefix that launches the ranks (``ringtrain run``'s).
        nodes: the cluster nodes the attempt holds.
        cgroup: the cgroup folder the runner moves itself into first, if any.
        min_nodes: elastic attempts: the fewest nodes to keep running on (``None``: a fixed
            world of node_count nodes); ``max_nodes``: the most to grow to.
        storage_plan: the attempt's storage plan (inputs to stage, outputs to upload), if any.
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
    storage_plan: str | None = None

    def write(self, path: Path) -> None:
        """Write the launch file (before the runner starts, so never read half-written)."""
        path.write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def read(cls, path: Path) -> LaunchSpec:
        """Read a launch file. Raises RecordError if it is missing, not JSON, or lacks a field."""
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
                   max_nodes=field(data, "max_nodes", (int, type(None)), None),
                   storage_plan=field(data, "storage_plan", (str, type(None)), None))


@dataclass(frozen=True)
class RunnerStatus:
    """The status file: where the job runner of one attempt is.

    Attributes:
        phase: preparing, running or exited (never lost: a runner that writes is not lost).
        attempt: the attempt it runs; a retry's runner writes a new file.
        exit_code, message, stopped: once exited: 0 for success, why it failed (naming the log
            to read), and whether the service stopped it.
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
        """The last status the job's runner wrote, or ``None`` if it wrote none yet. Raises
        RecordError if the file is not JSON, lacks a field or has a wrong one."""
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
