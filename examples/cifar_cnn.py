"""The tutorial's CIFAR-10 CNN (Keras ``cifar10_cnn.py``) trained with ringtrain, in PyTorch.

    ringtrain run -np 2 python examples/cifar_cnn.py                 # Fashion-MNIST, padded
    ringtrain run -np 2 python examples/cifar_cnn.py --data DIR      # DIR/{train,val}/<class>/*

The data: Fashion-MNIST (28x28 grey, zero-padded to 32x32), or any image folder with ``train/``
and ``val/`` of one sub-folder per class (images resized to 32x32). The recipe: RMSprop, random
shifts (10 %) and horizontal flips; gradients averaged over processes, the learning rate scaled
by their number. Rank 0 alone writes checkpoints (``checkpoint-N.pt``, the weights and optimizer
state) and the model (``model.pt`` + ``model.json``, which ``ringtrain serve`` loads).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from classifier_training import (
    cosine_schedule,
    evaluate,
    init_worker,
    rank_slice,
    train_epoch,
)
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset
from training_curves import TrainingCurves

import ringtrain.torch as hvd
from ringtrain.data.augment import random_shift_flip
from ringtrain.data.fashion_mnist import CLASSES, DEFAULT_DATA_DIR, FashionMNIST
from ringtrain.models.cifar_cnn import CifarCNN
from ringtrain.models.saved import ModelInfo, save_model

SIZE = 32


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; the only place this example reads environment variables."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", default="fashion",
                   help="'fashion' (Fashion-MNIST from --fashion-dir) or an image folder with "
                        "train/ and val/")
    p.add_argument("--fashion-dir", type=Path, default=DEFAULT_DATA_DIR)
    p.add_argument("--channels", type=int, choices=[1, 3], default=3,
                   help="channels of folder images (default 3; Fashion-MNIST is always 1)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=64, help="examples per process per step")
    p.add_argument("--lr", type=float, default=1e-3,
                   help="RMSprop learning rate for one process, scaled by the number of processes")
    p.add_argument("--output-dir", type=Path,
                   default=Path(os.environ.get("RINGTRAIN_OUTPUT_MODEL") or "checkpoints"),
                   help="where rank 0 writes checkpoints and the model"
                        " (env RINGTRAIN_OUTPUT_MODEL)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--limit-train", type=int, default=0, help="first N training examples (0: all)")
    p.add_argument("--limit-val", type=int, default=0, help="first N evaluation examples (0: all)")
    args = p.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.lr <= 0:
        p.error("--epochs, --batch-size and --lr must be positive")
    return args


class PaddedFashion(Dataset):
    """Fashion-MNIST with 2 pixels of zero border: 32x32, the CNN's CIFAR input size."""

    def __init__(self, split: str, data_dir: Path, augment: bool) -> None:
        self.inner = FashionMNIST(split, data_dir, augment=augment)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        image, label = self.inner[i]
        return F.pad(image, (2, 2, 2, 2)), label


def image_folders(root: Path, channels: int) -> tuple[Dataset, Dataset, list[str]]:
    """``root/train`` and ``root/val`` as 32x32 tensors in [0, 1]; shifts and flips on train."""
    from ringtrain.models.vision import load_torchvision

    tv = load_torchvision()
    if tv is None:
        raise SystemExit("cifar_cnn: an image folder needs torchvision: pip install "
                         "'ringtrain[vision]'")
    t = tv.transforms
    base = [t.Grayscale(1) if channels == 1 else t.Lambda(lambda im: im.convert("RGB")),
            t.Resize((SIZE, SIZE)), t.ToTensor()]
    train = tv.datasets.ImageFolder(str(root / "train"),
                                    t.Compose([*base, t.Lambda(random_shift_flip)]))
    val = tv.datasets.ImageFolder(str(root / "val"), t.Compose(base))
    if train.classes != val.classes:
        raise SystemExit(f"cifar_cnn: {root}/train and {root}/val have different classes")
    return train, val, train.classes


def _first(dataset: Dataset, limit: int) -> Dataset:
    return Subset(dataset, range(min(limit, len(dataset)))) if limit > 0 else dataset


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    device = init_worker(args.seed)
    if args.data == "fashion":
        train_set: Dataset = PaddedFashion("train", args.fashion_dir, augment=True)
        val_set: Dataset = PaddedFashion("test", args.fashion_dir, augment=False)
        classes, channels = list(CLASSES), 1
    else:
        train_set, val_set, classes = image_folders(Path(args.data), args.channels)
        channels = args.channels
    train_set, val_set = _first(train_set, args.limit_train), _first(val_set, args.limit_val)
    sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank(),
                                 shuffle=True, seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    val_loader = DataLoader(rank_slice(val_set), batch_size=500)

    kwargs = {"num_classes": len(classes), "in_channels": channels, "image_size": SIZE}
    model = CifarCNN(**kwargs).to(device)
    # Keras' RMSprop (rho 0.9, eps 1e-7).
    optimizer = torch.optim.RMSprop(model.parameters(), lr=args.lr * hvd.size(), alpha=0.9,
                                    eps=1e-7)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    scheduler = cosine_schedule(optimizer, args.epochs * len(train_loader))
    info = ModelInfo(arch="cifar_cnn", task="classification", classes=classes, kwargs=kwargs,
                     input_shape=[channels, SIZE, SIZE])
    if hvd.rank() == 0:
        print(f"cifar_cnn: {hvd.size()} process(es), {len(train_set)} training images, "
              f"{len(classes)} classes, {args.epochs} epochs on {device}", flush=True)
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
            args.output_dir.mkdir(parents=True, exist_ok=True)
            torch.save({"epoch": epoch + 1, "model": model.state_dict(),
                        "optimizer": optimizer.state_dict()},
                       args.output_dir / f"checkpoint-{epoch + 1}.pt")
            save_model(args.output_dir, model, info)
    if hvd.rank() == 0:
        print(json.dumps({"example": "cifar_cnn", "world_size": hvd.size(),
                          "epochs": args.epochs, "train_accuracy": round(train_acc, 4),
                          "val_accuracy": round(val_acc, 4),
                          "wall_s": round(time.perf_counter() - started, 1),
                          "model_dir": str(args.output_dir)}), flush=True)
    curves.close()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
