"""What the step profiler costs a training loop: profiled steps against the same steps bare.

    python benchmarks/step_profiler_cost.py --rounds 7

One process. Each round times ``--steps`` empty steps with the profiler's phases marked (its own
cost per step, in ms) and then ``--steps`` steps of a ~10 ms matmul workload bare and profiled,
in alternating order. Prints one JSON line: the median profiling cost per step, and the median
over rounds of profiled over bare time (goal: below 1.01, i.e. under 1 % of a 10 ms step).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from ringtrain.torch.step_profiler import StepProfiler


def _steps(profiler: StepProfiler | None, steps: int, work: torch.Tensor) -> float:
    """Seconds for ``steps`` steps, each one ``work @ work``; phases marked when profiling."""
    t0 = time.perf_counter()
    if profiler is None:
        for _ in range(steps):
            work @ work
    else:
        for _ in profiler.iterate(range(steps)):
            with profiler.phase("h2d"):
                pass
            with profiler.phase("forward_backward"):
                work @ work
            with profiler.phase("optimizer"):
                pass
        profiler.close()
    return time.perf_counter() - t0


def _work_of(target_ms: float) -> torch.Tensor:
    """A square matrix whose product with itself takes about ``target_ms``."""
    n = 64
    while True:
        m = torch.randn(n, n)
        t0 = time.perf_counter()
        for _ in range(3):
            m @ m
        if (time.perf_counter() - t0) / 3 * 1e3 >= target_ms or n >= 4096:
            return m
        n = int(n * 1.25)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--step-ms", type=float, default=10.0)
    args = p.parse_args()
    torch.set_num_threads(1)
    work = _work_of(args.step_ms)
    empty = torch.zeros(1, 1)
    costs, ratios = [], []
    for r in range(args.rounds):
        costs.append(_steps(StepProfiler(metrics_dir=False, rank=0), args.steps, empty)
                     / args.steps * 1e3 - _steps(None, args.steps, empty) / args.steps * 1e3)
        order = (False, True) if r % 2 == 0 else (True, False)
        timed = {profiled: _steps(StepProfiler(metrics_dir=False, rank=0) if profiled else None,
                                  args.steps, work) for profiled in order}
        ratios.append(timed[True] / timed[False])
    print(json.dumps({"benchmark": "step_profiler_cost", "matrix": work.shape[0],
                      "bare_step_ms": round(_steps(None, 20, work) / 20 * 1e3, 2),
                      "profiling_ms_per_step": round(statistics.median(costs), 4),
                      "profiled_over_bare": round(statistics.median(ratios), 4),
                      "rounds": args.rounds}))


if __name__ == "__main__":
    main()
