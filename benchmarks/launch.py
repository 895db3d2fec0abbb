"""Shared by the benchmarks: run a script under `ringtrain run` and read rank 0's JSON line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile


def launch_json(script: str, np: int, worker_args: list[str]) -> dict:
    """Launch ``script --worker ARGS`` on ``np`` ranks and return the last JSON line of rank 0.

    Raises:
        RuntimeError: the launch failed (its stderr is in the message).
    """
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "ringtrain.cli", "run", "-np", str(np),
               "--output-filename", out, sys.executable, os.path.abspath(script), "--worker",
               *worker_args]
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode:
            raise RuntimeError(f"{os.path.basename(script)} on {np} ranks exited with "
                               f"{done.returncode}:\n{done.stderr}")
        with open(os.path.join(out, "rank.0", "stdout")) as f:
            lines = [line for line in f if line.startswith("{")]
    return json.loads(lines[-1])


def run_under_launcher(script: str, np: int, worker_args: list[str]) -> int:
    """Launch ``script --worker ARGS`` on ``np`` ranks; print the last JSON line rank 0 printed.

    Returns:
        The launcher's exit code (its stderr is shown when it is not 0).
    """
    try:
        print(json.dumps(launch_json(script, np, worker_args)))
    except RuntimeError as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    return 0


def mpirun_command(np: int) -> list[str] | None:
    """Open MPI's ``mpirun`` for ``np`` ranks of this host, or None where it or mpi4py is not
    installed (``pip install ringtrain[bench]``)."""
    mpirun = shutil.which("mpirun") or os.path.join(os.path.dirname(sys.executable), "mpirun")
    try:
        import mpi4py  # noqa: F401 - only whether it is installed
    except ImportError:
        return None
    if not os.path.exists(mpirun):
        return None
    cmd = [mpirun, "--oversubscribe", "-np", str(np)]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd
