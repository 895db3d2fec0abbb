"""The local executor: a cluster's nodes are process slots on this host.

Each attempt runs in a job runner process (:mod:`ringtrain.jobs.service.executors.local.jobrunner`)
started in a new session, so it survives the server. Its launch handle records the runner's pid and
start time; a restarted server uses them to tell whether the attempt still runs, and the status file
for how it ended. Where cgroup v2 allows it, each attempt also gets a cgroup, which is how its
processes are killed at its end and on a forced stop, wherever they moved (see
:mod:`ringtrain.jobs.service.executors.local.cgroups`); the runner's process tree and the job's
environment mark are swept as well, and are all there is without cgroups.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ringtrain import proc_stat
from ringtrain.jobs.disk_space import full_note
from ringtrain.jobs.errors import JobsError, RecordError
from ringtrain.jobs.files.safe_open import open_path
from ringtrain.jobs.job_folder import LAUNCHER, WORKING_DIR
from ringtrain.jobs.models import JobInfo, NodeInfo
from ringtrain.jobs.service.executors.base import Observation
from ringtrain.jobs.service.executors.local import cgroups, procs
from ringtrain.jobs.service.executors.local.records import (
    HOSTS_FILE,
    LAUNCH_FILE,
    RESERVE_FILE,
    RUNNER_LOG,
    LaunchSpec,
    RunnerHandle,
    RunnerStatus,
)
from ringtrain.jobs.service.executors.node_launch import NODE_HOST, with_world
from ringtrain.jobs.service.executors.phase import Phase
from ringtrain.jobs.service.share import Share, python_path_env
from ringtrain.jobs.service.storage_plans import StorageSettings

log = logging.getLogger(__name__)

#: How jobs start their workers: the runner's command line, never an import of the trainer.
DEFAULT_RUNNER = (sys.executable, "-m", "ringtrain.cli", "run")


class LocalExecutor:
    """Runs attempts as process trees on this host.

    Args:
        share: the share holding the job folders.
        runner: the command prefix that launches ranks (horovodrun's flags follow it).
        use_cgroups: give each attempt a cgroup where this process may create them.
    """

    def __init__(self, share: Share, runner: Sequence[str] = DEFAULT_RUNNER,
                 use_cgroups: bool = True, storage: StorageSettings | None = None):
        self.share = share
        self.storage = storage
        self.runner = tuple(runner)
        self._cgroups = cgroups.JobCgroups.detect(share.root) if use_cgroups else None
        # Runners this process started: polling them reaps them (a dead child is a zombie that
        # /proc would still list). Runners adopted after a restart are watched through /proc.
        self._children: dict[str, subprocess.Popen] = {}

    def start(self, job: JobInfo, nodes: list[NodeInfo]) -> RunnerHandle:
        job_dir = Path(job.job_dir)
        if job.attempt > 0:
            self.share.archive_attempt(job.id, job.attempt - 1)
        launch_file = job_dir / LAUNCH_FILE
        cgroup = self._create_cgroup(job)
        spec = job.spec
        min_nodes, max_nodes = spec.node_range if spec.elastic else (None, None)
        if spec.elastic:  # the job runner starts a node's `ringtrain run` once it is offered
            self._write_hosts(job, [n.index for n in nodes])
        LaunchSpec(job_dir=str(job_dir), attempt=job.attempt, command=spec.command,
                   node_count=spec.node_count,
                   process_count_per_node=spec.process_count_per_node,
                   job_preparation=spec.job_preparation, runner=self.runner,
                   nodes=tuple(n.index for n in nodes), cgroup=cgroup, min_nodes=min_nodes,
                   max_nodes=max_nodes,
                   storage_plan=self.storage.write_plan(job) if self.storage else None,
                   ).write(launch_file)
        env = python_path_env({**os.environ, **self.share.job_environ(job)})
        with open(job_dir / RUNNER_LOG, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ringtrain.jobs.service.executors.local.jobrunner",
                 str(launch_file)],
                cwd=job_dir / WORKING_DIR, env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True)
        self._children[job.id] = proc
        log.info("job %s attempt %d: runner pid %d", job.id, job.attempt, proc.pid)
        return RunnerHandle(proc.pid, proc_stat.start_ticks(proc.pid), job.attempt, cgroup)

    def load_handle(self, data: dict[str, Any]) -> RunnerHandle:
        return RunnerHandle.from_json(data)

    def set_nodes(self, job: JobInfo, launch: RunnerHandle | None, nodes: list[int]) -> None:
        self._write_hosts(job, nodes)

    def _write_hosts(self, job: JobInfo, nodes: list[int]) -> None:
        """What the attempt's discovery script prints from now on: its nodes as hosts."""
        path = Path(job.job_dir) / HOSTS_FILE
        slots = job.spec.process_count_per_node
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(f"{NODE_HOST.format(n)}:{slots}\n" for n in nodes))
        os.replace(tmp, path)  # the script never prints half a list

    def poll(self, job: JobInfo, launch: RunnerHandle | None) -> Observation:
        return with_world(job, self._observe(job, launch))

    def _observe(self, job: JobInfo, launch: RunnerHandle | None) -> Observation:
        if launch is None:
            return Observation(Phase.LOST, message="the service stopped while starting the job")
        try:
            seen = self._status(job, launch)
            if seen is not None and seen.phase is Phase.EXITED:
                return seen
            if self._alive(job.id, launch):
                return seen or Observation(Phase.PREPARING)
            # It ended; it may have written its status between the two reads above.
            seen = self._status(job, launch)
        except RecordError as e:
            # The runner writes its status atomically, so this is damage from outside; nothing
            # tells how the attempt goes, so it ends (and the job's message says why).
            return Observation(Phase.LOST, message=str(e))
        if seen is not None and seen.phase is Phase.EXITED:
            return seen
        message = f"the job runner (pid {launch.pid}) ended without reporting an exit status"
        full = full_note(Path(job.job_dir))  # the likely reason it could not
        return Observation(Phase.LOST, message=f"{full}; {message}" if full else message)

    def stop(self, job: JobInfo, launch: RunnerHandle | None, force: bool) -> None:
        group = self._group(job.id, launch)
        if not force and group is not None:
            # One SIGTERM, to the job runner only: it passes it to its child, and `ringtrain run`
            # stops its ranks. Signalling the whole group too would hit each process twice, and
            # a second SIGTERM inside a handler that is waiting on children can deadlock it.
            os.kill(group, signal.SIGTERM)
            return
        if force and launch is not None and launch.cgroup:
            cgroups.kill(Path(launch.cgroup))
        procs.signal_job(job.id, group, signal.SIGKILL if force else signal.SIGTERM)

    def release(self, job: JobInfo, launch: RunnerHandle | None) -> None:
        # Whatever the attempt left running (a daemon a rank forked, say) ends with it.
        left = 0
        if launch is not None and launch.cgroup:
            left = cgroups.kill(Path(launch.cgroup))
        left = max(left, procs.signal_job(job.id, self._group(job.id, launch), signal.SIGKILL))
        if launch is not None and launch.cgroup:
            cgroups.remove(Path(launch.cgroup))
        if left:
            log.warning("job %s: killed %d leftover processes", job.id, left)
        _remove_reserve(Path(job.job_dir))
        proc = self._children.pop(job.id, None)
        if proc is not None:
            proc.wait()
        if self.storage is not None:  # a runner killed before it could remove its plan
            self.storage.remove_plan(job)

    def _create_cgroup(self, job: JobInfo) -> str | None:
        if self._cgroups is None:
            return None
        try:
            return str(self._cgroups.create(f"{job.id}-{job.attempt}"))
        except OSError as e:  # the process tree and the marker still find its processes
            log.warning("job %s: no cgroup for attempt %d (%s)", job.id, job.attempt, e)
            return None

    def _status(self, job: JobInfo, launch: RunnerHandle) -> Observation | None:
        """What the attempt's status file says, or ``None`` if it said nothing yet.

        Raises:
            RecordError: the status file is malformed.
        """
        status = RunnerStatus.read(Path(job.job_dir))
        if status is None or status.attempt != launch.attempt:
            return None
        return Observation(status.phase, status.exit_code, status.message)

    def _alive(self, job_id: str, launch: RunnerHandle) -> bool:
        proc = self._children.get(job_id)
        if proc is not None:
            return proc.poll() is None
        return proc_stat.is_alive(launch.pid, launch.start_ticks)

    def _group(self, job_id: str, launch: RunnerHandle | None) -> int | None:
        # Signal the runner's group only while the runner lives: a dead leader's pid may have
        # been reused. Its orphans still carry the job's marker and are found that way.
        if launch is not None and self._alive(job_id, launch):
            return launch.pid
        return None


def _remove_reserve(job_dir: Path) -> None:
    """The space reserve of a job runner killed before it removed it itself (the folder is the
    job's: no link in it is followed)."""
    try:
        with open_path(job_dir, LAUNCHER) as launcher:
            os.unlink(Path(RESERVE_FILE).name, dir_fd=launcher)
    except (OSError, JobsError):  # none there (the usual case), or not the runner's to remove
        pass
