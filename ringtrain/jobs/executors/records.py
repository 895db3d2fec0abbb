"""What the local executor and its job runners leave each other, as typed records.

Five records cross a process boundary, each as JSON:

- :class:`RunnerHandle`, the launch handle: the job runner's pid and start time, stored with the
  job so that a restarted server finds the attempt again;
- :class:`LaunchSpec`, ``launcher/launch.json``: what the job runner is to run;
- :class:`RunnerStatus`, ``launcher/status.json``: the job runner's phase, and how it ended;
- ``launcher/result.json`` (:func:`read_result`): how the ranks ended, as ``ringtrain run
  --result-file`` reports it (the job runner reads it for the user's own exit code);
- ``launcher/world.json`` (:func:`read_world`): an elastic attempt's current world and the
  workers it lost, as ``ringtrain run --world-file`` writes it.

The last two are ``ringtrain run``'s files, whose format is :mod:`ringtrain.run_files`, the
module the runner writes them with.

A server may meet a handle or status file of a job started before an upgrade, so the field names
never change, and fields added later need a default. Reading refuses anything else with a
:class:`~ringtrain.jobs.errors.RecordError` that names the file and the field. This module, like
the job runner, uses only the standard library.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from ringtrain.jobs.errors import RecordError
from ringtrain.jobs.executors.phase import Phase
from ringtrain.jobs.job_folder import LAUNCHER
from ringtrain.jobs.record_file import read_record_file
from ringtrain.run_files import RunFileError, RunReport, WorldReport, parse_json

#: The job runner's files, relative to the job's folder.
LAUNCH_FILE = f"{LAUNCHER}/launch.json"
STATUS_FILE = f"{LAUNCHER}/status.json"
#: The job runner's own stdout and stderr (and ``ringtrain run``'s, which it does not redirect).
RUNNER_LOG = f"{LAUNCHER}/launcher.log"
RESULT_FILE = f"{LAUNCHER}/result.json"
#: Elastic attempts: the nodes the service offers (the job runner starts a node's
#: ``ringtrain run`` for each), and the worlds ``ringtrain run --world-file`` writes as they form.
HOSTS_FILE = f"{LAUNCHER}/hosts.txt"
WORLD_FILE = f"{LAUNCHER}/world.json"

_REQUIRED = object()
R = TypeVar("R")


@dataclass(frozen=True)
class RunnerHandle:
    """The local executor's launch handle of one attempt.

    Attributes:
        pid: the job runner's pid, which also leads its process group.
        start_ticks: its start time from /proc, telling it from a later process with the same
            pid; ``None`` if it was gone before the time could be read.
        attempt: the attempt it runs.
        cgroup: the attempt's cgroup folder, if it has one
            (:mod:`ringtrain.jobs.executors.cgroups`).
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
        source = "the launch handle stored with the job"
        data = _object(data, source)
        return cls(pid=_field(data, "pid", int, source),
                   start_ticks=_field(data, "start_ticks", (int, type(None)), source, None),
                   attempt=_field(data, "attempt", int, source),
                   cgroup=_field(data, "cgroup", (str, type(None)), source, None))


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
        data = _read_object(path, source)
        if data is None:
            raise RecordError(f"{source} does not exist")
        return cls(job_dir=_field(data, "job_dir", str, source),
                   attempt=_field(data, "attempt", int, source),
                   command=_field(data, "command", str, source),
                   node_count=_field(data, "node_count", int, source),
                   process_count_per_node=_field(data, "process_count_per_node", int, source),
                   job_preparation=_field(data, "job_preparation", (str, type(None)), source,
                                          None),
                   runner=_items(data, "runner", str, source),
                   nodes=_items(data, "nodes", int, source),
                   cgroup=_field(data, "cgroup", (str, type(None)), source, None),
                   min_nodes=_field(data, "min_nodes", (int, type(None)), source, None),
                   max_nodes=_field(data, "max_nodes", (int, type(None)), source, None))


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
        path = job_dir / STATUS_FILE
        source = f"the job runner's status file {path}"
        data = _read_object(path, source)
        if data is None:
            return None
        raw_phase = _field(data, "phase", str, source)
        try:
            phase = Phase(raw_phase)
        except ValueError:
            raise RecordError(f"{source} has an unknown phase {raw_phase!r}") from None
        fields = dict(attempt=_field(data, "attempt", int, source),
                      pid=_field(data, "pid", int, source),
                      exit_code=_field(data, "exit_code", (int, type(None)), source, None),
                      message=_field(data, "message", str, source, ""),
                      stopped=_field(data, "stopped", bool, source, False))
        try:
            return cls(phase, **fields)
        except ValueError as e:  # fields that contradict each other
            raise RecordError(f"{source}: {e}") from None


def read_result(job_dir: Path) -> RunReport | None:
    """The result file ``ringtrain run`` wrote, or ``None`` if it wrote none (it could not start).

    Raises:
        RecordError: the file is not JSON or lacks a field.
    """
    return _read_run_file(job_dir / RESULT_FILE, "the result file", RunReport.from_json)


def read_world(job_dir: Path) -> WorldReport | None:
    """An elastic attempt's latest world, or ``None`` before the first one formed.

    Raises:
        RecordError: the file is not JSON or lacks a field.
    """
    return _read_run_file(job_dir / WORLD_FILE, "the world file", WorldReport.from_json)


def _read_run_file(path: Path, what: str, parse: Callable[[Any], R]) -> R | None:
    source = f"{what} {path}"
    raw = read_record_file(path, source)
    if raw is None:
        return None
    try:
        return parse(parse_json(raw))
    except RunFileError as e:
        raise RecordError(f"{source}: {e}") from None


def _read_object(path: Path, source: str) -> Mapping[str, Any] | None:
    """The JSON object in ``path``, or ``None`` if there is no such file."""
    raw = read_record_file(path, source)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise RecordError(f"{source} is not valid JSON ({e})") from None
    return _object(data, source)


def _object(data: Any, source: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise RecordError(f"{source} must be a JSON object, not {type(data).__name__}")
    return data


def _field(data: Mapping[str, Any], key: str, kinds: type | tuple[type, ...], source: str,
           default: Any = _REQUIRED) -> Any:
    """``data[key]`` if it has one of ``kinds``; ``default`` if absent (when there is one)."""
    if key not in data:
        if default is _REQUIRED:
            raise RecordError(f"{source} lacks the field {key!r}")
        return default
    value = data[key]
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    # JSON's true and false are ints to isinstance, but never a pid or a count.
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        wanted = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
        raise RecordError(f"{source}: field {key!r} must be {wanted}, not {value!r}")
    return value


def _items(data: Mapping[str, Any], key: str, kind: type, source: str) -> tuple[Any, ...]:
    """``data[key]`` as a tuple, if it is a list of ``kind``."""
    value = _field(data, key, list, source)
    if not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
        raise RecordError(f"{source}: field {key!r} must be a list of {kind.__name__}, "
                          f"not {value!r}")
    return tuple(value)
