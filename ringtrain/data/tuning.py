"""How many loader workers and how deep a prefetch queue: chosen from the machine, not guessed.

A rank needs its next batch decoded in the time one training step takes. With ``d`` ms of CPU
work per image, batches of ``b`` images and steps of ``s`` ms, that takes ``ceil(d * b / s)``
workers. The host's cores are shared by its ranks (``hvd.local_size()``), and each rank keeps one
core for its own training process. When the model trains on the CPU, workers take cores from
training: with one core per rank there is nothing to overlap, and decoding in the training
process itself (no workers) costs least; :func:`training_threads` gives the training the cores
the workers leave. Every value here is overridable by the caller.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sized
from dataclasses import dataclass
from typing import cast

import torch
from torch.utils.data import Dataset

from ringtrain.runner.threads import usable_cores


@dataclass(frozen=True)
class LoaderSettings:
    """Loader workers per rank and batches each worker keeps ready (DataLoader's
    ``prefetch_factor``), with the reason, for logs and ``ringtrain doctor``."""

    workers: int
    prefetch: int
    reason: str


def cores_per_rank(local_size: int) -> int:
    """The cores this process may use: its affinity mask divided among the host's ranks."""
    return max(1, usable_cores() // max(1, local_size))


def worker_budget(cores: int, *, cpu_training: bool) -> int:
    """Workers a rank of ``cores`` cores can run beside its training (0: decode in-process)."""
    return max(0 if cpu_training else 1, cores - 1)


def training_threads(cores: int, workers: int) -> int:
    """Intra-op threads for CPU training beside ``workers`` loader workers: the cores they leave.

    More threads than free cores make PyTorch's OpenMP team spin against the workers, which
    costs far more than the decoding itself.
    """
    return max(1, cores - workers)


def choose_loader_settings(*, local_size: int, batch_size: int, decode_ms: float | None = None,
                           step_ms: float | None = None, cores: int | None = None,
                           cpu_training: bool = False) -> LoaderSettings:
    """Workers and prefetch depth for one rank of ``local_size`` on this host: at least one
    worker for GPU training, so that decoding overlaps it; none for CPU training on one core
    per rank.

    ``decode_ms`` (:func:`measure_decode_ms`: CPU ms to read, decode and crop one image) and
    ``step_ms`` (a step without data waits, e.g. with synthetic data) are measured; either
    unknown: use every core this rank has (``cores``, default :func:`cores_per_rank`).
    """
    cores = cores if cores is not None else cores_per_rank(local_size)
    budget = worker_budget(cores, cpu_training=cpu_training)
    if budget == 0:
        return LoaderSettings(0, 2, "one core per rank training on the CPU: decoding in the "
                                    "training process avoids contention")
    if decode_ms is None or step_ms is None or step_ms <= 0:
        return LoaderSettings(budget, 2, f"{cores} cores per rank, one kept for training")
    needed = math.ceil(decode_ms * batch_size / step_ms)
    workers = max(1, min(budget, needed))
    # A worker that must cover more than one step's worth of batches keeps a deeper queue, so
    # that a slow image does not stall the step.
    prefetch = min(8, max(2, math.ceil(2 * needed / workers)))
    reason = (f"{decode_ms:.2f} ms/image x {batch_size} images per {step_ms:.1f} ms step needs "
              f"{needed} worker(s); {budget} core(s) free per rank")
    return LoaderSettings(workers, prefetch, reason)


def measure_decode_ms(dataset: Dataset, samples: int = 16) -> float:
    """Mean process CPU milliseconds on one thread to produce one item of a map-style
    ``dataset`` (read, decode, crop): ``samples`` items spread over it, after one warm-up.

    Raises:
        ValueError: ``dataset`` is empty.
    """
    n = len(cast(Sized, dataset))  # map-style: torch's Dataset declares no __len__
    if n == 0:
        raise ValueError("cannot measure an empty data set")
    picks = [i * n // samples for i in range(min(samples, n))]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a loader worker, which PyTorch gives one thread
    try:
        dataset[0]
        t0 = time.process_time()
        for i in picks:
            dataset[i]
        return (time.process_time() - t0) / len(picks) * 1e3
    finally:
        torch.set_num_threads(threads)
