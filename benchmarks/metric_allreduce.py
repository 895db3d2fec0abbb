"""A metric's allreduce: ``hvd.allreduce`` of a tensor that autograd does not record.

    python benchmarks/metric_allreduce.py [--np 2] [--rounds 40] [--bytes 4096] [--keras]

launches itself with `ringtrain run -np N` and prints one JSON line: the quartiles of the time
per back-to-back ``hvd.allreduce`` (rank 0, microseconds) of one float32 tensor that does not
require grad (a loss value, an accuracy, a count), taken as it is taken (``direct``: no
``autograd.Function``, since nothing is recorded) and through the ``autograd.Function`` that a
tensor requiring grad goes through (``function``). With ``--keras``: ``ringtrain.keras``'s
``hvd.allreduce`` of a numpy array on the torch backend (``direct``: waited for at once, so run
in the caller's thread) against submitting it and then waiting (``handed_over``: the engine's
thread runs it, as that function did before 2026-11-29). The two take turns round by round in
one run (each round after a barrier, every rank switching alike), so a virtual machine's changes
of speed fall on both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

from launch import run_under_launcher

CALLS = 200


def _torch_ways(nbytes: int) -> dict[str, Callable[[], object]]:
    import torch

    import ringtrain.torch as hvd
    from ringtrain.torch import autograd_ops

    metric = torch.ones(max(nbytes // 4, 1))
    as_taken = autograd_ops._needs_grad

    def through(needs_grad: Callable[[torch.Tensor], bool]) -> Callable[[], object]:
        def call() -> object:
            autograd_ops._needs_grad = needs_grad  # looked up at every call
            try:
                return hvd.allreduce(metric, op=hvd.Sum, name="metric")
            finally:
                autograd_ops._needs_grad = as_taken
        return call

    return {"direct": through(as_taken), "function": through(lambda tensor: True)}


def _keras_ways(nbytes: int) -> dict[str, Callable[[], object]]:
    import os

    os.environ.setdefault("KERAS_BACKEND", "torch")
    import numpy as np
    import torch

    import ringtrain.keras as hvd
    from ringtrain.torch import ops

    metric = np.ones(max(nbytes // 4, 1), np.float32)

    def handed_over() -> object:
        return ops.synchronize(ops.allreduce_async(torch.from_numpy(metric), name="metric",
                                                   op=ops.Sum)).numpy()

    return {"direct": lambda: hvd.allreduce(metric, name="metric", op=hvd.Sum),
            "handed_over": handed_over}


def worker(rounds: int, nbytes: int, keras: bool) -> None:
    import torch

    import ringtrain.torch as hvd

    torch.set_num_threads(1)
    ways = _keras_ways(nbytes) if keras else _torch_ways(nbytes)
    hvd.init()
    for _ in range(100):
        for call in ways.values():
            call()
    times: dict[str, list[float]] = {way: [] for way in ways}
    for _ in range(rounds):
        for way, call in ways.items():
            hvd.barrier()
            start = time.perf_counter()
            for _ in range(CALLS):
                call()
            times[way].append((time.perf_counter() - start) / CALLS * 1e6)
    quartiles = {way: [round(q, 1) for q in statistics.quantiles(v, n=4)]
                 for way, v in times.items()}
    other = next(way for way in ways if way != "direct")
    if hvd.rank() == 0:
        print(json.dumps({"benchmark": "metric_allreduce", "frontend": "keras" if keras else
                          "torch", "world_size": hvd.size(), "bytes": nbytes, "rounds": rounds,
                          "us_quartiles": quartiles,
                          f"direct_vs_{other}": round(quartiles["direct"][1]
                                                      / quartiles[other][1], 3)}),
              flush=True)
    hvd.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2, help="number of ranks (default 2)")
    parser.add_argument("--rounds", type=int, default=40, help="rounds per way (default 40)")
    parser.add_argument("--bytes", type=int, default=4096, help="tensor size (default 4 KiB)")
    parser.add_argument("--keras", action="store_true",
                        help="ringtrain.keras's allreduce of a numpy array (torch backend)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.rounds, args.bytes, args.keras)
        return 0
    return run_under_launcher(__file__, args.np, ["--rounds", str(args.rounds),
                                                  "--bytes", str(args.bytes)]
                              + (["--keras"] if args.keras else []))


if __name__ == "__main__":
    sys.exit(main())
