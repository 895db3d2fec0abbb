"""Detection training samples: read, decode and augment one image with its boxes.

The augmentation is the usual detection recipe: scale jitter (the image resized by a random
factor, boxes scaled with it), a random crop of at most ``crop`` pixels (boxes clipped to it,
those left empty dropped) and a random horizontal flip (boxes mirrored). Every random draw is a
function of ``(seed, epoch, index)`` alone, so a sample is the same whatever the worker count,
the worker that makes it, a restart or a resumed epoch: iterate the sampler through
:class:`EpochKeys` so that each item knows its epoch, and batch with
:func:`ringtrain.data.coco.collate` (lists: the images differ in size).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Protocol

import torch
from torch.utils.data import Dataset, Sampler

from ringtrain.data import box_transforms, jpeg
from ringtrain.data.coco import CocoDetection

Target = dict[str, torch.Tensor]


class EpochSampler(Protocol):
    """Indices with a length and an epoch: ``ShardedSampler``, ``DistributedSampler``."""

    @property
    def epoch(self) -> int: ...

    def __iter__(self) -> Iterator[int]: ...

    def __len__(self) -> int: ...


class EpochKeys(Sampler[tuple[int, int]]):
    """A sampler's indices as ``(epoch, index)`` keys, the epoch read from ``sampler.epoch``
    (:class:`~ringtrain.data.sharding.ShardedSampler`, ``DistributedSampler``) when an epoch's
    iteration starts."""

    def __init__(self, sampler: EpochSampler) -> None:
        self.sampler = sampler

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = self.sampler.epoch
        return ((epoch, index) for index in self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)


class DetectionImages(Dataset[tuple[torch.Tensor, Target]]):
    """``(uint8 [3, h, w] image, target)`` items of a COCO detection set, augmented for training.

    Targets are :meth:`CocoDetection.read`'s (``boxes`` ``[N, 4]`` ``x1, y1, x2, y2`` float32,
    ``labels`` ``[N]``, ``image_id``), moved with the image.

    Args:
        train: Augment (else the image as it is).
        scale: Range of the resize factor (uniform); ``(1, 1)``: no resize.
        crop: Largest ``(height, width)`` of the random crop; ``None``: no crop. An image
            smaller than that on a side keeps that side whole.
        flip: Probability of a horizontal flip.
        min_visible: A box the crop cuts keeps at least this fraction of its area, else it is
            dropped (boxes left with no area are always dropped).
        seed: Seeds every draw, with the epoch and the index; ranks must agree on it.

    Raises:
        ValueError: ``scale`` is not a positive range, ``crop`` not positive or ``flip`` or
            ``min_visible`` outside ``[0, 1]``.
    """

    def __init__(self, source: CocoDetection, *, train: bool = True,
                 scale: tuple[float, float] = (0.75, 1.25), crop: tuple[int, int] | None = None,
                 flip: float = 0.5, min_visible: float = 0.0, seed: int = 0) -> None:
        if not 0 < scale[0] <= scale[1]:
            raise ValueError(f"scale must be a range of positive factors, got {scale}")
        if crop is not None and min(crop) < 1:
            raise ValueError(f"crop must be a positive (height, width), got {crop}")
        if not (0 <= flip <= 1 and 0 <= min_visible <= 1):
            raise ValueError(f"flip and min_visible must be in [0, 1], got {flip} and "
                             f"{min_visible}")
        self.source = source
        self.train = train
        self.scale = scale
        self.crop = crop
        self.flip = flip
        self.min_visible = min_visible
        self.seed = seed

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, Target]:
        """Item ``index`` as augmented in ``epoch``; ``key`` is ``(epoch, index)``
        (:class:`EpochKeys`) or an index (epoch 0)."""
        epoch, index = key if isinstance(key, tuple) else (0, key)
        data, target = self.source.read(index)
        image = torch.from_numpy(jpeg.decode_rgb(data)).permute(2, 0, 1)
        if not self.train:
            return image.contiguous(), target
        image, boxes, labels = self.augment(image, target["boxes"], target["labels"],
                                            self.rng(epoch, index))
        return image.contiguous(), {**target, "boxes": boxes, "labels": labels}

    def rng(self, epoch: int, index: int) -> random.Random:
        """The random source of one item in one epoch (seeded from a string: the same in every
        process, whatever ``PYTHONHASHSEED``)."""
        return random.Random(f"{self.seed}/{epoch}/{index}")

    def augment(self, image: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor,
                rng: random.Random) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Scale jitter, crop and flip with draws from ``rng``, in that order."""
        height, width = image.shape[-2:]
        factor = rng.uniform(*self.scale)
        image, boxes = box_transforms.resize(image, boxes, max(1, round(height * factor)),
                                             max(1, round(width * factor)))
        if self.crop is not None:
            height, width = image.shape[-2:]
            crop_h, crop_w = min(self.crop[0], height), min(self.crop[1], width)
            top, left = rng.randint(0, height - crop_h), rng.randint(0, width - crop_w)
            image, boxes, labels = box_transforms.crop(image, boxes, labels, top, left, crop_h,
                                                       crop_w, min_visible=self.min_visible)
        if rng.random() < self.flip:
            image, boxes = box_transforms.hflip(image, boxes)
        return image, boxes, labels

