"""One node of a job on Ray: what runs a node's preparation and its ranks.

The Ray node's agent (:mod:`.agent`) holds one :class:`NodeRunner` per node of an attempt placed
on its machine. Each runs the spec's ``job_preparation``, then its ranks through ``ringtrain run``
in its per-node mode, as every executor does (node 0 serves the rendezvous on a port it picks).
A job asking for GPUs gets, in every rank's ``CUDA_VISIBLE_DEVICES``, the GPUs Ray assigned to
the node's bundle. Logs go straight into the job's folder on the share as they are written.

A node that does not see the job's folder, or whose machine sets ``RINGTRAIN_RAY_SCRATCH``, works
in a private copy under that folder (else the system's temporary folder), carried through Ray by
:mod:`ringtrain.jobs.service.executors.ray.transfer`: its answers to :meth:`NodeRunner.status`
carry its new log bytes and, once it exited, its outputs.

The agent's worker imports this module before the agent starts: nothing heavy (no pydantic).
Ranks run in sessions of their own and get SIGKILL when the agent's process dies: a lost node,
or a killed agent, leaves no rank behind.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ringtrain.jobs.envvars import NODE_INDEX, input_var
from ringtrain.jobs.service.executors.node_launch import (
    EXIT_NOT_STARTED,
    free_port,
    node_argv,
    run_outcome,
)
from ringtrain.jobs.service.executors.phase import Phase
from ringtrain.jobs.service.executors.ray import transfer

#: Set on a Ray node's machine (in its raylet's environment): the folder its jobs work in, in
#: private copies, even where it sees the service's share.
SCRATCH_VAR = "RINGTRAIN_RAY_SCRATCH"
#: How long a node without the share waits for the next piece of its working dir, a node for
#: node 0's rendezvous address, and a GPU node for Ray to say which GPUs it has.
_WORKDIR_WAIT_S = 60.0
_RENDEZVOUS_WAIT_S = 60.0
_GPU_WAIT_S = 60.0

_PR_SET_PDEATHSIG = 1
# Args: the agent's pid, the process group of one rank (or preparation). Ends with the group.
_WATCHDOG = ('while kill -0 "$1" 2>/dev/null && kill -0 -- "-$2" 2>/dev/null; do sleep 0.5; '
             'done; kill -KILL -- "-$2" 2>/dev/null; exit 0')


@dataclass(frozen=True)
class NodePlan:
    """What one node of an attempt runs.

    Attributes:
        job_dir: the job's folder on the share (as this node sees it).
        node: the node's place in the job, 0..node_count-1 (its bundle index).
        environ: the job's variables (spec environment, job id, folders, inputs and outputs).
        inputs: the spec's inputs that are paths (not URLs), by name.
        placement_group: the name of the attempt's placement group.
        first_agent: the actor name of node 0's agent, which serves the rendezvous address;
            ``first_key`` is node 0's key there.
        node_range: an elastic attempt's fewest and most nodes (``None``: a fixed one).
        name: the host name of the node's ranks (an elastic attempt's world file names it).
    """

    job_dir: str
    node: int
    node_count: int
    process_count_per_node: int
    command: str
    job_preparation: str | None
    environ: dict[str, str] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)
    placement_group: str = ""
    gpus: int = 0
    first_agent: str = ""
    first_key: str = ""
    node_range: tuple[int, int] | None = None
    name: str | None = None


@dataclass(frozen=True)
class NodeStatus:
    """Where a node of an attempt is; ``exit_code`` once exited (0 = every rank succeeded).

    A node working in a private copy also says whether it waits for the working dir, and
    carries chunks of its logs and, once exited, outputs; ``pending`` names the files with bytes
    past them: the node's files are all in the share once it answered exited with none pending.
    """

    phase: Phase
    exit_code: int | None = None
    message: str = ""
    needs_workdir: bool = False
    workdir_received: int = 0
    missing_inputs: tuple[str, ...] = ()
    chunks: tuple[transfer.Chunk, ...] = ()
    pending: tuple[str, ...] = ()


class NodeRunner:
    """One node of one attempt, run by the agent of the Ray node it was placed on.

    Args:
        rendezvous_of: node 0's rendezvous address, ``None`` while node 0 has not started.
    """

    def __init__(self, plan: NodePlan,
                 rendezvous_of: Callable[[], tuple[str, int] | None]):
        import ray  # inside a Ray worker: present

        self.plan = plan
        self.rendezvous_of = rendezvous_of
        self.ip = ray.util.get_node_ip_address()
        self.port = free_port(self.ip) if plan.node == 0 else 0
        self._lock = threading.Lock()
        self._status = NodeStatus(Phase.PREPARING)
        self._children: list[subprocess.Popen] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        # The folder the node works in: the job's folder on the share, or a private copy.
        self.work_dir = Path(plan.job_dir)
        self._private = False
        self._copy_lock = threading.Lock()
        self._receiver: transfer.TarReceiver | None = None
        self._workdir_problem: str | None = None  # why the executor sent none
        self._workdir_came = threading.Event()  # whole, or refused, or the node stops
        self._workdir_progress = time.monotonic()
        self._missing_inputs: tuple[str, ...] = ()

    def rendezvous(self) -> tuple[str, int]:
        """The address rank 0 serves the rendezvous store at (node 0 only)."""
        return self.ip, self.port

    def run(self) -> None:
        """Start preparation and then the ranks in the background (at most once)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="node-runner",
                                                daemon=True)
                self._thread.start()

    def status(self, offsets: dict[str, int] | None = None) -> NodeStatus:
        """Where the node is; from a private copy, with what the share does not hold yet
        (``offsets``: the size of each log and output file the share holds)."""
        status = self._status  # before reading the files: exited means they are complete
        if not self._private:
            return status
        offsets = offsets or {}
        budget = transfer.ANSWER_BYTES
        chunks, pending = transfer.new_chunks(self.work_dir, offsets, transfer.LOG_FOLDERS,
                                              budget, transfer.LOG_CHUNK)
        if status.phase is Phase.EXITED:  # outputs may change while the ranks run
            budget -= sum(len(data) for _, _, data in chunks)
            more, left = transfer.new_chunks(self.work_dir, offsets, transfer.OUTPUT_FOLDERS,
                                             budget)
            chunks, pending = chunks + more, pending + left
        receiver = self._receiver
        return NodeStatus(status.phase, status.exit_code, status.message,
                          needs_workdir=(not self._workdir_came.is_set()
                                         and status.phase is Phase.PREPARING),
                          workdir_received=receiver.received if receiver else 0,
                          missing_inputs=self._missing_inputs, chunks=tuple(chunks),
                          pending=tuple(pending))

    def receive_workdir(self, piece: transfer.Piece | str) -> None:
        """A piece of the private copy's tar from :class:`transfer.PrivateCopy` (``wd/``,
        ``inputs/<name>/``), or why the executor has none; a piece not at the offset the node
        holds is dropped (it asks again)."""
        with self._copy_lock:
            if self._workdir_came.is_set() or self._receiver is None:
                return
            self._workdir_progress = time.monotonic()
            if isinstance(piece, str):
                self._workdir_problem = piece
                self._workdir_came.set()
                return
            try:
                whole = self._receiver.take(piece)
            except OSError as e:
                self._workdir_problem = f"cannot write it in {self.work_dir}: {e}"
                whole = True
            if whole:
                self._workdir_came.set()

    def stop(self, force: bool) -> None:
        """SIGTERM (``force``: SIGKILL) every process the node started, by process group."""
        self._stopping = True
        self._workdir_came.set()  # a node waiting for its working dir stops waiting
        self._signal(signal.SIGKILL if force else signal.SIGTERM)

    def discard(self) -> None:
        """Kill what is left and remove the private copy: the service has what it needs of it."""
        self.stop(True)
        if self._private:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def _signal(self, sig: int) -> None:
        with self._lock:
            children = list(self._children)
        for child in children:
            if child.poll() is None:
                try:
                    os.killpg(child.pid, sig)
                except ProcessLookupError:
                    pass

    def _run(self) -> None:
        try:
            code, message = self._locate() or self._prepare()
            if code == 0 and not self._stopping:
                self._status = NodeStatus(Phase.RUNNING)
                code, message = self._ranks()
        except Exception as e:  # e.g. node 0's agent gone before it gave the rendezvous address
            self._signal(signal.SIGKILL)
            code, message = 1, f"node {self.plan.node} ({self.ip}) failed: {e!r}"[:500]
        if self._stopping:
            code, message = code or 1, "stopped by the service"
        self._status = NodeStatus(Phase.EXITED, code, message)

    def _locate(self) -> tuple[int, str] | None:
        """Use the job's folder on the share, or make a private copy; why not, if neither."""
        scratch = os.environ.get(SCRATCH_VAR)
        if not scratch and (self.work_dir / "wd").is_dir():
            return None
        root = Path(scratch or tempfile.gettempdir()) / "ringtrain-ray"
        root.mkdir(parents=True, exist_ok=True)
        self.work_dir = Path(tempfile.mkdtemp(
            prefix=f"{self.plan.placement_group}.node{self.plan.node}.", dir=root))
        # Inputs this machine sees at their path are read there, as on a node with the share.
        self._missing_inputs = tuple(sorted(
            name for name, path in self.plan.inputs.items() if not os.path.exists(path)))
        tar = self.work_dir / ".private-copy.tar"
        with self._copy_lock:
            self._receiver = transfer.TarReceiver(tar)
            self._workdir_progress = time.monotonic()
        self._private = True
        while not self._workdir_came.wait(0.2):
            if time.monotonic() - self._workdir_progress > _WORKDIR_WAIT_S:
                break
        problem = self._workdir_problem
        if problem is None and not self._workdir_came.is_set():
            problem = f"no piece of it within {_WORKDIR_WAIT_S:g} s"
        if problem is None and self._stopping:
            problem = "stopped by the service"
        if problem is None:
            try:
                transfer.unpack(tar, self.work_dir)
                for sub in ("wd", "prep", "stdouterr", "launcher"):
                    (self.work_dir / sub).mkdir(exist_ok=True)
                for value in self._rebased().values():
                    if os.path.dirname(value) == str(self.work_dir / "outputs"):
                        os.makedirs(value, exist_ok=True)
            except (OSError, tarfile.TarError) as e:
                problem = f"cannot unpack it in {self.work_dir}: {e}"
        tar.unlink(missing_ok=True)
        if problem is None:
            return None
        return EXIT_NOT_STARTED, (
            f"node {self.plan.node} ({self.ip}) does not see the job's folder "
            f"{self.plan.job_dir} and could not get a private copy of it: {problem}")[:1000]

    def _rebased(self) -> dict[str, str]:
        """The job's variables, with paths into its share folder moved to the private copy, and
        the inputs this machine does not see moved to their copies."""
        if not self._private:
            return self.plan.environ
        shared = self.plan.job_dir.rstrip("/")
        env = {key: str(self.work_dir) + value[len(shared):]
               if value == shared or value.startswith(shared + "/") else value
               for key, value in self.plan.environ.items()}
        for name in self._missing_inputs:
            copy = transfer.input_arcname(name, self.plan.inputs[name])
            env[input_var(name)] = str(self.work_dir / copy)
        return env

    def _prepare(self) -> tuple[int, str]:
        command, k = self.plan.job_preparation, self.plan.node
        if not command:
            return 0, ""
        prep = self.work_dir / "prep"
        env = {**self._base_env(), NODE_INDEX: str(k)}
        try:
            proc = self._spawn(command, env, prep / f"node.{k}.stdout", prep / f"node.{k}.stderr")
        except OSError as e:
            return EXIT_NOT_STARTED, f"could not start job_preparation on node {k}: {e.strerror}"
        code = proc.wait()
        if code != 0:
            return code, (f"job_preparation failed on node {k} ({self.ip}) with exit code {code}; "
                          f"see prep/node.{k}.stderr")
        return 0, ""

    def _ranks(self) -> tuple[int, str]:
        """The node's ranks, through ``ringtrain run --nnodes ... --node-rank K``."""
        plan = self.plan
        master_addr, master_port = self._rendezvous()
        gpus = {"CUDA_VISIBLE_DEVICES": self._gpu_ids()} if plan.gpus else {}
        argv = node_argv((sys.executable, "-m", "ringtrain.cli", "run"), self.work_dir,
                         plan.node, plan.node_count, plan.process_count_per_node,
                         f"{master_addr}:{master_port}", plan.command, plan.node_range,
                         plan.name)
        launcher_log = self.work_dir / "launcher" / f"node.{plan.node}.log"
        launcher_log.parent.mkdir(parents=True, exist_ok=True)
        try:
            proc = self._spawn(argv, {**self._base_env(), **gpus}, launcher_log, launcher_log)
        except OSError as e:
            return EXIT_NOT_STARTED, f"could not start `ringtrain run` on node {plan.node}: " \
                                     f"{e.strerror}"
        code = proc.wait()
        if plan.node != 0 and code != 0:  # a follower failed itself: lost node 0, say
            return code, (f"node {plan.node} ({self.ip}): `ringtrain run` exited with code "
                          f"{code}; see launcher/node.{plan.node}.log")
        return run_outcome(code, self.work_dir)

    def _rendezvous(self) -> tuple[str, int]:
        """Node 0's rendezvous address (node 0 may start after this node). Raises TimeoutError
        if node 0 did not start within the wait."""
        deadline = time.monotonic() + _RENDEZVOUS_WAIT_S
        while (address := self.rendezvous_of()) is None:
            if time.monotonic() > deadline or self._stopping:
                raise TimeoutError(f"node 0 gave no rendezvous address within "
                                   f"{_RENDEZVOUS_WAIT_S:g} s")
            time.sleep(0.05)
        return address

    def _gpu_ids(self) -> str:
        """The GPUs Ray assigned to the node's bundle, as ``CUDA_VISIBLE_DEVICES`` lists them:
        read by a task that takes them all, since the agent holds none (a bundle's GPUs stay
        the same while its group exists)."""
        import ray
        from ray.util import get_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        where = PlacementGroupSchedulingStrategy(get_placement_group(self.plan.placement_group),
                                                 placement_group_bundle_index=self.plan.node)
        task = ray.remote(_assigned_gpus).options(num_cpus=0, num_gpus=self.plan.gpus,
                                                  scheduling_strategy=where)
        return ",".join(str(i) for i in ray.get(task.remote(), timeout=_GPU_WAIT_S))

    def _base_env(self) -> dict[str, str]:
        bin_dir = os.path.dirname(sys.executable)  # `python` in a command is the agent's
        env = {**os.environ, **self._rebased(), "PYTHONUNBUFFERED": "1"}
        env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"
        return env

    def _spawn(self, command: str | list[str], env: dict[str, str], stdout: Path,
               stderr: Path) -> subprocess.Popen:
        argv = ["sh", "-c", command] if isinstance(command, str) else command
        with open(stdout, "ab") as out, open(stderr, "ab") as err:
            proc = subprocess.Popen(argv, cwd=self.work_dir / "wd",
                                    env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    start_new_session=True, preexec_fn=_die_with_parent)
        with self._lock:
            self._children.append(proc)
        if self._stopping:  # a stop that came while it started
            os.killpg(proc.pid, signal.SIGKILL)
        # PR_SET_PDEATHSIG reaches the shell only; the watchdog kills the whole process group
        # once the agent's process is gone, whatever its ranks started below them.
        subprocess.Popen(["sh", "-c", _WATCHDOG, "watchdog", str(os.getpid()), str(proc.pid)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
        return proc


def _assigned_gpus() -> list:
    import ray

    return ray.get_gpu_ids()


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: SIGKILL when the agent's thread that started it
    # (which waits for it) goes away, e.g. with a killed agent or raylet.
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
