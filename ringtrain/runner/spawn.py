"""Starting and stopping one rank's process on this machine: the task wrapper.

Each rank is ``python -m ringtrain.runner.task`` (see :mod:`ringtrain.runner.task`) wrapped
around the user's command, started by the agent of the machine it runs on: the launcher's for
its own hosts, a follower's on every other host (:mod:`ringtrain.runner.ssh_nodes`). The agent
holds the wrapper's stdin open and never writes to it: closing it is the stop request, and it
closes by itself when the agent dies.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from ringtrain.runner.plan import RankSpec


@dataclass(frozen=True)
class SpawnOptions:
    """How ranks are started (the same for every rank of a launch)."""

    python: str  # the interpreter that runs the task wrapper
    cwd: str  # ranks start here
    token: str  # the task wrapper's marker token
    grace_s: float  # the wrapper's SIGTERM -> SIGKILL delay


def task_argv(options: SpawnOptions, command: Sequence[str]) -> list[str]:
    """The task wrapper's command line around ``command``."""
    return [options.python, "-m", "ringtrain.runner.task", "--token", options.token,
            "--grace", f"{options.grace_s:g}", "--", *command]


class RankProcess:
    """A started rank: its task wrapper, a child of this process."""

    def __init__(self, spec: RankSpec, command: Sequence[str], options: SpawnOptions):
        """Start the rank ``spec`` (its ``env`` is the process's whole environment).

        Raises:
            OSError: the process could not be created.
        """
        self.spec = spec
        # A session of its own: a Ctrl-C on the terminal reaches only the launcher, which then
        # stops every rank in order.
        self.popen = subprocess.Popen(
            task_argv(options, command), env=dict(spec.env), cwd=options.cwd,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True)
        #: the user command's pid, once the wrapper reported it
        self.child_pid: int | None = None

    def request_stop(self) -> None:
        """Ask the rank to stop: the wrapper sees end-of-file and SIGTERMs the command."""
        try:
            if self.popen.stdin is not None:
                self.popen.stdin.close()
        except OSError:  # already gone
            pass

    def kill(self) -> None:
        """Kill the rank now: the wrapper's process group and the command's."""
        groups = [self.popen.pid]
        if self.child_pid is not None:
            groups.append(self.child_pid)
        for pgid in groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
