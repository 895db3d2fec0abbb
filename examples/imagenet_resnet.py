"""Train ResNet-50 on a folder tree of JPEGs (ImageNet's layout) or on synthetic data.

    ringtrain run -np 2 python examples/imagenet_resnet.py --data /data/imagenet/train
    ringtrain run -np 2 python examples/imagenet_resnet.py --synthetic --steps 20
    ringtrain data pack /data/imagenet/train /data/imagenet-256 --size 256
    ringtrain run -np 8 python examples/imagenet_resnet.py --packed /data/imagenet-256

Horovod's recipe: each rank trains the same model on its own shard (ShardedSampler), gradients
are averaged while backward runs (DistributedOptimizer), the learning rate is scaled by the
number of ranks, rank 0 saves checkpoints. The input pipeline is ringtrain.data's: workers decode
with libjpeg-turbo and crop to uint8 (or read a packed, pre-resized copy; or, with
--gpu-decode, only read bytes for nvjpeg), batches are prefetched to the GPU on a side stream
and normalised there. The step profiler writes each step's breakdown to the job's metrics folder
($RINGTRAIN_JOB_DIR/metrics) and prints the mean at the end of each epoch.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import ringtrain.torch as hvd
from ringtrain.data.classification import ClassificationImages
from ringtrain.data.gpu_decode import EncodedImages, GpuDecoder
from ringtrain.data.image_folder import ImageFolder
from ringtrain.data.loader import DeviceLoader
from ringtrain.data.normalize import IMAGENET_MEAN, IMAGENET_STD
from ringtrain.data.packed import PackedImages
from ringtrain.data.sharding import ShardedSampler
from ringtrain.data.synthetic import synthetic_batch
from ringtrain.models.resnet import resnet50
from ringtrain.models.saved import ModelInfo, save_model
from ringtrain.torch.step_profiler import StepProfiler


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; the only place this example reads environment variables."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", type=Path, help="image folder: DATA/<class>/<image>.jpg")
    source.add_argument("--packed", type=Path, help="a packed copy (`ringtrain data pack`)")
    source.add_argument("--synthetic", action="store_true", help="a fixed random batch")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=0, help="stop after N steps per epoch (0: all)")
    p.add_argument("--batch-size", type=int, default=64, help="images per rank per step")
    p.add_argument("--size", type=int, default=224, help="crop side in pixels")
    p.add_argument("--lr", type=float, default=0.1, help="SGD learning rate for batch 256, "
                   "scaled by batch size and ranks")
    p.add_argument("--workers", type=int, default=None, help="loader workers (default: chosen)")
    p.add_argument("--gpu-decode", action="store_true", help="decode JPEGs with nvjpeg")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast on the GPU")
    p.add_argument("--num-classes", type=int, default=1000, help="with --synthetic")
    p.add_argument("--output-dir", type=Path,
                   default=Path(os.environ.get("RINGTRAIN_OUTPUT_MODEL") or "checkpoints"),
                   help="where rank 0 saves the model (env RINGTRAIN_OUTPUT_MODEL)")
    args = p.parse_args(argv)
    if min(args.epochs, args.batch_size, args.size) < 1 or args.steps < 0 or args.lr <= 0:
        p.error("--epochs, --batch-size, --size and --lr must be positive")
    return args


def make_batches(args: argparse.Namespace, device: torch.device):
    """(batches per epoch as an iterable, its sampler or None, the class names)."""
    if args.synthetic:
        batch = synthetic_batch(args.batch_size, image_shape=(3, args.size, args.size),
                                num_classes=args.num_classes, device=device)
        return [batch] * (args.steps or 100), None, [str(k) for k in range(args.num_classes)]
    source = PackedImages(args.packed) if args.packed else ImageFolder(args.data)
    if args.gpu_decode:
        dataset, decoder = EncodedImages(source), GpuDecoder(device, args.size)
    else:
        dataset, decoder = ClassificationImages(source, args.size), None
    sampler = ShardedSampler(dataset, args.batch_size, last_batch="drop")
    settings = None
    if args.workers is not None:
        from ringtrain.data.tuning import LoaderSettings

        settings = LoaderSettings(args.workers, 2, "--workers")
    loader = DeviceLoader(dataset, args.batch_size, sampler=sampler, device=device,
                          settings=settings, local_size=hvd.local_size(),
                          channels_last=device.type == "cuda", decoder=decoder)
    return loader, sampler, list(source.classes)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    hvd.init()
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{hvd.local_rank()}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    batches, sampler, classes = make_batches(args, device)
    num_classes = len(classes)
    model = resnet50(num_classes=num_classes).to(device)
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    lr = args.lr * args.batch_size * hvd.size() / 256
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4),
        named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    profiler = StepProfiler(device, skip=1)  # the first step allocates and warms up
    for epoch in range(args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        start, images = time.perf_counter(), 0
        for step, (x, y) in enumerate(profiler.iterate(batches)):
            with profiler.phase("h2d"):
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with profiler.phase("forward_backward"), torch.autocast(
                    device.type, dtype=torch.bfloat16, enabled=args.bf16 and cuda):
                loss = F.cross_entropy(model(x), y)
                loss.backward()
            profiler.optimizer_step(optimizer)
            optimizer.zero_grad()
            images += x.shape[0] * hvd.size()
            if args.steps and step + 1 >= args.steps:
                break
        profiler.end_step()
        if hvd.rank() == 0:
            rate = images / (time.perf_counter() - start)
            summary = {k: round(v, 2) for k, v in profiler.summary().items()}
            print(json.dumps({"epoch": epoch, "loss": round(loss.item(), 4),
                              "img_per_s": round(rate, 1), "step_breakdown_ms": summary}))
    profiler.close()
    if hvd.rank() == 0:
        # model.pt + model.json: what `ringtrain serve` loads (ringtrain's ResNet-50 has
        # torchvision's state_dict keys).
        info = ModelInfo(arch="torchvision", task="classification", classes=classes,
                         kwargs={"name": "resnet50", "num_classes": num_classes},
                         input_shape=[3, args.size, args.size],
                         mean=[m / 255 for m in IMAGENET_MEAN], std=[s / 255 for s in IMAGENET_STD])
        save_model(args.output_dir, model, info)
    hvd.shutdown()


if __name__ == "__main__":
    main()
