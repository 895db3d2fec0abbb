"""A metric's allreduce: ``hvd.allreduce`` of a tensor that autograd does not record.

    python benchmarks/metric_allreduce.py [--np 2] [--rounds 40] [--bytes 4096]

launches itself with `ringtrain run -np N` and prints one JSON line: the quartiles of the time
per back-to-back ``hvd.allreduce`` (rank 0, microseconds) of one float32 tensor that does not
require grad (a loss value, an accuracy, a count), taken as it is taken (``direct``: no
``autograd.Function``, since nothing is recorded) and through the ``autograd.Function`` that a
tensor requiring grad goes through (``function``). The two take turns round by round in one run
(each round after a barrier, every rank switching alike), so a virtual machine's changes of
speed fall on both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from launch import run_under_launcher

CALLS = 200


def worker(rounds: int, nbytes: int) -> None:
    import torch

    import ringtrain.torch as hvd
    from ringtrain.torch import autograd_ops

    torch.set_num_threads(1)
    hvd.init()
    metric = torch.ones(max(nbytes // 4, 1))
    as_taken = autograd_ops._needs_grad
    ways = {"direct": as_taken, "function": lambda tensor: True}
    for _ in range(100):
        hvd.allreduce(metric, op=hvd.Sum, name="metric")
    times: dict[str, list[float]] = {way: [] for way in ways}
    for _ in range(rounds):
        for way, needs_grad in ways.items():
            autograd_ops._needs_grad = needs_grad  # looked up at every call
            hvd.barrier()
            start = time.perf_counter()
            for _ in range(CALLS):
                hvd.allreduce(metric, op=hvd.Sum, name="metric")
            times[way].append((time.perf_counter() - start) / CALLS * 1e6)
    autograd_ops._needs_grad = as_taken
    quartiles = {way: [round(q, 1) for q in statistics.quantiles(v, n=4)]
                 for way, v in times.items()}
    if hvd.rank() == 0:
        print(json.dumps({"benchmark": "metric_allreduce", "world_size": hvd.size(),
                          "bytes": nbytes, "rounds": rounds, "us_quartiles": quartiles,
                          "direct_vs_function": round(quartiles["direct"][1]
                                                      / quartiles["function"][1], 3)}),
              flush=True)
    hvd.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2, help="number of ranks (default 2)")
    parser.add_argument("--rounds", type=int, default=40, help="rounds per way (default 40)")
    parser.add_argument("--bytes", type=int, default=4096, help="tensor size (default 4 KiB)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.rounds, args.bytes)
        return 0
    return run_under_launcher(__file__, args.np, ["--rounds", str(args.rounds),
                                                  "--bytes", str(args.bytes)])


if __name__ == "__main__":
    sys.exit(main())
