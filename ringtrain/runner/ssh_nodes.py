"""The ssh launch's remote hosts: one follower per host, over one ssh connection each.

A launch with ``-H`` is a per-node launch whose driver (node 0) is the launcher, which starts
this machine's ranks itself; every other host gets a follower
(:mod:`ringtrain.runner.node_follower`): ``ringtrain run --node-stdio`` in per-node mode, run
over ssh in the portable part of the launcher's environment (``env.remote_environ``). The
follower sends its ranks' output back over the connection (:mod:`ringtrain.runner.node_output`)
and stops them when the connection closes (docs/architecture.md, "A launch").

:class:`SshNodes` is the driver's :class:`~ringtrain.runner.node_rendezvous.NodeRelay` for these
followers: a host that cannot be reached, whose follower does not register within
``--start-timeout``, or whose connection ends fails the ranks placed on it, with ssh's or the
follower's last words as the reason.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType

from ringtrain.contract import env as envlib
from ringtrain.contract.slots import SlotInfo
from ringtrain.runner import network
from ringtrain.runner import node_rendezvous as nodes
from ringtrain.runner.config import LaunchConfig
from ringtrain.runner.node_output import relay_frames
from ringtrain.runner.output import RankOutput
from ringtrain.runner.result import RankState
from ringtrain.runner.supervised_rank import start_thread

log = logging.getLogger(__name__)

_TAIL_LINES = 5  # a follower's last stderr lines, kept to explain its end
_EXIT_WAIT_S = 10.0  # how long the followers may take to exit once the job ended
_READER_JOIN_S = 2.0  # how long to wait for a reader thread once its process is gone


@dataclass(frozen=True)
class FollowerLaunch:
    """How a launch starts its followers; only the node, host and slots differ between them.

    Attributes:
        config: the launch's configuration (the command, ssh options, timeouts).
        python: the interpreter, at the same path on every host.
        cwd: where the follower and its ranks start (the same path on every host).
        environ: the launcher's environment: ssh runs in it, and its portable part goes to
            the follower.
        endpoint: where the launcher's store listens, ``ADDR:PORT``.
    """

    config: LaunchConfig
    python: str
    cwd: str
    environ: Mapping[str, str]
    endpoint: str


def follower_argv(launch: FollowerLaunch, node: int, nnodes: int, hostname: str,
                  slots: int) -> list[str]:
    """The ``ssh`` command line that runs the follower of node ``node`` (1 and up: the launcher
    is node 0) on ``hostname`` (as given in ``-H``; also its ``--node-name``), with ``slots``
    ranks planned there at start and ``nnodes`` nodes so far, the launcher's included."""
    config = launch.config
    run = [launch.python, "-m", "ringtrain.cli", "run", "--nnodes", str(max(nnodes, node + 1)),
           "--node-rank", str(node), "--nproc-per-node", str(slots), "--node-name", hostname,
           "--rdzv-endpoint", launch.endpoint, "--rdzv-timeout", f"{config.start_timeout_s:g}",
           "--start-timeout", f"{config.start_timeout_s:g}", "--node-stdio"]
    if config.horovod_compat:
        run.append("--horovod-compat")  # the shim is where ringtrain is on that host
    if config.verbose:
        run.append("--verbose")
    assignments = " ".join(f"{k}={shlex.quote(v)}"
                           for k, v in envlib.remote_environ(launch.environ).items())
    remote = (f"cd {shlex.quote(launch.cwd)} && env {assignments} "
              f"{shlex.join([*run, '--', *config.command])}")
    argv = ["ssh", "-T",
            "-o", "BatchMode=yes",  # never prompt: a missing key fails instead of hanging
            "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR",  # hides "Permanently added ... to known hosts", keeps errors
            "-o", f"ConnectTimeout={max(1, math.ceil(config.start_timeout_s))}"]
    if config.ssh_port is not None:
        argv += ["-p", str(config.ssh_port)]
    if config.ssh_identity_file is not None:
        argv += ["-i", config.ssh_identity_file]
    return argv + [hostname, remote]


class _Follower:
    """One remote host's follower: the ssh client that runs it there, and what it said."""

    def __init__(self, node: int, hostname: str, argv: list[str], launch: FollowerLaunch,
                 sink: RankOutput):
        self.node = node
        self.hostname = hostname
        self.deadline = time.monotonic() + launch.config.start_timeout_s  # to register by
        self.failure: str | None = None  # why it is gone, once it is
        self.cancelled = False  # stopped by the launcher before it registered
        self._tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self._threads: list[threading.Thread] = []
        try:
            # A session of its own, as a local rank's: Ctrl-C reaches only the launcher.
            self._popen: subprocess.Popen[bytes] | None = subprocess.Popen(
                argv, env=dict(launch.environ), cwd=launch.cwd, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as e:  # no ssh client
            self._popen = None
            self.failure = f"cannot run ssh ({e})"
            return
        self._threads = [
            start_thread(f"node{node}-output", self._pump_output, self._popen.stdout, sink),
            start_thread(f"node{node}-stderr", self._pump_stderr, self._popen.stderr),
        ]
        log.debug("node %d: started its follower on %s over ssh (pid %d)", node, hostname,
                  self._popen.pid)

    def _said(self, line: bytes) -> None:
        """A line of the follower's (or ssh's, or the login shell's) own: passed on, and kept
        to explain a failure."""
        text = line.decode(errors="replace").rstrip()
        if text.strip():
            self._tail.append(text.strip())
            log.warning("%s: %s", self.hostname, text)

    def _pump_output(self, pipe, sink: RankOutput) -> None:
        with pipe:
            try:
                relay_frames(pipe, sink, self._said)
            except ValueError as e:
                log.error("%s: the ranks' output from there broke off (%s); the rest of it "
                          "is lost", self.hostname, e)
                while pipe.read(1 << 16):  # keep reading: a full pipe would block the follower
                    pass

    def _pump_stderr(self, pipe) -> None:
        with pipe:
            for line in iter(pipe.readline, b""):
                self._said(line)

    def check(self, joined: bool, now: float, start_timeout_s: float) -> None:
        """Note whether the follower is gone: its connection ended, or it did not register
        within the start timeout (then it is killed)."""
        if self.failure is not None:
            return
        assert self._popen is not None  # failure is set when there is no process
        code = self._popen.poll()
        if code is not None:
            self._threads[1].join(_READER_JOIN_S)  # its last words, read to the end
            tail = " / ".join(self._tail)
            why = f"the ssh connection to {self.hostname} ended (exit code {code})"
            if joined:
                self.failure = f"{why}: {tail}" if tail else why
            else:
                self.failure = tail or f"{why} before its follower registered"
        elif not joined and now >= self.deadline:
            why = f"did not report in within {start_timeout_s:g} s (--start-timeout)"
            tail = " / ".join(self._tail)
            self.failure = f"{why}: {tail}" if tail else why
            self.kill()

    def cancel(self) -> None:
        """Stop it before it registered: nothing of it is wanted any more."""
        self.cancelled = True
        self.failure = "stopped before its host's follower started"
        self.kill()

    def kill(self) -> None:
        """Kill the ssh client; the follower sees its connection close and stops its ranks."""
        if self._popen is None or self._popen.poll() is not None:  # its pid may be reused
            return
        try:
            os.killpg(self._popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def end(self, wait_s: float) -> None:
        """Let the follower exit (it does once the job ended), at most ``wait_s``; then close
        its connection, and kill ssh if that does not end it either. Every line it sent has
        then been passed on."""
        if self._popen is None:
            return
        try:
            self._popen.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            log.warning("%s: its follower did not end within %g s; closing its connection",
                        self.hostname, wait_s)
            try:
                if self._popen.stdin is not None:
                    self._popen.stdin.close()  # end-of-file: the follower stops
                self._popen.wait(timeout=_READER_JOIN_S)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
                try:
                    self._popen.wait(timeout=_READER_JOIN_S)
                except subprocess.TimeoutExpired:
                    log.warning("%s: ssh did not exit after SIGKILL; leaving it", self.hostname)
        for thread in self._threads:
            thread.join(_READER_JOIN_S)


class SshNodes:
    """The followers of an ssh launch's remote hosts, one per host, started as ranks are
    planned there; the driver's :class:`~ringtrain.runner.node_rendezvous.NodeRelay`.

    Use as a context manager: leaving it kills whatever ssh client is left.
    """

    output_here = True  # the followers send their ranks' output here

    def __init__(self, registry: nodes.NodeRegistry, launch: FollowerLaunch, sink: RankOutput,
                 local_hosts: frozenset[str], nnodes: int):
        """Args:
            registry: the nodes' registrations in the launcher's store (launcher: node 0).
            sink: where the followers' ranks' output goes.
            local_hosts: the hosts known to be this machine (``NetworkPlan.local_hosts``);
                others are looked up when first met.
            nnodes: the nodes the launch starts with, the launcher included.
        """
        self._registry = registry
        self._launch = launch
        self._sink = sink
        self._nnodes = nnodes
        self._locality = dict.fromkeys(local_hosts, True)  # host -> this machine
        self._addresses: frozenset[str] | None = None
        self._followers: dict[int, _Follower] = {}  # by node rank
        self._by_host: dict[str, int] = {}  # the latest follower of each host
        self._placed: dict[int, int] = {}  # rank number -> node
        self._stopping: set[int] = set()  # rank numbers asked to stop

    def node_of(self, slot: SlotInfo) -> int | None:
        """The node that starts the rank in ``slot``: ``None`` for a host of this machine,
        else its host's follower, started now when the host has none that lives."""
        host = slot.hostname
        if self._is_local(host):
            return None
        node = self._by_host.get(host)
        if node is None or self._followers[node].failure is not None:
            node = len(self._followers) + 1
            argv = follower_argv(self._launch, node, self._nnodes, host, slot.local_size)
            self._followers[node] = _Follower(node, host, argv, self._launch, self._sink)
            self._by_host[host] = node
        return node

    def _is_local(self, hostname: str) -> bool:
        # Hosts the network plan did not see (found by elastic discovery later) are looked up.
        if hostname not in self._locality:
            if self._addresses is None:
                self._addresses = frozenset(network.interface_addresses().values())
            self._locality[hostname] = network.is_this_machine(hostname, self._addresses)
        return self._locality[hostname]

    # -- the NodeRelay ---------------------------------------------------------------------------

    def refresh(self) -> None:
        """Read the followers' registrations and reports, and notice those that are gone."""
        if not self._followers:
            return
        self._registry.refresh()
        now = time.monotonic()
        for follower in self._followers.values():
            follower.check(self._registry.joined(follower.node), now,
                           self._launch.config.start_timeout_s)

    def request_start(self, node_rank: int, request: nodes.StartRequest) -> None:
        """Ask node ``node_rank``'s follower to start a rank (it reads the request once it
        registered)."""
        self._placed[request.number] = node_rank
        self._registry.request_start(node_rank, request)

    def request_stop(self, number: int, kill: bool) -> None:
        """Ask the follower of rank ``number`` to stop it; a follower that has not registered
        and whose every rank is to stop is not waited for."""
        self._registry.request_stop(number, kill)
        self._stopping.add(number)
        node = self._placed[number]
        follower = self._followers[node]
        if (follower.failure is None and not self._registry.joined(node)
                and all(n in self._stopping for n, k in self._placed.items() if k == node)):
            follower.cancel()

    def started(self, number: int) -> bool:
        """Whether rank ``number`` reported in on its follower."""
        return self._registry.started(number)

    def outcome(self, number: int) -> nodes.RelayedOutcome | None:
        """How rank ``number`` ended: as its follower said, or as its follower's end says."""
        relayed = self._registry.outcome(number)
        if relayed is not None:
            return relayed
        follower = self._followers[self._placed[number]]
        if follower.failure is None:
            return None
        if follower.cancelled:
            return nodes.RelayedOutcome(RankState.STOPPED, None, None, follower.failure)
        state = RankState.FAILED if self._registry.started(number) else RankState.START_FAILED
        return nodes.RelayedOutcome(state, None, None, follower.failure)

    # -- the end -----------------------------------------------------------------------------------

    def finish(self, exit_code: int) -> None:
        """Tell the followers the job ended with ``exit_code`` and wait (bounded) for them to
        exit, so that every line their ranks printed has been passed on."""
        if not self._followers:
            return
        try:
            self._registry.finish(exit_code, nodes.BYE_WAIT_S)
        except Exception as e:  # the store's errors are RuntimeErrors or DistStoreErrors
            log.warning("cannot tell the followers that the job ended (%s)", e)
        deadline = time.monotonic() + _EXIT_WAIT_S
        for follower in self._followers.values():
            follower.end(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> SshNodes:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for follower in self._followers.values():
            follower.kill()  # normally every one has exited by now
            follower.end(0.0)
