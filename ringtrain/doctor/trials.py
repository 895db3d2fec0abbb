"""One trial: train a few steps of one data configuration with the step profiler on.

Every rank runs the same trials in the same order (they are collective: the optimizer averages
gradients); the per-rank results are gathered on every rank. A trial may read a sample of the
folder (:attr:`Workload.sample`) and have its measured steps planned once its warm-up shows
what a step costs (the quick check's budget, :mod:`ringtrain.doctor.budget`).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import ringtrain.torch as hvd
from ringtrain.data.classification import ClassificationImages, ImageSource, SourceDataset
from ringtrain.data.gpu_decode import EncodedImages, GpuDecoder
from ringtrain.data.image_folder import ImageFolder
from ringtrain.data.loader import DeviceLoader
from ringtrain.data.packed import PackedImages
from ringtrain.data.sharding import ShardedSampler
from ringtrain.data.synthetic import synthetic_batch
from ringtrain.data.tuning import (
    LoaderSettings,
    choose_loader_settings,
    training_threads,
)
from ringtrain.doctor.advice import TrialSpec
from ringtrain.doctor.progress import Progress
from ringtrain.torch.step_profiler import PHASES, StepProfiler


@dataclass
class Workload:
    """What every trial trains: the model, its optimizer and the shape of the work."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    device: torch.device
    batch_size: int
    size: int
    steps: int
    warmup: int
    folder: Path
    cores: int
    packed: Path | None = None
    num_classes: int = 1000
    bf16: bool = False
    #: The indices of the folder's images the trials read (every rank the same); ``None``:
    #: every image. A packed copy made for the trials holds only these.
    sample: list[int] | None = None


#: Plans a trial's measured steps from the seconds its last warm-up step took (``None``: no
#: warm-up step was run); rank 0's plan is the one every rank follows.
StepPlan = Callable[[float | None], int]


class SampledImages:
    """The images ``indices`` of ``source``, in that order: the quick check's sample of a
    folder."""

    def __init__(self, source: ImageSource, indices: list[int]) -> None:
        self.source = source
        self.indices = indices
        self.classes = source.classes

    def __len__(self) -> int:
        return len(self.indices)

    def read(self, index: int) -> tuple[bytes | memoryview | np.ndarray, int]:
        """Image ``index`` of the sample, as the source reads it."""
        return self.source.read(self.indices[index])


@dataclass
class TrialResult:
    """A trial's throughput and its step breakdown (mean over steps, then over ranks);
    ``workers`` ``None``: not known (a user's script that loads no batch through a
    ``DataLoader``)."""

    name: str
    data: str
    workers: int | None
    images_per_second: float
    breakdown_ms: dict[str, float]
    step_ms_per_rank: list[float]
    slowest_rank: int
    gap_closed: float | None = field(default=None)
    #: The relative half-width of the 95 % interval of the throughput: from the mean step's
    #: (the noisiest rank's) in one run, or from :attr:`rates` when the trial was repeated.
    noise: float = 0.0
    #: The throughput of each repeat (run, or window of steps in one run) the figures are the
    #: mean of; empty: measured once.
    rates: list[float] = field(default_factory=list)
    #: The half-width of the 95 % interval of each phase in :attr:`breakdown_ms` (ms), from the
    #: repeats; empty: not known.
    breakdown_half_ms: dict[str, float] = field(default_factory=dict)
    #: The half-width of the 95 % interval of each rank's mean step (ms); empty: not known.
    step_half_ms_per_rank: list[float] = field(default_factory=list)
    #: Measured steps (per run; the fewest of any rank); 0: not known.
    measured_steps: int = 0

    @property
    def interval(self) -> tuple[float, float]:
        """The 95 % interval of :attr:`images_per_second`."""
        if self.rates:  # measured directly on the repeats' rates
            half = self.images_per_second * self.noise
            return (self.images_per_second - half, self.images_per_second + half)
        return (self.images_per_second / (1 + self.noise),
                self.images_per_second / max(1 - self.noise, 1e-9))

    def to_json(self) -> dict:
        out = {**asdict(self), "images_per_second_interval": list(self.interval)}
        if self.breakdown_half_ms:
            out["breakdown_ms_interval"] = {
                p: [ms - self.breakdown_half_ms[p], ms + self.breakdown_half_ms[p]]
                for p, ms in self.breakdown_ms.items()}
        return out


def run_trial(spec: TrialSpec, work: Workload, progress: Progress | None = None,
              plan: StepPlan | None = None) -> TrialResult:
    """Train ``work.warmup`` steps, then ``work.steps`` measured steps (or as many as ``plan``
    says after the warm-up), fed as ``spec`` says; collective over ranks. ``progress`` hears
    of every step."""
    batches, workers = _batches(spec, work)
    threads = torch.get_num_threads()
    if work.device.type == "cpu":  # the training's threads share the cores with the workers
        torch.set_num_threads(training_threads(work.cores, workers))
    try:
        return _train(spec, work, batches, workers, progress or Progress(False), plan)
    finally:
        torch.set_num_threads(threads)


def _agreed_steps(spec: TrialSpec, plan: StepPlan, step_s: float | None) -> int:
    """Rank 0's plan on every rank: the steps are collective, so all must run as many."""
    return hvd.broadcast_object(plan(step_s), root_rank=0, name=f"doctor.{spec.name}.steps")


def _train(spec: TrialSpec, work: Workload, batches: Iterator, workers: int,
           progress: Progress, plan: StepPlan | None) -> TrialResult:
    profiler = StepProfiler(work.device, metrics_dir=False, skip=work.warmup)
    total = work.warmup + work.steps
    if plan is not None and work.warmup == 0:  # no warm-up step to time: plan from none
        total = work.warmup + _agreed_steps(spec, plan, None)
    progress.start(spec.name, total)
    last = time.perf_counter()
    for done, (images, labels) in enumerate(profiler.iterate(batches), 1):
        with profiler.phase("h2d"):
            images = images.to(work.device, non_blocking=True)
            labels = labels.to(work.device, non_blocking=True)
        with profiler.phase("forward_backward"), torch.autocast(
                work.device.type, dtype=torch.bfloat16, enabled=work.bf16):
            F.cross_entropy(work.model(images), labels).backward()
        profiler.optimizer_step(work.optimizer)
        work.optimizer.zero_grad()
        planning = plan is not None and done == work.warmup
        if planning and work.device.type == "cuda":  # the step's kernels, not only their launch
            torch.cuda.synchronize(work.device)
        now = time.perf_counter()
        if planning:
            # Planned inside the last warm-up step, which the profiler leaves out, so the
            # broadcast costs no measured step anything.
            assert plan is not None  # planning says so
            total = work.warmup + _agreed_steps(spec, plan, now - last)
            progress.resize(total)
        last = now
        progress.step(done)
        if done >= total:
            break
    profiler.close()
    every = hvd.allgather_object(profiler.summary(), name=f"doctor.{spec.name}")
    measured = total - work.warmup  # as planned: every rank ran as many
    return result_of_ranks(spec.name, spec.data, workers, every,
                           measured * work.batch_size * len(every))


def result_of_ranks(name: str, data: str, workers: int | None, summaries: list[dict],
                    samples: float) -> TrialResult:
    """A trial's result from each rank's :func:`~ringtrain.torch.step_profiler.summarize` of
    its measured steps, and the ``samples`` all ranks trained in them."""
    # The measured steps back to back: each starts where the previous one ended.
    wall_s = max(s["step_ms"] * s["steps"] for s in summaries) / 1e3
    breakdown = {p: sum(s[f"{p}_ms"] for s in summaries) / len(summaries) for p in PHASES}
    breakdown["step"] = sum(s["step_ms"] for s in summaries) / len(summaries)
    per_rank = [s["step_ms"] for s in summaries]
    noise = max((1.96 * s.get("step_ms_sd", 0.0) / math.sqrt(s["steps"]) / s["step_ms"]
                 for s in summaries if s["steps"] > 1 and s["step_ms"] > 0), default=0.0)
    return TrialResult(name, data, workers, samples / wall_s, breakdown, per_rank,
                       max(range(len(per_rank)), key=per_rank.__getitem__), noise=noise,
                       measured_steps=int(min(s["steps"] for s in summaries)))


def _forever(loader: Iterable, sampler) -> Iterator:
    """``loader``'s epochs one after another, each with its own order (``sampler.set_epoch``)."""
    for epoch in itertools.count():
        sampler.set_epoch(epoch)
        yield from loader


def _batches(spec: TrialSpec, work: Workload) -> tuple[Iterator, int]:
    """Endless batches for ``spec`` and the number of loader workers behind them."""
    if spec.data == "synthetic":
        batch = synthetic_batch(work.batch_size, image_shape=(3, work.size, work.size),
                                num_classes=work.num_classes, device=work.device)
        return itertools.repeat(batch), 0
    settings = (choose_loader_settings(local_size=hvd.local_size(), batch_size=work.batch_size,
                                       cores=work.cores, cpu_training=work.device.type == "cpu")
                if spec.workers is None else LoaderSettings(spec.workers, 2, "given"))
    if spec.data == "torchvision":
        return _torchvision_batches(work, settings.workers), settings.workers
    source: ImageSource
    if spec.data == "packed" and work.packed is not None:
        source = PackedImages(work.packed)  # made of the sample already, if there is one
    else:
        folder = ImageFolder(work.folder)
        source = folder if work.sample is None else SampledImages(folder, work.sample)
    sampler = ShardedSampler(source, work.batch_size, last_batch="drop")
    dataset: SourceDataset
    decoder: GpuDecoder | None
    if spec.data == "gpu":
        dataset, decoder = EncodedImages(source), GpuDecoder(work.device, work.size)
    else:
        dataset, decoder = ClassificationImages(source, work.size), None
    loader = DeviceLoader(dataset, work.batch_size, sampler=sampler, device=work.device,
                          settings=settings, decoder=decoder)
    return _forever(loader, sampler), settings.workers


def torchvision_dataset(folder: Path, size: int):
    """The common baseline: torchvision's ImageFolder with PIL decoding and the classic
    RandomResizedCrop, flip, ToTensor, Normalize transforms."""
    from ringtrain.models.vision import load_torchvision

    load_torchvision()
    from torchvision import datasets, transforms

    return datasets.ImageFolder(str(folder), transforms.Compose([
        transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]))


def _torchvision_batches(work: Workload, workers: int) -> Iterator:
    from torch.utils.data import DataLoader, DistributedSampler, Subset

    folder = torchvision_dataset(work.folder, work.size)
    # A sample: the images the other trials read where torchvision lists the folder as
    # ringtrain does (sorted, the same suffixes: ImageNet's layout); one of the same size
    # otherwise.
    dataset = folder if work.sample is None else Subset(folder, work.sample)
    sampler: DistributedSampler = DistributedSampler(dataset, num_replicas=hvd.size(),
                                                     rank=hvd.rank())
    loader = DataLoader(dataset, batch_size=work.batch_size, sampler=sampler, drop_last=True,
                        num_workers=workers, persistent_workers=workers > 0,
                        pin_memory=work.device.type == "cuda")
    return _forever(loader, sampler)
