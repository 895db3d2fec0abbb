"""What ``ringtrain run``'s default OMP_NUM_THREADS (host cores / local ranks) is worth to a plain
torch script that sets no thread count: its step time with the default against the same script
with every rank given all the cores (torch's own default, what ranks got before).

    python benchmarks/threads_per_rank.py --np 2 --rounds 3

Each round launches ``ringtrain run -np N`` twice, in alternating order: once as is, once with
``OMP_NUM_THREADS`` set to the machine's cores. The script (an MLP on a fixed batch, no
``set_num_threads``) prints rank 0's median step time. Prints one JSON line: the median step
ms of each, and the median over rounds of oversubscribed / default (above 1: the default is
faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPT = """import statistics, sys, time, torch
import ringtrain.torch as hvd
hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(),
                            torch.nn.Linear(2048, 1024))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                               named_parameters=model.named_parameters())
x = torch.randn(256, 1024)
times = []
for step in range(int(sys.argv[1])):
    t0 = time.perf_counter()
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()
    times.append(time.perf_counter() - t0)
if hvd.rank() == 0:
    print("STEP_MS", 1e3 * statistics.median(times[3:]), torch.get_num_threads(), flush=True)
"""


def _run(np: int, steps: int, script: Path, threads: str | None) -> tuple[float, int]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    out = subprocess.run([sys.executable, "-m", "ringtrain.cli", "run", "-np", str(np),
                          sys.executable, str(script), str(steps)], env=env,
                         capture_output=True, text=True, timeout=600, check=True).stdout
    line = next(x for x in out.splitlines() if "STEP_MS" in x)
    ms, used = line.split("STEP_MS", 1)[1].split()
    return float(ms), int(used)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    cores = str(os.cpu_count() or 1)
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "plain.py"
        script.write_text(SCRIPT)
        default, oversubscribed, threads = [], [], {}
        for round_ in range(args.rounds):
            order = [None, cores] if round_ % 2 == 0 else [cores, None]
            for setting in order:
                ms, used = _run(args.np, args.steps, script, setting)
                (default if setting is None else oversubscribed).append(ms)
                threads["default" if setting is None else "all_cores"] = used
    ratios = [o / d for o, d in zip(oversubscribed, default)]
    print(json.dumps({"benchmark": "threads_per_rank", "np": args.np, "cores": int(cores),
                      "threads_per_rank": threads,
                      "default_step_ms": round(statistics.median(default), 2),
                      "all_cores_step_ms": round(statistics.median(oversubscribed), 2),
                      "all_cores_over_default": round(statistics.median(ratios), 3),
                      "ratios": [round(r, 3) for r in ratios]}))


if __name__ == "__main__":
    main()
