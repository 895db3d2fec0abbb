"""The per-job runner process: preparation on each node, then the workers through `ringtrain run`.

The local executor starts ``python -m ringtrain.jobs.executors.jobrunner <launch.json>`` in a
session of its own, so the attempt outlives the server. The runner reports its phase in
``launcher/status.json`` (written atomically); after a server restart that file, together with
whether this process still lives, tells the new server what became of the attempt.
It imports nothing beyond the standard library and ringtrain's own stdlib-only modules (the
records it exchanges with the executor), to start quickly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from ringtrain.jobs.envvars import NODE_INDEX
from ringtrain.jobs.errors import RecordError
from ringtrain.jobs.executors.phase import Phase
from ringtrain.jobs.executors.records import LaunchSpec, RunnerStatus


class JobRunner:
    """Runs one attempt as described by its launch file.

    Args:
        launch: the launch file's contents.
    """

    def __init__(self, launch: LaunchSpec):
        self.launch = launch
        self.job_dir = Path(launch.job_dir)
        self.stopping = False
        self._children: list[subprocess.Popen] = []

    def on_signal(self, signum: int, _frame: Any) -> None:
        """Stop: pass the signal to the children (which may sit in sessions of their own)."""
        self.stopping = True
        for child in self._children:
            if child.poll() is None:
                child.send_signal(signum)

    def status(self, phase: Phase, exit_code: int | None = None, message: str = "") -> None:
        """Report ``phase`` (and, once exited, how) in the status file."""
        RunnerStatus(phase, self.launch.attempt, os.getpid(), exit_code, message,
                     self.stopping).write(self.job_dir)

    def prepare(self) -> tuple[int, str]:
        """Run the preparation command once per node, all nodes at once.

        Returns:
            ``(0, "")``, or the first failing node's exit code and a message naming its log.
        """
        command = self.launch.job_preparation
        if not command:
            return 0, ""
        prep = self.job_dir / "prep"
        procs = []
        for k in range(self.launch.node_count):
            with open(prep / f"node.{k}.stdout", "wb") as out, \
                    open(prep / f"node.{k}.stderr", "wb") as err:
                env = {**os.environ, NODE_INDEX: str(k)}
                procs.append(subprocess.Popen(["sh", "-c", command], stdout=out, stderr=err,
                                              stdin=subprocess.DEVNULL, env=env))
        self._children = procs
        codes = [p.wait() for p in procs]
        for k, code in enumerate(codes):
            if code != 0:
                return code, (f"job_preparation failed on node {k} with exit code {code}; "
                              f"see prep/node.{k}.stderr")
        return 0, ""

    def run_workers(self) -> tuple[int, str]:
        """Run ``ringtrain run`` with node_count × process_count_per_node ranks."""
        total = self.launch.node_count * self.launch.process_count_per_node
        argv = [*self.launch.runner, "-np", str(total), "-H", f"localhost:{total}",
                "--output-filename", str(self.job_dir / "stdouterr"),
                "sh", "-c", self.launch.command]
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        self._children = [proc]
        code = proc.wait()
        if code == 0:
            return 0, ""
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return code, f"`ringtrain run` {how}; see stdouterr/rank.N/stderr"

    def run(self) -> int:
        """Preparation, then the workers; the outcome goes to the status file."""
        self.status(Phase.PREPARING)
        code, message = self.prepare()
        if code == 0 and not self.stopping:
            self.status(Phase.RUNNING)
            code, message = self.run_workers()
        if self.stopping:
            message = "stopped by the service"
            code = code or 1  # a stop is never a success
        self.status(Phase.EXITED, code, message)
        return code


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m ringtrain.jobs.executors.jobrunner <launch.json>``."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        runner = JobRunner(LaunchSpec.read(Path(argv[0])))
    except RecordError as e:  # the output goes to launcher/launcher.log
        print(f"job runner: {e}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, runner.on_signal)
    signal.signal(signal.SIGINT, runner.on_signal)
    return runner.run()


if __name__ == "__main__":
    sys.exit(main())
