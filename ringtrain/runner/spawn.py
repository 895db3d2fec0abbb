"""Starting and stopping one rank's process: the task wrapper, locally or over ssh.

Each rank is ``python -m ringtrain.runner.task`` (see :mod:`ringtrain.runner.task`) wrapped
around the user's command, started directly for this machine's hosts and through ``ssh`` for the
others. The launcher holds the wrapper's stdin open and never writes to it: closing it is the
stop request, and it closes by itself when the launcher dies.
"""

from __future__ import annotations

import math
import os
import shlex
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ringtrain.runner.plan import RankSpec


@dataclass(frozen=True)
class SpawnOptions:
    """How ranks are started (the same for every rank of a launch)."""

    python: str  # the interpreter that runs the task wrapper, here and on remote hosts
    cwd: str  # ranks start here; remote hosts must have the same path
    token: str  # the task wrapper's marker token
    grace_s: float  # the wrapper's SIGTERM -> SIGKILL delay
    connect_timeout_s: float
    ssh_port: int | None = None
    ssh_identity_file: str | None = None


def task_argv(options: SpawnOptions, command: Sequence[str]) -> list[str]:
    """The task wrapper's command line around ``command``."""
    return [options.python, "-m", "ringtrain.runner.task", "--token", options.token,
            "--grace", f"{options.grace_s:g}", "--", *command]


def ssh_argv(hostname: str, options: SpawnOptions, env: Mapping[str, str],
             command: Sequence[str]) -> list[str]:
    """The ``ssh`` command line that runs ``command`` under the task wrapper on ``hostname``.

    The remote shell runs ``cd CWD && env K=V... PYTHON -m ringtrain.runner.task ... COMMAND``.
    """
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    remote = (f"cd {shlex.quote(options.cwd)} && env {assignments} "
              + shlex.join(task_argv(options, command)))
    argv = ["ssh", "-T",
            "-o", "BatchMode=yes",  # never prompt: a missing key fails instead of hanging
            "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR",  # hides "Permanently added ... to known hosts", keeps errors
            "-o", f"ConnectTimeout={max(1, math.ceil(options.connect_timeout_s))}"]
    if options.ssh_port is not None:
        argv += ["-p", str(options.ssh_port)]
    if options.ssh_identity_file is not None:
        argv += ["-i", options.ssh_identity_file]
    return argv + [hostname, remote]


class RankProcess:
    """A started rank: the local task wrapper, or the ssh client of a remote one."""

    def __init__(self, spec: RankSpec, command: Sequence[str], options: SpawnOptions,
                 launcher_environ: Mapping[str, str]):
        """Start the rank.

        Args:
            spec: the rank to start.
            command: the user's command.
            options: how to start it.
            launcher_environ: the launcher's environment (that of the ssh client).

        Raises:
            OSError: the process could not be created (e.g. no ``ssh`` on PATH).
        """
        self.spec = spec
        if spec.local:
            argv, environ = task_argv(options, command), spec.env
        else:
            argv, environ = ssh_argv(spec.hostname, options, spec.env, command), launcher_environ
        # A session of its own: a Ctrl-C on the terminal reaches only the launcher, which then
        # stops every rank in order.
        self.popen = subprocess.Popen(
            argv, env=dict(environ), cwd=options.cwd, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        #: the user command's pid, once the (local) wrapper reported it
        self.child_pid: int | None = None

    def request_stop(self) -> None:
        """Ask the rank to stop: the wrapper sees end-of-file and SIGTERMs the command."""
        try:
            if self.popen.stdin is not None:
                self.popen.stdin.close()
        except OSError:  # already gone
            pass

    def kill(self) -> None:
        """Kill the rank now: the wrapper's or ssh's process group, and a local command's."""
        groups = [self.popen.pid]
        if self.spec.local and self.child_pid is not None:
            groups.append(self.child_pid)
        for pgid in groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
