"""What the classification examples (cifar_cnn.py, resnet_folder.py) share: the Horovod set-up
of a worker, one training epoch and the evaluation, with metrics averaged over all ranks."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Subset
from tqdm import tqdm
from training_curves import TrainingCurves

import ringtrain.torch as hvd


def init_worker(seed: int) -> torch.device:
    """``hvd.init()``, a fair share of the host's cores, this rank's device and seed."""
    hvd.init()
    # Each rank its own dropout and augmentation; the broadcast of rank 0's weights follows.
    torch.manual_seed(seed + hvd.rank())
    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank())
        return torch.device("cuda", hvd.local_rank())
    return torch.device("cpu")


def rank_slice(dataset: Dataset) -> Subset:
    """Every ``size``-th example from ``rank``: each evaluation example counted exactly once."""
    return Subset(dataset, range(hvd.rank(), len(dataset), hvd.size()))  # type: ignore[arg-type]


def _average(values: list[float], name: str) -> list[float]:
    return hvd.allreduce(torch.tensor(values, dtype=torch.float64), name=name).tolist()


def train_epoch(model: torch.nn.Module, loader: DataLoader, optimizer: torch.optim.Optimizer,
                scheduler: torch.optim.lr_scheduler.LRScheduler, device: torch.device,
                desc: str, curves: TrainingCurves | None = None) -> tuple[float, float]:
    """One pass over this rank's shard; returns the loss and accuracy over all ranks."""
    model.train()
    loss_sum = correct = count = 0.0
    for images, labels in tqdm(loader, desc=desc, disable=hvd.rank() != 0, mininterval=2.0,
                               leave=False):
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
        if curves is not None:
            curves.step(loss, optimizer, labels.numel())
    loss_sum, correct, count = _average([loss_sum, correct, count], "train_metrics")
    return loss_sum / count, correct / count


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: DataLoader,
             device: torch.device) -> tuple[float, float]:
    """Loss and accuracy over the evaluation set, each rank scoring its :func:`rank_slice`."""
    model.eval()
    loss_sum = correct = count = 0.0
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        logits = model(images)
        loss_sum += F.cross_entropy(logits, labels, reduction="sum").item()
        correct += (logits.argmax(1) == labels).sum().item()
        count += labels.numel()
    loss_sum, correct, count = _average([loss_sum, correct, count], "eval_metrics")
    return loss_sum / count, correct / count


def cosine_schedule(optimizer: torch.optim.Optimizer,
                    total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """A linear warm-up over the first 5 % of the steps (Horovod's advice for a learning rate
    scaled by the world size), then a cosine decay to zero."""
    warmup = max(1, total_steps // 20)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(1, total_steps - warmup)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
