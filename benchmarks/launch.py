"""Shared by the benchmarks: run a script under `ringtrain run` and print rank 0's JSON line."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile


def run_under_launcher(script: str, np: int, worker_args: list[str]) -> int:
    """Launch ``script --worker ARGS`` on ``np`` ranks; print the last JSON line rank 0 printed.

    Returns:
        The launcher's exit code (its stderr is shown when it is not 0).
    """
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "ringtrain.cli", "run", "-np", str(np),
               "--output-filename", out, sys.executable, os.path.abspath(script), "--worker",
               *worker_args]
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode:
            sys.stderr.write(done.stderr)
            return done.returncode
        with open(os.path.join(out, "rank.0", "stdout")) as f:
            lines = [line for line in f if line.startswith("{")]
        print(lines[-1].strip())
    return 0
