"""Autotune against a grid search of the same knobs, on the probe CNN, in one launch.

    python benchmarks/autotune.py [--np 2] [--steps 5] [--samples 20]

launches itself with `ringtrain run -np N --bucket-mb 1 --autotune ...` (the bad start: 1 MiB
buckets) and prints one JSON line. Each rank trains the Fashion-MNIST CNN
(ringtrain.models.fashion_cnn, the doctor's and the tutorial's probe) on one synthetic batch. First
the grid (autotuning held off): every bucket size x cycle time (x threads, with more than one
core per rank), each point set exactly as autotuning sets it, one settling step then ``--steps``
timed steps, the grid swept twice and the better sweep kept per point. Then autotuning runs from
1 MiB buckets until it has taken ``--samples`` samples. Last, the grid's best and autotuning's
best are measured again, interleaved three times (medians): ``ratio`` = autotune best / grid
best (goal >= 0.95) with both settings. Rates are steps per second of the slowest rank.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

BUCKETS_MB = (1, 4, 16, 64)
CYCLES_MS = (0.5, 2, 8)


def _worker(args: argparse.Namespace) -> None:
    import torch
    import torch.nn.functional as F

    import ringtrain.torch as hvd
    from ringtrain.models.fashion_cnn import FashionCNN
    from ringtrain.torch.autotune_search import Setting

    hvd.init()
    torch.manual_seed(0)
    model = FashionCNN(10)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x, y = torch.randn(args.batch, 1, 28, 28), torch.randint(0, 10, (args.batch,))
    tuner, optimizer._autotuner = optimizer._autotuner, None  # held off during the grid
    start = Setting(1.0, 1.0, torch.get_num_threads())  # the launch's bad start
    engine = tuner._engine

    def step() -> None:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    def rate(setting: Setting) -> float:
        optimizer.set_bucket_bytes(setting.bucket_bytes)
        engine.set_cycle_time(setting.cycle_time_ms)
        torch.set_num_threads(setting.threads)
        step()  # settling
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        mine = torch.tensor([args.steps / (time.perf_counter() - start)], dtype=torch.float64)
        return float(hvd.allreduce_(mine, op=hvd.Min, name="bench.rate")[0])

    cores = len(os.sched_getaffinity(0)) // hvd.local_size()
    threads = sorted({1, max(1, cores)})
    grid = [Setting(b, c, t) for b, c, t in itertools.product(BUCKETS_MB, CYCLES_MS, threads)]
    for s in grid[:2]:
        rate(s)  # warm-up: allocations, connections
    sweeps = [[rate(s) for s in grid] for _ in range(2)]
    scores = {s: max(a, b) for s, a, b in zip(grid, *sweeps)}
    grid_best = max(scores, key=scores.get)

    optimizer._autotuner = tuner
    tuner._apply(start)
    started = time.perf_counter()
    steps = 0
    while not tuner.done:
        step()
        steps += 1
    tune_s = time.perf_counter() - started
    found = tuner.current
    optimizer._autotuner = None
    again: dict[str, list[float]] = {"grid": [], "autotune": []}
    for _ in range(3):
        again["grid"].append(rate(grid_best))
        again["autotune"].append(rate(found))
    if hvd.rank() == 0:
        grid_rate = statistics.median(again["grid"])
        tune_rate = statistics.median(again["autotune"])
        print(json.dumps({
            "benchmark": "autotune", "np": hvd.size(), "model": "FashionCNN",
            "batch": args.batch, "steps_per_point": args.steps, "grid_points": len(grid),
            "grid_best": grid_best.__dict__, "grid_best_rate": round(grid_rate, 3),
            "autotune_best": found.__dict__, "autotune_rate": round(tune_rate, 3),
            "ratio": round(tune_rate / grid_rate, 3), "autotune_samples": tuner._scored,
            "autotune_steps": steps, "autotune_s": round(tune_s, 1),
            "start": {"bucket_mb": 1}, "load_avg": os.getloadavg()[0]}), flush=True)
    hvd.shutdown()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--steps", type=int, default=5, help="timed steps per grid point / sample")
    p.add_argument("--samples", type=int, default=20, help="autotune samples (goal: <= 20)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--noise", type=float, default=0.8,
                   help="--autotune-gaussian-process-noise (Horovod's default 0.8)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        _worker(args)
        return 0
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "ringtrain.cli", "run", "-np", str(args.np),
               "--output-filename", out, "--bucket-mb", "1", "--autotune",
               "--autotune-log-file", os.path.join(out, "tune.csv"),
               "--autotune-warmup-samples", "1",
               "--autotune-steps-per-sample", str(args.steps),
               "--autotune-bayes-opt-max-samples", str(args.samples),
               "--autotune-gaussian-process-noise", str(args.noise),
               sys.executable, os.path.abspath(__file__), "--worker", "--steps", str(args.steps),
               "--batch", str(args.batch)]
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              timeout=1800, check=False)
        if done.returncode:
            sys.stderr.write(done.stderr)
            return done.returncode
        with open(os.path.join(out, "rank.0", "stdout")) as f:
            print([line for line in f if line.startswith("{")][-1].strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
