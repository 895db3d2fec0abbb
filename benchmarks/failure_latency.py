"""How soon failures are noticed: the speed goals the tests used to assert on the wall clock.

The tests check what happens (the others are stopped, the survivor's error names the dead rank,
the line reaches the file while the rank runs) and wait with generous bounds; how long it takes
is measured here, ``--repeats`` times each:

* ``stop``: a rank of 3 under ``ringtrain run`` exits with code 3; seconds from its exit to the
  launcher's return with the other two stopped. Goal: 4 s.
* ``peer_death_shm`` / ``peer_death_gloo``: two ranks (the worker contract set by hand, as the
  multi-rank test harness does), rank 0 waiting in an allreduce when rank 1 SIGKILLs itself;
  seconds from the kill to rank 0's error, with shared memory and on Gloo alone. Goal: 5 s.
* ``line``: a rank prints a line under ``ringtrain run --output-filename``; seconds until the
  line is in its file. Goal: 1 s.

Prints one JSON line: the median and worst of each.

    python benchmarks/failure_latency.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_STOP = """
import os, sys, time
if os.environ["RANK"] == "1":
    time.sleep(1)  # the others are running
    open("failed_at", "w").write(repr(time.time()))
    sys.exit(3)
time.sleep(120)
"""
_LINE = """
import os, time
print(repr(time.time()))
while not os.path.exists("stop"):
    time.sleep(0.05)
"""


def _stop(tmp: Path) -> float:
    (tmp / "stop.py").write_text(_STOP)
    subprocess.run([sys.executable, "-m", "ringtrain.cli", "run", "-np", "3", sys.executable,
                    "stop.py"], cwd=tmp, capture_output=True, check=False, timeout=300)
    return time.time() - float((tmp / "failed_at").read_text())


def _line(tmp: Path) -> float:
    (tmp / "line.py").write_text(_LINE)
    out = tmp / "logs" / "rank.0" / "stdout"
    run = subprocess.Popen([sys.executable, "-m", "ringtrain.cli", "run", "-np", "1",
                            "--output-filename", "logs", sys.executable, "line.py"], cwd=tmp,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not (out.exists() and out.read_text().endswith("\n")):
            time.sleep(0.002)
        return time.time() - float(out.read_text())
    finally:
        (tmp / "stop").touch()
        run.wait(300)


def _rank(rank: int, port: int, env: dict[str, str], conn) -> None:
    os.environ.update({"HOROVOD_RANK": str(rank), "HOROVOD_SIZE": "2", "MASTER_ADDR":
                       "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", **env})
    import signal

    import torch

    import ringtrain.torch as hvd

    hvd.init()
    hvd.allreduce(torch.ones(1), name="first")
    if rank == 1:
        time.sleep(0.5)  # rank 0 waits in "second" by now
        conn.send(time.time())
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        hvd.allreduce(torch.ones(1), name="second")
        conn.send(None)
    except RuntimeError:
        conn.send(time.time())


def _peer_death(shm: bool) -> float:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    env = {"RINGTRAIN_SHM": "1" if shm else "0", "GLOO_SOCKET_IFNAME": "lo"}
    pipes = [ctx.Pipe() for _ in range(2)]
    procs = [ctx.Process(target=_rank, args=(r, port, env, pipes[r][1]), daemon=True)
             for r in range(2)]
    for p in procs:
        p.start()
    killed_at, failed_at = pipes[1][0].recv(), pipes[0][0].recv()
    for p in procs:
        p.join(30)
    if failed_at is None:
        raise RuntimeError("rank 0's allreduce did not fail after its peer died")
    return failed_at - killed_at


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    load = os.getloadavg()[0]  # at the start
    goals = {"stop": 4.0, "peer_death_shm": 5.0, "peer_death_gloo": 5.0, "line": 1.0}
    runs: dict[str, list[float]] = {name: [] for name in goals}
    for _ in range(args.repeats):
        for name in goals:
            with tempfile.TemporaryDirectory(prefix="ringtrain-failure-latency-") as tmp:
                if name == "stop":
                    runs[name].append(_stop(Path(tmp)))
                elif name == "line":
                    runs[name].append(_line(Path(tmp)))
                else:
                    runs[name].append(_peer_death(shm=name.endswith("shm")))
    print(json.dumps({"benchmark": "failure_latency", "cores": os.cpu_count(),
                      "load_average": round(load, 1),
                      **{name: {"median_s": round(statistics.median(v), 3),
                                "max_s": round(max(v), 3), "goal_s": goals[name],
                                "met": max(v) <= goals[name]} for name, v in runs.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
