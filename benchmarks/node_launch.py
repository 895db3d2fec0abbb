"""What a per-node launch costs to start and end against a launch from one host.

Runs ``python -c pass`` on 4 ranks, alternately as ``ringtrain run -np 4`` (one launcher) and as
``ringtrain run --nnodes 2 --nproc-per-node 2`` on two node processes of this machine (how the job
service starts a 2-node job now), ``--repeats`` times each, and prints one JSON line: the median
wall time of each, from the first process started to the last one ended, and their ratio.

    python benchmarks/node_launch.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

RUN = [sys.executable, "-m", "ringtrain.cli", "run"]
COMMAND = [sys.executable, "-c", "pass"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_launcher() -> float:
    started = time.perf_counter()
    subprocess.run([*RUN, "-np", "4", *COMMAND], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def _per_node() -> float:
    endpoint = f"127.0.0.1:{_free_port()}"
    started = time.perf_counter()
    nodes = [subprocess.Popen([*RUN, "--nnodes", "2", "--node-rank", str(k), "--nproc-per-node",
                               "2", "--rdzv-endpoint", endpoint, *COMMAND],
                              stdout=subprocess.DEVNULL) for k in (0, 1)]
    codes = [node.wait() for node in nodes]
    if any(codes):
        raise RuntimeError(f"the per-node launch exited with {codes}")
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    one, per_node = [], []
    for _ in range(args.repeats):  # alternated, so that the machine's load hits both alike
        one.append(_one_launcher())
        per_node.append(_per_node())
    report = {"benchmark": "node_launch", "ranks": 4, "repeats": args.repeats,
              "one_launcher_s": round(statistics.median(one), 3),
              "per_node_2x2_s": round(statistics.median(per_node), 3),
              "ratio": round(statistics.median(per_node) / statistics.median(one), 3),
              "load_average": round(os.getloadavg()[0], 2)}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
