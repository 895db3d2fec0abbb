"""Image classification samples: read, decode and crop one image to a ``uint8`` square.

The training crop is ``v2.RandomResizedCrop`` + ``RandomHorizontalFlip``; the evaluation crop is
the centre 87.5 % (resize 256, crop 224). For JPEG files the crop box is drawn on the size read
from the header, and the decoder then skips the detail the resize would discard (1/2, 1/4 or 1/8
scale inside the DCT), so a small crop of a large photo costs little more than its pixels.
"""

from __future__ import annotations

import math
import random
from typing import Protocol, cast

import numpy as np
import torch
from torch.utils.data import Dataset

from ringtrain.data import jpeg
from ringtrain.data.crop import (
    RATIO,
    SCALE,
    Box,
    center_box,
    random_resized_crop_box,
    resized_crop,
)


class ImageSource(Protocol):
    """Where images come from: an :class:`~ringtrain.data.image_folder.ImageFolder` (encoded
    bytes) or a :class:`~ringtrain.data.packed.PackedImages` (bytes or decoded arrays)."""

    classes: list[str]

    def __len__(self) -> int: ...

    def read(self, index: int) -> tuple[bytes | memoryview | np.ndarray, int]: ...


class SourceDataset(Dataset[tuple[torch.Tensor, int]]):
    """A map-style data set over an image source: its length and class names are the source's."""

    def __init__(self, source: ImageSource) -> None:
        self.source = source

    @property
    def classes(self) -> list[str]:
        return self.source.classes

    def __len__(self) -> int:
        return len(self.source)


class ClassificationImages(SourceDataset):
    """``(uint8 [3, size, size] image, label)`` items of an image source, cropped on the CPU:
    random resized crops (``scale``, ``ratio`` as ``RandomResizedCrop``'s) and flips when
    ``train``, else the centre crop. ``rng`` defaults to Python's global generator, which
    PyTorch's DataLoader seeds differently in every worker and every epoch.

    Raises:
        ValueError: ``size`` is not positive.
    """

    def __init__(self, source: ImageSource, size: int = 224, *, train: bool = True,
                 scale: tuple[float, float] = SCALE, ratio: tuple[float, float] = RATIO,
                 rng: random.Random | None = None) -> None:
        if size < 1:
            raise ValueError(f"size must be positive, got {size}")
        super().__init__(source)
        self.size = size
        self.train = train
        self.scale = scale
        self.ratio = ratio
        self.rng = rng

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        data, label = self.source.read(index)
        return self.crop(data), label

    def crop(self, data: bytes | memoryview | np.ndarray) -> torch.Tensor:
        """Decode (if encoded) and crop one image to ``uint8 [3, size, size]``."""
        # the module's generator, which DataLoader seeds per worker (its functions are the
        # methods of a Random)
        rng = self.rng or cast(random.Random, random)
        if isinstance(data, np.ndarray):
            height, width = data.shape[:2]
            pixels = data
            box = self._box(height, width, rng)
        else:
            height, width = jpeg.image_size(data)
            box = self._box(height, width, rng)
            # The smallest decode in which the box still has at least `size` pixels a side.
            pixels = jpeg.decode_rgb(data, min_height=min(height, math.ceil(
                height * self.size / box.height)), min_width=min(width, math.ceil(
                    width * self.size / box.width)))
            box = box.scaled(pixels.shape[0] / height, pixels.shape[1] / width)
        flip = self.train and rng.random() < 0.5
        return resized_crop(torch.from_numpy(pixels).permute(2, 0, 1), box, self.size, flip=flip)

    def _box(self, height: int, width: int, rng: random.Random) -> Box:
        if self.train:
            return random_resized_crop_box(height, width, rng, self.scale, self.ratio)
        return center_box(height, width)
