"""Scaling on this machine: DistributedOptimizer against DDP over ranks x threads, and allreduce.

    python benchmarks/scaling.py [--grid 2x1,2x8,4x4] [--model fashion_cnn] [--blocks 60]
                                 [--allreduce-np 4 | --allreduce-np 0]

For every point (ranks, intra-op threads per rank) of the grid, runs benchmarks/ddp_parity.py's
interleaved comparison under `ringtrain run` (the median of paired block ratios with its
bootstrap 95% interval), then benchmarks/allreduce.py's size sweep against raw Gloo and its
161-tensor case. The default grid is every power-of-two rank count from 2 and thread count from
1 whose product fits in this machine's cores: a rank's threads spin-wait and contend exactly as a
user's would. Prints a table to stderr as points finish and one JSON line on stdout at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import ddp_parity
from launch import launch_json

_HERE = os.path.dirname(os.path.abspath(__file__))


def default_grid(cores: int) -> list[tuple[int, int]]:
    """Every (ranks, threads per rank), both powers of two, ranks >= 2, product <= cores."""
    grid = []
    ranks = 2
    while ranks <= cores:
        threads = 1
        while ranks * threads <= cores:
            grid.append((ranks, threads))
            threads *= 2
        ranks *= 2
    return grid


def parse_grid(text: str) -> list[tuple[int, int]]:
    """``"2x1,4x4"`` as [(2, 1), (4, 4)]."""
    points = []
    for item in text.split(","):
        try:
            ranks, threads = (int(x) for x in item.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--grid: {item!r} is not RANKSxTHREADS (e.g. 2x8)") from None
        if ranks < 2 or threads < 1:
            raise SystemExit(f"--grid: {item!r} needs at least 2 ranks and 1 thread")
        points.append((ranks, threads))
    return points


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", help="points RANKSxTHREADS, comma-separated (default: every "
                                       "power-of-two point that fits in the cores)")
    ddp_parity.add_arguments(parser)
    parser.set_defaults(blocks=60)
    parser.add_argument("--allreduce-np", type=int, default=None,
                        help="ranks of the allreduce sweep (default 4, or 2 on fewer than 4 "
                             "cores; 0 skips it)")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    grid = parse_grid(args.grid) if args.grid else default_grid(cores)
    if not grid:
        raise SystemExit(f"no grid point fits in {cores} core(s); pass --grid")

    started = time.time()
    print(_row(["ranks", "threads/rank", "DDP steps/s", "ringtrain steps/s",
                "ratio [95% interval]"]), file=sys.stderr)
    print(_row(["---"] * 5), file=sys.stderr)
    points = []
    for ranks, threads in grid:
        result = launch_json(os.path.join(_HERE, "ddp_parity.py"), ranks,
                             ddp_parity.worker_args(args, threads))
        low, high = result["throughput_ratio_ci95"]
        points.append({key: result[key] for key in (
            "world_size", "threads_per_rank", "ddp_steps_per_s", "ringtrain_steps_per_s",
            "throughput_ratio", "throughput_ratio_ci95")})
        print(_row([str(ranks), str(threads), f"{result['ddp_steps_per_s']:.2f}",
                    f"{result['ringtrain_steps_per_s']:.2f}",
                    f"{result['throughput_ratio']:.3f} [{low:.3f}, {high:.3f}]"]),
              file=sys.stderr, flush=True)

    allreduce_np = args.allreduce_np
    if allreduce_np is None:
        allreduce_np = 4 if cores >= 4 else 2
    sweep = None
    if allreduce_np:
        sweep = launch_json(os.path.join(_HERE, "allreduce.py"), allreduce_np, [])
        print(f"\nallreduce on {allreduce_np} ranks (ringtrain time / raw Gloo time):",
              file=sys.stderr)
        for size in sweep["sizes"]:
            print(f"  {size['bytes'] // 1024:>8} KiB  {size['ringtrain_s'] * 1e3:8.3f} ms  vs  "
                  f"{size['raw_s'] * 1e3:8.3f} ms  = {size['ringtrain_s'] / size['raw_s']:.2f}x",
                  file=sys.stderr)
        many = sweep["resnet50_161_tensors"]
        print(f"  ResNet-50's 161 tensors: {many['ratio_vs_raw_flat']:.2f}x one flat allreduce",
              file=sys.stderr)

    print(json.dumps({
        "benchmark": "scaling", "model": args.model, "cores": cores,
        "machine": platform.machine(), "python": platform.python_version(),
        "grid": points,
        "worst_ratio": min(p["throughput_ratio"] for p in points),
        "worst_interval_low": min(p["throughput_ratio_ci95"][0] for p in points),
        "allreduce": sweep, "seconds": time.time() - started,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
