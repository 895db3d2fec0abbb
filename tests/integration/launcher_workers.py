"""Worker scripts and helpers for the launcher's integration tests.

The workers are plain Python (no torch), written to the test's directory, so that a launch
costs only process start-up. They coordinate through files in their working directory, which
is shared by local and "remote" (ssh to 127.0.0.2) ranks alike.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ringtrain.runner.config import load_config
from ringtrain.runner.launch import launch
from ringtrain.runner.result import RunResult
from tests.waiting import wait_until

# Records what a worker sees of the contract and checks that the store listens where it says.
ENV_DUMP = """
import json, os, socket, sys
KEYS = ["HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
        "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME", "HOROVOD_START_TIMEOUT",
        "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
        "MASTER_ADDR", "MASTER_PORT", "RINGTRAIN_LAUNCHER_STORE", "RINGTRAIN_RUN_ID",
        "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "PYTHONUNBUFFERED", "PATH", "VIRTUAL_ENV",
        "HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY",
        "HOROVOD_TIMELINE", "HOROVOD_TIMELINE_MARK_CYCLES", "HOROVOD_STALL_CHECK_DISABLE",
        "RINGTRAIN_TEST_VAR"]
info = {k: os.environ.get(k) for k in KEYS}
info.update(cwd=os.getcwd(), argv=sys.argv[1:], ssh=os.environ.get("SSH_CONNECTION"))
socket.create_connection((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])), 10).close()
with open("env.%s.json" % os.environ["HOROVOD_RANK"], "w") as f:
    json.dump(info, f)
print("rank", os.environ["HOROVOD_RANK"], "ok")
"""

# Writes pid.RANK, waits until every rank has, then acts on argv[1]:
#   "exit:R:C"  rank R exits with code C      "kill:R"   rank R SIGKILLs itself
#   "sleep"     every rank sleeps             "deaf:R:C" every rank but R ignores SIGTERM
#                                                        and sleeps; rank R exits with code C
# Rank R acts once every rank has printed "rank N ready" (and written ready.N).
CONTROLLED = """
import os, signal, sys, time
rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

def mark(name):
    with open(name + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(name + ".tmp", name)  # never read half-written

def wait_for_all(prefix):
    deadline = time.time() + 60
    while time.time() < deadline and not all(os.path.exists("%s.%d" % (prefix, r))
                                              for r in range(size)):
        time.sleep(0.02)

mode, *args = sys.argv[1].split(":")
target = int(args[0]) if args else -1
if mode == "deaf" and rank != target:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
mark("pid.%d" % rank)
wait_for_all("pid")
print("rank %d ready" % rank)
mark("ready.%d" % rank)
if rank == target:
    wait_for_all("ready")
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(int(args[1]))
time.sleep(120)
"""


def write_script(directory: Path, name: str, text: str) -> str:
    """Write a worker script and return its file name (relative to ``directory``)."""
    (directory / name).write_text(text)
    return name


def run_job(argv: Sequence[str], cwd: Path, environ: Mapping[str, str] | None = None
            ) -> RunResult:
    """Launch in this process, as `ringtrain run ARGV` would from ``cwd``."""
    environ = dict(os.environ if environ is None else environ)
    return launch(load_config(list(argv), environ), environ, cwd=str(cwd))


def cli(argv: Sequence[str], cwd: Path, **kwargs) -> subprocess.Popen:
    """Start `ringtrain run ARGV` as its own process."""
    return subprocess.Popen([sys.executable, "-m", "ringtrain.cli", "run", *argv], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def read_pids(directory: Path, size: int, timeout_s: float = 60.0) -> list[int]:
    """Wait for every rank's ``pid.RANK`` file and return the pids."""
    paths = [directory / f"pid.{r}" for r in range(size)]
    wait_until(lambda: all(p.exists() for p in paths), "every rank's start", timeout_s)
    return [int(p.read_text()) for p in paths]


def running(pids: Sequence[int]) -> list[int]:
    """Those of ``pids`` whose process still runs (one that exited is not, reaped or not)."""
    out = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
            out.append(pid)
    return out


def is_alive(pid: int) -> bool:
    """Whether a process with this pid exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_dead(pids: Sequence[int], timeout_s: float = 10.0) -> list[int]:
    """Wait until none of ``pids`` is alive; returns those still alive after the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = [p for p in pids if is_alive(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return [p for p in pids if is_alive(p)]
