"""Train the classic CNN on Fashion-MNIST with ringtrain, Horovod's recipe unchanged.

    ringtrain run -np 2 python examples/fashion_mnist.py

The recipe: every process trains the same model on its own shard of the data; gradients are
averaged across processes after each backward pass, so all replicas stay identical. With N
processes each epoch sees the data once in total, the learning rate is scaled by N (the global
batch is N times larger) and the number of epochs is divided by N, so N processes finish in about
1/N of the time. Rank 0 alone writes checkpoints and shows progress.

The learning rate ramps up over the first 5 % of the steps, then decays to zero (cosine); the
defaults are tuned for the fewest epochs that reliably give 90 % test accuracy (docs/examples.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, Subset
from tqdm import tqdm
from training_curves import TrainingCurves

import ringtrain.torch as hvd
from ringtrain.data.fashion_mnist import CLASSES, DEFAULT_DATA_DIR, FashionMNIST
from ringtrain.models.fashion_cnn import FashionCNN
from ringtrain.models.saved import ModelInfo, save_model


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; the only place this example reads environment variables."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--epochs", type=int, default=10,
                   help="epochs for one process; N processes run ceil(epochs / N) (default 10)")
    p.add_argument("--batch-size", type=int, default=64,
                   help="examples per process per step (default 64)")
    p.add_argument("--lr", type=float, default=1e-3,
                   help="RMSprop learning rate for one process; scaled by the number of processes "
                        "(default 0.001)")
    p.add_argument("--data-dir", type=Path,
                   default=Path(os.environ.get("RINGTRAIN_DATA_DIR") or DEFAULT_DATA_DIR),
                   help="directory of the Fashion-MNIST IDX files (env RINGTRAIN_DATA_DIR)")
    p.add_argument("--output-dir", type=Path,
                   default=Path(os.environ.get("RINGTRAIN_OUTPUT_MODEL") or "checkpoints"),
                   help="where rank 0 writes checkpoints and the model "
                        "(env RINGTRAIN_OUTPUT_MODEL, which the job service sets)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--no-augment", action="store_true", help="no random shifts and flips")
    p.add_argument("--limit-train", type=int, default=0,
                   help="train on the first N examples only (0: all), for quick tests")
    p.add_argument("--limit-test", type=int, default=0,
                   help="evaluate on the first N test examples only (0: all)")
    args = p.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.lr <= 0:
        p.error("--epochs, --batch-size and --lr must be positive")
    return args


def _first(dataset: FashionMNIST, limit: int) -> FashionMNIST | Subset:
    return Subset(dataset, range(min(limit, len(dataset)))) if limit > 0 else dataset


def _average(values: list[float], name: str) -> list[float]:
    """Sum-like metrics averaged over ranks (Average is allreduce's default op)."""
    return hvd.allreduce(torch.tensor(values, dtype=torch.float64), name=name).tolist()


def _warmup_cosine(total_steps: int, warmup_fraction: float = 0.05) -> Callable[[int], float]:
    """The learning-rate factor of each step: a linear ramp, then a cosine decay to zero.

    The ramp is Horovod's advice for a rate scaled by the world size (large steps from random
    weights diverge); ending near zero gives a clearly better test accuracy than a constant rate
    when there are only a few epochs (measured: benchmarks/ARCHIVE.md, "Fashion-MNIST example").
    """
    warmup = max(1, int(warmup_fraction * total_steps))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(1, total_steps - warmup)))

    return factor


def train_epoch(
    model: torch.nn.Module,
    loader: DataLoader,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    device: torch.device,
    epoch: int,
    epochs: int,
    curves: TrainingCurves | None = None,
) -> tuple[float, float]:
    """One pass over this rank's shard; returns the loss and accuracy over all ranks."""
    model.train()
    loss_sum = correct = count = 0.0
    bar = tqdm(loader, desc=f"epoch {epoch + 1}/{epochs}", disable=hvd.rank() != 0,
               mininterval=1.0, leave=False)
    for images, labels in bar:
        images, labels = images.to(device), labels.to(device)
        optimizer.zero_grad()
        logits = model(images)
        loss = F.cross_entropy(logits, labels)
        loss.backward()
        optimizer.step()
        scheduler.step()
        loss_sum += loss.item() * labels.numel()
        correct += (logits.argmax(1) == labels).sum().item()
        count += labels.numel()
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        if curves is not None:
            curves.step(loss, optimizer, labels.numel())
    loss_sum, correct, count = _average([loss_sum, correct, count], "train_metrics")
    return loss_sum / count, correct / count


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, loader: DataLoader, device: torch.device
) -> tuple[float, float]:
    """Loss and accuracy on the test set, each rank scoring its own slice."""
    model.eval()
    loss_sum = correct = count = 0.0
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        logits = model(images)
        loss_sum += F.cross_entropy(logits, labels, reduction="sum").item()
        correct += (logits.argmax(1) == labels).sum().item()
        count += labels.numel()
    # The ratio of averages is the ratio of sums: the exact accuracy over the whole test set.
    loss_sum, correct, count = _average([loss_sum, correct, count], "test_metrics")
    return loss_sum / count, correct / count


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    hvd.init()
    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank())
        device = torch.device("cuda", hvd.local_rank())
    else:
        device = torch.device("cpu")
    # Different seeds give each rank its own dropout and augmentation; the model's initial
    # weights differ too, but the broadcast below replaces them with rank 0's.
    torch.manual_seed(args.seed + hvd.rank())

    train_set = _first(FashionMNIST("train", args.data_dir, augment=not args.no_augment),
                       args.limit_train)
    test_set = _first(FashionMNIST("test", args.data_dir), args.limit_test)
    # The sampler deals each rank a disjoint shard and reshuffles it every epoch (set_epoch).
    sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank(),
                                 shuffle=True, seed=args.seed)
    pin = device.type == "cuda"
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler,
                              pin_memory=pin)
    # A strided slice, not a DistributedSampler: it pads nothing, so every test example counts
    # exactly once.
    test_loader = DataLoader(Subset(test_set, range(hvd.rank(), len(test_set), hvd.size())),
                             batch_size=1000, pin_memory=pin)

    model = FashionCNN().to(device)
    # Keras' RMSprop (rho 0.9, eps 1e-7): PyTorch's alpha 0.99 makes the first steps ~3x larger,
    # too large at the scaled learning rate.
    optimizer = torch.optim.RMSprop(model.parameters(), lr=args.lr * hvd.size(), alpha=0.9,
                                    eps=1e-7)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    epochs = math.ceil(args.epochs / hvd.size())
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, _warmup_cosine(epochs * len(train_loader))
    )
    if hvd.rank() == 0:
        args.output_dir.mkdir(parents=True, exist_ok=True)
        print(f"fashion_mnist: {hvd.size()} process(es), {epochs} epoch(s), global batch "
              f"{args.batch_size * hvd.size()}, lr {args.lr * hvd.size():g}, "
              f"{torch.get_num_threads()} thread(s) each, on {device}", flush=True)
    curves = TrainingCurves(args.output_dir)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        train_loss, train_acc = train_epoch(model, train_loader, optimizer, scheduler, device,
                                            epoch, epochs, curves)
        test_loss, test_acc = evaluate(model, test_loader, device)
        curves.epoch(epoch + 1, train_loss=train_loss, train_accuracy=train_acc,
                     test_loss=test_loss, test_accuracy=test_acc)
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}/{epochs}: train loss {train_loss:.4f} acc {train_acc:.4f}"
                  f" | test loss {test_loss:.4f} acc {test_acc:.4f}", flush=True)
            torch.save({"epoch": epoch + 1, "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        # Strings, not Paths: torch.load's default weights_only mode refuses
                        # arbitrary classes.
                        "args": {k: str(v) if isinstance(v, Path) else v
                                 for k, v in vars(args).items()}},
                       args.output_dir / f"checkpoint-{epoch + 1}.pt")

    if hvd.rank() == 0:
        # model.pt + model.json: what `ringtrain serve` (and `ringtrain job deploy`) loads.
        info = ModelInfo(arch="fashion_cnn", task="classification", classes=list(CLASSES),
                         input_shape=[1, 28, 28], mean=[0.0], std=[1.0],
                         extra={"epochs": epochs, "test_accuracy": round(test_acc, 4)})
        model_path = save_model(args.output_dir, model, info)
        print(f"test accuracy {test_acc:.4f}; model saved to {model_path}")
        print(json.dumps({
            "example": "fashion_mnist", "world_size": hvd.size(), "epochs": epochs,
            "global_batch_size": args.batch_size * hvd.size(), "lr": args.lr * hvd.size(),
            "train_loss": round(train_loss, 4), "train_accuracy": round(train_acc, 4),
            "test_loss": round(test_loss, 4), "test_accuracy": round(test_acc, 4),
            "wall_s": round(time.perf_counter() - started, 1), "model_path": str(model_path),
        }), flush=True)
    curves.close()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
