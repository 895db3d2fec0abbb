"""Train a ResNet on an ImageNet-style image folder with ringtrain, with a plain DataLoader.

    ringtrain data fashion-images data/fashion-folder --limit 2000
    ringtrain run -np 2 python examples/resnet_folder.py --data data/fashion-folder

``DATA/train/<class>/*`` and ``DATA/val/<class>/*`` (JPEG, PNG, anything Pillow reads), as
torchvision's ``ImageFolder`` reads them. Training images get a random resized crop and a
horizontal flip; validation images are resized and centre-cropped; both are normalised with
ImageNet's mean and deviation. SGD with momentum, the learning rate scaled by the number of
processes, warm-up then cosine decay. Rank 0 writes ``model.pt`` + ``model.json`` (which
``ringtrain serve`` loads) after every epoch.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from classifier_training import (
    cosine_schedule,
    evaluate,
    init_worker,
    rank_slice,
    train_epoch,
)
from torch.utils.data import DataLoader, DistributedSampler
from training_curves import TrainingCurves

import ringtrain.torch as hvd
from ringtrain.models.saved import ModelInfo, save_model
from ringtrain.models.vision import load_torchvision, vision_model

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; the only place this example reads environment variables."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="folder with train/ and val/")
    p.add_argument("--arch", default="resnet18", help="torchvision model name (default resnet18)")
    p.add_argument("--image-size", type=int, default=64,
                   help="side of the crops the model sees (default 64; ImageNet uses 224)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="images per process per step")
    p.add_argument("--lr", type=float, default=0.05,
                   help="SGD learning rate for one process, scaled by the number of processes")
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--output-dir", type=Path,
                   default=Path(os.environ.get("RINGTRAIN_OUTPUT_MODEL") or "checkpoints"),
                   help="where rank 0 writes the model (env RINGTRAIN_OUTPUT_MODEL)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.lr <= 0 or args.image_size < 16:
        p.error("--epochs, --batch-size, --lr must be positive and --image-size at least 16")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    device = init_worker(args.seed)
    tv = load_torchvision()
    if tv is None:
        raise SystemExit("resnet_folder: needs torchvision: pip install 'ringtrain[vision]'")
    t = tv.transforms
    size = args.image_size
    train_set = tv.datasets.ImageFolder(str(args.data / "train"), t.Compose([
        t.RandomResizedCrop(size, scale=(0.5, 1.0), antialias=True), t.RandomHorizontalFlip(),
        t.ToTensor(), t.Normalize(MEAN, STD)]))
    val_set = tv.datasets.ImageFolder(str(args.data / "val"), t.Compose([
        t.Resize(size, antialias=True), t.CenterCrop(size), t.ToTensor(), t.Normalize(MEAN, STD)]))
    if train_set.classes != val_set.classes:
        raise SystemExit(f"resnet_folder: {args.data}/train and /val have different classes")
    sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank(),
                                 shuffle=True, seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler,
                              num_workers=args.workers, persistent_workers=args.workers > 0)
    val_loader = DataLoader(rank_slice(val_set), batch_size=256, num_workers=args.workers)

    kwargs = {"name": args.arch, "num_classes": len(train_set.classes)}
    model = vision_model(**kwargs).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9,
                                weight_decay=5e-5)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    scheduler = cosine_schedule(optimizer, args.epochs * len(train_loader))
    info = ModelInfo(arch="torchvision", task="classification", classes=train_set.classes,
                     kwargs=kwargs, input_shape=[3, size, size], mean=MEAN, std=STD)
    if hvd.rank() == 0:
        print(f"resnet_folder: {args.arch}, {hvd.size()} process(es), {len(train_set)} "
              f"training images, {len(train_set.classes)} classes, {size}px", flush=True)
    curves = TrainingCurves(args.output_dir)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        train_loss, train_acc = train_epoch(model, train_loader, optimizer, scheduler, device,
                                            f"epoch {epoch + 1}/{args.epochs}", curves)
        val_loss, val_acc = evaluate(model, val_loader, device)
        curves.epoch(epoch + 1, train_loss=train_loss, train_accuracy=train_acc,
                     val_loss=val_loss, val_accuracy=val_acc)
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: train loss {train_loss:.4f} acc "
                  f"{train_acc:.4f} | val loss {val_loss:.4f} acc {val_acc:.4f}", flush=True)
            save_model(args.output_dir, model, info)
    if hvd.rank() == 0:
        print(json.dumps({"example": "resnet_folder", "arch": args.arch,
                          "world_size": hvd.size(), "epochs": args.epochs,
                          "train_accuracy": round(train_acc, 4), "val_accuracy": round(val_acc, 4),
                          "wall_s": round(time.perf_counter() - started, 1),
                          "model_dir": str(args.output_dir)}), flush=True)
    curves.close()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
