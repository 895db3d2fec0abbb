"""Training step throughput: ringtrain's DistributedOptimizer against PyTorch DDP, same run.

    python benchmarks/ddp_parity.py [--np 2] [--model fashion_cnn|resnet18] [--batch-size 64]

launches itself with `ringtrain run -np N`. Every rank builds the same model twice (one wrapped
in ``DistributedDataParallel`` on a Gloo group of its own, one trained with
``hvd.DistributedOptimizer``) and trains them on the same fixed batch, alternating short blocks
of steps between the two so that both see the same machine load. Prints one JSON line with the
median steps/s of each and their ratio (ringtrain / DDP; at least 0.95 is the goal): the median
over pairs of adjacent blocks of ringtrain's rate over DDP's, so that drifts of the machine's
speed cancel out, with a bootstrap 95% confidence interval of that median.

On a shared machine the speed of adjacent blocks of one side drifts by more than the differences
to be measured (benchmarks/ARCHIVE.md): short blocks (two steps) and many of them measure the
ratio far more precisely than a few long ones. Ranks meet at a barrier before each block, outside
the timed span.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from launch import run_under_launcher
from stats import bootstrap_median_ci


def _build(name: str):
    import torch

    from ringtrain.models.fashion_cnn import FashionCNN
    from ringtrain.models.resnet import resnet18

    torch.manual_seed(0)
    if name == "fashion_cnn":
        return FashionCNN(), (1, 28, 28), 10
    if name == "resnet18":
        return resnet18(num_classes=10), (3, 32, 32), 10
    raise SystemExit(f"unknown model {name!r}; choose fashion_cnn or resnet18")


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import ringtrain.torch as hvd

    hvd.init()
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // hvd.local_size()))
    ddp_group = dist.new_group(list(range(hvd.size())), backend="gloo")

    model_ddp, shape, classes = _build(args.model)
    ddp = DistributedDataParallel(model_ddp, process_group=ddp_group)
    opt_ddp = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)

    model_rt, _, _ = _build(args.model)
    opt_rt = hvd.DistributedOptimizer(torch.optim.SGD(model_rt.parameters(), lr=0.01,
                                                      momentum=0.9),
                                      named_parameters=model_rt.named_parameters())
    g = torch.Generator().manual_seed(hvd.rank())
    x = torch.randn(args.batch_size, *shape, generator=g)
    y = torch.randint(0, classes, (args.batch_size,), generator=g)

    def step(model, opt):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    def block(model, opt) -> float:
        dist.barrier(group=ddp_group)
        start = time.perf_counter()
        for _ in range(args.steps_per_block):
            step(model, opt)
        return args.steps_per_block / (time.perf_counter() - start)

    for _ in range(args.warmup):
        step(ddp, opt_ddp)
        step(model_rt, opt_rt)
    ddp_rates, rt_rates = [], []
    for i in range(args.blocks):
        # alternate which goes first so neither always follows the other
        order = [(ddp, opt_ddp, ddp_rates), (model_rt, opt_rt, rt_rates)]
        for model, opt, rates in (order if i % 2 == 0 else order[::-1]):
            rates.append(block(model, opt))
    if hvd.rank() == 0:
        ddp_rate, rt_rate = statistics.median(ddp_rates), statistics.median(rt_rates)
        ratios = [r / d for r, d in zip(rt_rates, ddp_rates)]
        print(json.dumps({
            "benchmark": "ddp_parity", "model": args.model, "world_size": hvd.size(),
            "batch_size_per_rank": args.batch_size, "blocks": args.blocks,
            "threads_per_rank": torch.get_num_threads(),
            "steps_per_block": args.steps_per_block,
            "ddp_steps_per_s": ddp_rate, "ringtrain_steps_per_s": rt_rate,
            "throughput_ratio": statistics.median(ratios),
            "throughput_ratio_ci95": bootstrap_median_ci(ratios),
            "ddp_blocks": ddp_rates, "ringtrain_blocks": rt_rates,
        }), flush=True)
    hvd.shutdown()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of one comparison (also taken by benchmarks/scaling.py)."""
    parser.add_argument("--model", default="fashion_cnn")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=150)
    parser.add_argument("--steps-per-block", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=5)


def worker_args(args: argparse.Namespace, threads: int) -> list[str]:
    """The worker's command line for the options of :func:`add_arguments`."""
    return ["--model", args.model, "--batch-size", str(args.batch_size),
            "--blocks", str(args.blocks), "--steps-per-block", str(args.steps_per_block),
            "--warmup", str(args.warmup), "--threads", str(threads)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2)
    add_arguments(parser)
    parser.add_argument("--threads", type=int, default=0,
                        help="intra-op threads per rank (default: cores / ranks on the host)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    return run_under_launcher(__file__, args.np, worker_args(args, args.threads))


if __name__ == "__main__":
    sys.exit(main())
