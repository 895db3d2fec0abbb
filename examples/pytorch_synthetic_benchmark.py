"""Training throughput on synthetic data, as Horovod's benchmark of the same name measures it.

    ringtrain run -np 2 python examples/pytorch_synthetic_benchmark.py --model resnet50

Every process trains the model on one fixed random batch, so the figure is model compute plus
gradient allreduce, without any input pipeline. Prints images per second per device and in total
(mean +- 1.96 standard deviations over the timed iterations), then one JSON line with the same.
"""

from __future__ import annotations

import argparse
import json
import timeit

import numpy as np
import torch
import torch.nn.functional as F

import ringtrain.torch as hvd
from ringtrain.data.synthetic import synthetic_batch
from ringtrain.models.vision import vision_model


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (Horovod's flags, plus the image size and class count)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to fp16")
    p.add_argument("--model", default="resnet50", help="model name, as torchvision names it")
    p.add_argument("--batch-size", type=int, default=32, help="images per process per step")
    p.add_argument("--num-warmup-batches", type=int, default=10, help="untimed steps first")
    p.add_argument("--num-batches-per-iter", type=int, default=10, help="steps per timing")
    p.add_argument("--num-iters", type=int, default=10, help="timings")
    p.add_argument("--use-adasum", action="store_true", help="Adasum instead of averaging")
    p.add_argument("--no-cuda", action="store_true", help="train on the CPU even with CUDA")
    p.add_argument("--image-size", type=int, default=224, help="side of the square images")
    p.add_argument("--num-classes", type=int, default=1000)
    args = p.parse_args(argv)
    if min(args.batch_size, args.num_batches_per_iter, args.num_iters, args.image_size) < 1:
        p.error("sizes and counts must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    hvd.init()
    cuda = torch.cuda.is_available() and not args.no_cuda
    if cuda:
        torch.cuda.set_device(hvd.local_rank())
        # Fixed shapes every step: let cuDNN pick its fastest kernels once.
        torch.backends.cudnn.benchmark = True
        device = torch.device("cuda", hvd.local_rank())
    else:
        device = torch.device("cpu")

    model = vision_model(args.model, num_classes=args.num_classes).to(device)
    # Adasum combines updates rather than averaging them, so the rate is not scaled by the
    # world size; on GPUs it still sums within a host first (Horovod's rule).
    lr_scaler = hvd.size() if not args.use_adasum else 1
    if cuda and args.use_adasum and hvd.nccl_built():
        lr_scaler = hvd.local_size()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * lr_scaler)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=compression,
        op=hvd.Adasum if args.use_adasum else hvd.Average,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    images, labels = synthetic_batch(
        args.batch_size,
        image_shape=(3, args.image_size, args.image_size),
        num_classes=args.num_classes,
        device=device,
    )

    def benchmark_step() -> None:
        optimizer.zero_grad()
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()
        if cuda:  # time the work, not its queueing
            torch.cuda.synchronize()

    def log(message: str) -> None:
        if hvd.rank() == 0:
            print(message, flush=True)

    kind = "GPU" if cuda else "CPU"
    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of {kind}s: {hvd.size()}")
    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    log("Running benchmark...")
    img_secs = []
    for i in range(args.num_iters):
        seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / seconds
        log(f"Iter #{i}: {img_sec:.1f} img/sec per {kind}")
        img_secs.append(img_sec)

    mean, conf = float(np.mean(img_secs)), float(1.96 * np.std(img_secs))
    log(f"Img/sec per {kind}: {mean:.1f} +- {conf:.1f}")
    total, total_conf = hvd.size() * mean, hvd.size() * conf
    log(f"Total img/sec on {hvd.size()} {kind}(s): {total:.1f} +- {total_conf:.1f}")
    log(json.dumps({
        "benchmark": "pytorch_synthetic", "model": args.model, "device": kind,
        "world_size": hvd.size(), "batch_size": args.batch_size, "image_size": args.image_size,
        "fp16_allreduce": args.fp16_allreduce, "adasum": args.use_adasum,
        "img_sec_per_device": round(mean, 2), "img_sec_per_device_conf": round(conf, 2),
        "img_sec_total": round(total, 2),
    }))
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
