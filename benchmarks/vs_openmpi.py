"""ringtrain's allreduce against Open MPI's in the same processes, round by round.

    python benchmarks/vs_openmpi.py [--np 2] [--rounds 15]

launches itself with Open MPI's ``mpirun`` (``pip install ringtrain[bench]``: Open MPI 5 and
mpi4py), and every rank joins both ringtrain (``hvd.init()``, which recognises mpirun's variables;
the rendezvous on 127.0.0.1) and MPI. For each size of issue 39 (4 KiB, 64 KiB, 1 MiB, 64 MiB,
float32 Sum) the ranks then time, in turns, a round of ringtrain's ``allreduce_`` called back to
back and a round of Open MPI's ``Allreduce`` called back to back, each round after a barrier. One
JSON line: per size the median time per call of each, the median of the per-round ratios
(ringtrain / Open MPI) with a bootstrap 95% interval, and issue 39's goal for it.

Where ``allreduce.py`` times Open MPI after ringtrain, seconds apart, this puts both in the same
seconds: the dev VM has phases of seconds in which every exchange between two processes through
shared memory is 5-7 times slower (benchmarks/RESULTS.md, "The slow runs"), and a phase that falls
on one of the two and not the other decides a ratio measured apart.
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

from allreduce import OPENMPI_GOALS, calls_in_a_row
from launch import mpirun_command
from stats import bootstrap_median_ci


def _round(fn, calls: int, barrier) -> float:
    """Time per call of ``fn`` called ``calls`` times in a row, after ``barrier``."""
    barrier()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def worker(rounds: int) -> None:
    import numpy as np
    import torch
    from mpi4py import MPI

    import ringtrain.torch as hvd

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    hvd.init()
    results = {}
    for nbytes, goal in OPENMPI_GOALS.items():
        tensor = torch.ones(nbytes // 4)
        a = np.ones(nbytes // 4, dtype=np.float32)
        b = np.empty_like(a)
        name = f"vs_openmpi.{nbytes}"
        hvd.allreduce_(tensor, op=hvd.Sum, name=name)  # warm-up: the name in the cache
        comm.Allreduce(a, b, op=MPI.SUM)
        calls = calls_in_a_row(nbytes)
        ours, theirs = [], []
        for _ in range(rounds):
            # Each closure is called at once, in this iteration (B023 does not apply).
            ours.append(_round(lambda: hvd.allreduce_(tensor, op=hvd.Sum, name=name),  # noqa: B023
                               calls, comm.Barrier))
            theirs.append(_round(lambda: comm.Allreduce(a, b, op=MPI.SUM),  # noqa: B023
                                 calls, comm.Barrier))
        ratios = [x / y for x, y in zip(ours, theirs)]
        ratio = statistics.median(ratios)
        results[str(nbytes)] = {
            "ringtrain_s": statistics.median(ours), "openmpi_s": statistics.median(theirs),
            "ratio": ratio, "ratio_ci95": bootstrap_median_ci(ratios),
            "goal": goal, "met": ratio <= goal,
        }
    if comm.rank == 0:
        print(json.dumps({"benchmark": "vs_openmpi", "world_size": comm.size, "dtype": "float32",
                          "op": "Sum", "rounds": rounds, "sizes": results}), flush=True)
    hvd.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.rounds)
        return 0
    cmd = mpirun_command(args.np)
    if cmd is None:
        sys.stderr.write("vs_openmpi.py needs Open MPI's mpirun and mpi4py: "
                         "pip install 'ringtrain[bench]'\n")
        return 1
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    done = subprocess.run([*cmd, "-x", "MASTER_ADDR", "-x", "MASTER_PORT", sys.executable,
                           os.path.abspath(__file__), "--worker", "--rounds", str(args.rounds)],
                          capture_output=True, text=True, env=env, timeout=1800, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        sys.stderr.write(f"mpirun exited with {done.returncode}:\n{done.stderr}\n")
        return 1
    print(lines[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
