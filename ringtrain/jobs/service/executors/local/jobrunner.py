"""The per-job runner process: preparation on each node, then the workers through `ringtrain run`.

The local executor starts ``python -m ringtrain.jobs.service.executors.local.jobrunner
<launch.json>`` in a session of its own, so the attempt outlives the server. The runner reports
its phase in ``launcher/status.json`` (written atomically); after a server restart that file,
together with whether this process still lives, tells the new server what became of the
attempt. Each node's ranks start the one way every executor starts them
(:mod:`ringtrain.jobs.service.executors.node_launch`).

No process may outlive the attempt: the runner first moves itself into the attempt's cgroup when
it has one, becomes a child subreaper (so orphans, even those that left its session, stay below
it), and kills whatever is left below it before it reports the end.

A job may fill its disk, and the runner must still report how it ended: it holds a reserve of
space from its start (``launcher/space.reserve``) and gives it up for its final status when the
disk refuses that; the output of ``ringtrain run`` reaches the log through the runner, which
keeps its last lines (:mod:`ringtrain.jobs.service.executors.local.runner_output`), and a
failure on a full disk is reported naming the disk, with those lines.

It imports nothing beyond the standard library and ringtrain's own stdlib-only modules (the
records it exchanges with the executor), to start quickly.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ringtrain.jobs.disk_space import SpaceReserve, full_note, is_disk_full
from ringtrain.jobs.envvars import NODE_INDEX
from ringtrain.jobs.errors import RecordError
from ringtrain.jobs.job_folder import JobFolder, prep_log_path
from ringtrain.jobs.service.executors.local import cgroups, procs
from ringtrain.jobs.service.executors.local.records import (
    HOSTS_FILE,
    RESERVE_FILE,
    RUNNER_LOG,
    LaunchSpec,
    RunnerStatus,
)
from ringtrain.jobs.service.executors.local.runner_output import RunnerOutput
from ringtrain.jobs.service.executors.local.storage_steps import StorageSteps
from ringtrain.jobs.service.executors.node_launch import (
    EXIT_NOT_STARTED,
    NODE_HOST,
    free_port,
    node_argv,
    run_outcome,
)
from ringtrain.jobs.service.executors.phase import Phase
from ringtrain.runner.threads import LOCAL_SIZE_VAR, default_threads_environ
from ringtrain.shm_names import SCOPE_VAR

_PR_SET_CHILD_SUBREAPER = 36
#: The service writes an elastic attempt's offered nodes to the hosts file, one
#: ``nodeN.localhost:SLOTS`` a line.
_NODE_HOST_LINE = re.compile(r"^node(\d+)\.localhost:\d+$", re.MULTILINE)
#: How often an elastic attempt rereads the offered nodes; how long its followers may take to
#: end after the driver did.
_HOSTS_POLL_S = 0.5
_FOLLOWER_WAIT_S = 20.0
#: The reserve for the final status (and what the full disk held back of the log).
RESERVE_BYTES = 256 * 1024
#: How long the final status is tried again on a full disk whose reserve something else took.
_STATUS_RETRY_S = 30.0
_STATUS_RETRY_EVERY_S = 0.5
#: How long the runner waits for the output of its ended children (an escaped process may hold
#: the pipe), and how many of the last lines a failure on a full disk quotes.
_OUTPUT_WAIT_S = 5.0
_QUOTED_LINES = 5


class JobRunner:
    """Runs one attempt as described by its launch file."""

    def __init__(self, launch: LaunchSpec):
        self.launch = launch
        self.job_dir = Path(launch.job_dir)
        self.stopping = False
        self._children: list[subprocess.Popen] = []
        self.output = RunnerOutput()
        self.reserve = SpaceReserve(self.job_dir / RESERVE_FILE, RESERVE_BYTES)
        #: Whether the disk refused a write of the runner's own (a status, a log file).
        self.disk_refused = False

    def on_signal(self, signum: int, _frame: Any) -> None:
        """Stop: pass the signal to the children (which may sit in sessions of their own)."""
        self.stopping = True
        for child in self._children:
            if child.poll() is None:
                child.send_signal(signum)

    def status(self, phase: Phase, exit_code: int | None = None, message: str = "") -> None:
        """Report ``phase`` (and, once exited, how) in the status file.

        On a full disk a passing phase goes unreported (the server keeps the last one it
        read), and the final report gets the reserve's room, tried again for up to
        :data:`_STATUS_RETRY_S` should something else take that room first.
        """
        record = RunnerStatus(phase, self.launch.attempt, os.getpid(), exit_code, message,
                              self.stopping)
        deadline = time.monotonic() + _STATUS_RETRY_S
        while True:
            try:
                record.write(self.job_dir)
                return
            except OSError as e:
                if not is_disk_full(e):
                    raise
                self.disk_refused = True
                if phase is not Phase.EXITED or time.monotonic() > deadline:
                    return  # the server finds the runner gone (or still at its last phase)
            if not self.reserve.release():
                time.sleep(_STATUS_RETRY_EVERY_S)

    def prepare(self) -> tuple[int, str]:
        """Run the preparation command once per node, all nodes at once: ``(0, "")``, or the
        first failing node's exit code and a message naming its log."""
        command = self.launch.job_preparation
        if not command:
            return 0, ""
        folder = JobFolder(self.job_dir)
        children = []
        for k in range(self.launch.node_count):
            with open(folder.prep_log(k, "stdout"), "wb") as out, \
                    open(folder.prep_log(k, "stderr"), "wb") as err:
                env = {**os.environ, NODE_INDEX: str(k)}
                try:
                    children.append(subprocess.Popen(["sh", "-c", command], stdout=out,
                                                     stderr=err, stdin=subprocess.DEVNULL,
                                                     env=env))
                except OSError as e:
                    self._children = children
                    return EXIT_NOT_STARTED, _not_started(f"job_preparation on node {k}", e)
        self._children = children
        codes = [p.wait() for p in children]
        for k, code in enumerate(codes):
            if code != 0:
                return code, (f"job_preparation failed on node {k} with exit code {code}; "
                              f"see {prep_log_path(k, 'stderr')}")
        return 0, ""

    def run_workers(self) -> tuple[int, str]:
        """Run the ranks: one ``ringtrain run`` per node in its per-node mode, node 0 driving
        (elastic: the nodes the service offers, as they come and go)."""
        if self.launch.min_nodes is None or self.launch.max_nodes is None:
            return self._run_nodes()
        return self._run_elastic_nodes()

    def _run_nodes(self) -> tuple[int, str]:
        """Every node's ``ringtrain run``, node 0 serving the rendezvous on loopback; node 0's
        outcome is the attempt's, unless another node failed by itself."""
        launch = self.launch
        endpoint = f"127.0.0.1:{free_port()}"
        ranks = launch.node_count * launch.process_count_per_node
        # The nodes are host names of this one machine: their ranks reduce through shared
        # memory, as `ringtrain run -np N` does, not over loopback TCP.
        env = (os.environ | machine_threads_environ(ranks, self.output.note)
               | {SCOPE_VAR: "machine"})
        children = []
        for k in range(launch.node_count):
            argv = node_argv(launch.runner, self.job_dir, k, launch.node_count,
                             launch.process_count_per_node, endpoint, launch.command)
            out = self.output.child_stdout()
            try:
                children.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=env,
                                                 stdout=out, stderr=out))
            except OSError as e:
                for child in children:  # the nodes started so far wait for this one
                    child.terminate()
                    _end(child)
                return EXIT_NOT_STARTED, f"{_not_started('`ringtrain run`', e)} (node {k})"
            self._children = children
        driver = children[0].wait()  # the job itself: as long as it trains
        codes = [driver, *(_end(child) for child in children[1:])]
        code, message = run_outcome(codes[0], self.job_dir)
        failed = next((k for k, c in enumerate(codes) if k and c), None)
        if code == 0 and failed is not None:  # a node that could not join or lost node 0
            return codes[failed], (f"`ringtrain run` of node {failed} exited with code "
                                   f"{codes[failed]}; see {RUNNER_LOG}")
        return code, message

    def _run_elastic_nodes(self) -> tuple[int, str]:
        """An elastic attempt: a ``ringtrain run`` for each node the service offers (the hosts
        file), started when it is offered and stopped when it is taken away; the first node's
        drives, and the attempt ends with it."""
        launch = self.launch
        assert launch.min_nodes is not None and launch.max_nodes is not None
        node_range = (launch.min_nodes, launch.max_nodes)
        endpoint = f"127.0.0.1:{free_port()}"
        running: dict[int, subprocess.Popen] = {}  # by cluster node index
        started = 0  # node ranks given so far: a node offered again joins as a new one
        # Sized for the most nodes the attempt may have, so that no number of them oversubscribes.
        env = os.environ | machine_threads_environ(
            launch.max_nodes * launch.process_count_per_node, self.output.note)

        def start(index: int) -> None:
            nonlocal started
            argv = node_argv(launch.runner, self.job_dir, started, launch.node_count,
                             launch.process_count_per_node, endpoint, launch.command,
                             node_range, name=NODE_HOST.format(index))
            started += 1
            out = self.output.child_stdout()
            running[index] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=env,
                                              stdout=out, stderr=out)
            self._children = list(running.values())

        first = launch.nodes[0]
        try:
            for index in launch.nodes:
                start(index)
            driver = running[first]
            while driver.poll() is None:
                if not self.stopping:
                    offered = self._offered_nodes()
                    for index in offered - running.keys():
                        start(index)
                    for index in running.keys() - offered - {first}:
                        running.pop(index).terminate()  # it says bye; the driver drops it
                try:
                    driver.wait(timeout=_HOSTS_POLL_S)
                except subprocess.TimeoutExpired:
                    pass
        except OSError as e:
            self.on_signal(signal.SIGTERM, None)
            return EXIT_NOT_STARTED, _not_started("`ringtrain run`", e)
        for child in self._children:  # followers end once the driver said the job is over
            _end(child)
        return run_outcome(driver.returncode, self.job_dir)

    def _offered_nodes(self) -> set[int]:
        """The nodes the service offers the attempt now (the hosts file it rewrites)."""
        try:
            text = (self.job_dir / HOSTS_FILE).read_text()
        except OSError:
            return set(self.launch.nodes)
        return {int(m.group(1)) for m in _NODE_HOST_LINE.finditer(text)}

    def kill_leftovers(self) -> int:
        """SIGKILL every process still below this runner (daemons the command started), then
        leave the attempt's cgroup and remove it; how many processes were below the runner."""
        left = procs.tree_pids(os.getpid())
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.launch.cgroup:
            try:
                cgroups.leave_and_remove(Path(self.launch.cgroup))
            except OSError as e:  # the service removes it when it releases the attempt
                self.output.note(f"job runner: cannot remove the cgroup {self.launch.cgroup} "
                                 f"({e.strerror})")
        return len(left)

    def run(self) -> int:
        """Staging and preparation, then the workers, then the uploads; the outcome goes to the
        status file, and, when the disk was full, names it with the last output."""
        self.reserve.make()  # before the job can fill the disk: the final report's room
        self.status(Phase.PREPARING)
        try:
            code, message = self._attempt()
        except OSError as e:  # a log file the runner could not make
            if not is_disk_full(e):
                raise
            self.disk_refused = True
            code, message = 1, f"the job runner could not write {e.filename}: {e.strerror}"
        if self.stopping:
            message = "stopped by the service"
            code = code or 1  # a stop is never a success
        left = self.kill_leftovers()
        if left:
            self.output.note(f"job runner: killed {left} processes the job left running")
        self.output.close(_OUTPUT_WAIT_S)
        if code != 0 and not self.stopping:
            message = self._with_full_disk(message)
        self.status(Phase.EXITED, code, message)
        self.reserve.release()
        self.output.flush()  # what the full disk held back, into the room the reserve left
        return code

    def _attempt(self) -> tuple[int, str]:
        """The attempt's steps: its exit code and message."""
        steps = (StorageSteps(self.launch.storage_plan, self.job_dir, self.launch.node_count)
                 if self.launch.storage_plan else None)
        code, message = 0, ""
        if steps is not None:
            code, message, staged = steps.stage()
            os.environ.update(staged)  # the ranks read their inputs' local copies
        if code == 0 and not self.stopping:
            code, message = self.prepare()
        if code == 0 and not self.stopping:
            self.status(Phase.RUNNING)
            if steps is not None:
                steps.start_watch()
            code, message = self.run_workers()
        if steps is not None:
            if not self.stopping and steps.plan.get("outputs"):
                self.status(Phase.UPLOADING)
            uploaded, why = steps.upload_all(final=not self.stopping)
            if code == 0 and uploaded != 0:
                code, message = uploaded, why
            steps.end()
        return code, message

    def _with_full_disk(self, message: str) -> str:
        """A failure's ``message``, led by the full disk that explains it and followed by the
        last output, when the job folder's disk is full now or refused a write of the runner's;
        else as it is."""
        note = full_note(self.job_dir)
        if note is None and not (self.disk_refused or self.output.refused):
            return message
        if note is None:
            note = f"the disk holding {self.job_dir} was full during the attempt"
        tail = " | ".join(self.output.tail()[-_QUOTED_LINES:])
        return f"{note}; {message}" + (f"; its last output: {tail}" if tail else "")


def machine_threads_environ(ranks: int, note: Callable[[str], None]) -> dict[str, str]:
    """``OMP_NUM_THREADS`` for an attempt whose ``ranks`` all run on this machine, whatever the
    nodes they are split into: the machine's cores shared by all of them (each node's
    ``ringtrain run`` alone would give its few ranks every core, and the nodes together would run
    more busy threads than there are cores). ``{}`` when the job's environment sets it; a line
    given to ``note`` (the runner's log) says what was chosen.
    """
    chosen = default_threads_environ({**os.environ, LOCAL_SIZE_VAR: str(ranks)})
    if chosen:
        note(f"jobrunner: each rank gets OMP_NUM_THREADS={next(iter(chosen.values()))}: this "
             f"machine's cores / the attempt's {ranks} rank(s) on it")
    return chosen


def _end(child: subprocess.Popen) -> int:
    """``child``'s exit code once it ended by itself within :data:`_FOLLOWER_WAIT_S`, or was
    killed then (a node process ends soon after node 0 did, or after it was told to)."""
    try:
        return child.wait(timeout=_FOLLOWER_WAIT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait()


def _not_started(what: str, e: OSError) -> str:
    hint = ""
    if e.errno == errno.E2BIG:
        hint = ("; the command line or the environment is larger than the kernel passes to a "
                "program: put a long script in a file of working_dir and run that")
    return f"could not start {what}: {e.strerror}{hint}"


def _become_subreaper(note: Callable[[str], None]) -> None:
    """Orphans of the job are re-parented to this process instead of init (Linux 3.4+)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as e:
        note(f"job runner: cannot become a child subreaper ({e}); processes that leave the "
             "job's session may outlive it")


def _enter_cgroup(path: str, note: Callable[[str], None]) -> None:
    try:
        cgroups.join(Path(path))
    except OSError as e:
        note(f"job runner: cannot enter the cgroup {path} ({e.strerror}); processes that "
             "leave the job's session may outlive it")


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m ringtrain.jobs.service.executors.local.jobrunner LAUNCH``."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        runner = JobRunner(LaunchSpec.read(Path(argv[0])))
    except RecordError as e:  # the output goes to launcher/launcher.log
        print(f"job runner: {e}", file=sys.stderr)
        return 2
    if runner.launch.cgroup:
        _enter_cgroup(runner.launch.cgroup, runner.output.note)
    _become_subreaper(runner.output.note)
    signal.signal(signal.SIGTERM, runner.on_signal)
    signal.signal(signal.SIGINT, runner.on_signal)
    return runner.run()


if __name__ == "__main__":
    sys.exit(main())
