"""Batches on the training device: worker processes, pinned memory, a prefetch on a side stream.

:class:`DeviceLoader` wraps PyTorch's ``DataLoader``. Workers produce ``uint8`` batches (crops
made on the CPU, or encoded JPEGs when ``gpu_decode``); on CUDA each batch is copied from pinned
memory and normalised on a side stream while the model trains on the previous one, so the copy
and the normalisation are hidden. On the CPU the workers' queue is the prefetch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ringtrain.data.normalize import IMAGENET_MEAN, IMAGENET_STD, normalize
from ringtrain.data.tuning import LoaderSettings, choose_loader_settings

Batch = tuple[torch.Tensor, torch.Tensor]


class DeviceLoader:
    """Normalised image batches (``dtype``, ``mean``/``std`` in 0..255 units) on ``device``, one
    epoch per iteration.

    Args:
        dataset: ``(uint8 [3, S, S], label)`` items (:class:`~ringtrain.data.classification.
            ClassificationImages`), or ``(uint8 encoded bytes, label)`` items with ``decoder``.
        sampler: This rank's indices (:class:`~ringtrain.data.sharding.ShardedSampler`).
        settings: Workers and prefetch depth; by default :func:`~ringtrain.data.tuning.
            choose_loader_settings` for ``local_size`` ranks on this host (``hvd.local_size()``).
        decoder: Turns a batch of encoded images (a list of 1-D ``uint8`` tensors) into a
            ``uint8 [N, 3, S, S]`` batch on ``device`` (:class:`~ringtrain.data.gpu_decode.
            GpuDecoder`); ``None`` when the workers crop.

    Raises:
        ValueError: ``batch_size`` is not positive.
    """

    def __init__(self, dataset: Dataset, batch_size: int, *, sampler: Sampler | None = None,
                 device: torch.device | str = "cpu", settings: LoaderSettings | None = None,
                 local_size: int = 1, dtype: torch.dtype = torch.float32,
                 channels_last: bool = False, mean: tuple[float, ...] = IMAGENET_MEAN,
                 std: tuple[float, ...] = IMAGENET_STD, decoder=None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.device = torch.device(device)
        self.settings = settings or choose_loader_settings(
            local_size=local_size, batch_size=batch_size,
            cpu_training=self.device.type == "cpu")
        self.dtype = dtype
        self.channels_last = channels_last
        self.mean, self.std = mean, std
        self.decoder = decoder
        cuda = self.device.type == "cuda"
        workers = self.settings.workers
        self.loader = DataLoader(
            dataset, batch_size=batch_size, sampler=sampler, shuffle=False,
            num_workers=workers, prefetch_factor=self.settings.prefetch if workers else None,
            persistent_workers=workers > 0, pin_memory=cuda,
            collate_fn=_collate_encoded if decoder is not None else None)
        self._stream = torch.cuda.Stream(self.device) if cuda else None

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def sampler(self) -> Sampler | Iterable:
        return self.loader.sampler

    def __iter__(self) -> Iterator[Batch]:
        batches = iter(self.loader)
        if self._stream is None:
            for images, labels in batches:
                yield self._to_device(images, labels)
            return
        # One batch ahead on the device: its copy and normalisation run on the side stream while
        # the caller's stream trains on the previous batch.
        ahead = self._upload(next(batches, None))
        while ahead is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(self._stream)
            images, labels = ahead
            images.record_stream(current)  # the side stream's allocation is used on `current`
            labels.record_stream(current)
            ahead = self._upload(next(batches, None))
            yield images, labels

    def _upload(self, batch: Batch | None) -> Batch | None:
        if batch is None:
            return None
        assert self._stream is not None
        with torch.cuda.stream(self._stream):
            return self._to_device(*batch)

    def _to_device(self, images, labels: torch.Tensor) -> Batch:
        if self.decoder is not None:
            images = self.decoder(images)
        else:
            images = images.to(self.device, non_blocking=True)
        images = normalize(images, self.mean, self.std, dtype=self.dtype,
                           channels_last=self.channels_last)
        return images, labels.to(self.device, non_blocking=True)


def _collate_encoded(items: list[tuple[torch.Tensor, int]]) -> tuple[list[torch.Tensor],
                                                                       torch.Tensor]:
    """Encoded images stay a list (their lengths differ); labels become one tensor."""
    return [blob for blob, _ in items], torch.tensor([label for _, label in items])
