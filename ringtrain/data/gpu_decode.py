"""Decoding and cropping on the GPU: workers only read bytes; nvjpeg decodes a batch at once.

For hosts whose cores cannot decode as fast as the GPUs train (the reference ResNet-50 runs
~250 images/s per H100 core's worth of JPEG decoding): :class:`EncodedImages` gives the files'
bytes, :class:`GpuDecoder` decodes the batch with nvjpeg in one call and makes the
``v2.RandomResizedCrop`` + flip (or centre) crops on the device.
"""

from __future__ import annotations

import random
from typing import cast

import numpy as np
import torch

from ringtrain.data.classification import SourceDataset
from ringtrain.data.crop import (
    RATIO,
    SCALE,
    center_box,
    random_resized_crop_box,
    resized_crop,
)
from ringtrain.data.jpeg import decode_jpeg_cuda


class EncodedImages(SourceDataset):
    """``(uint8 [nbytes] encoded file, label)`` items of an image source that stores JPEGs (an
    image folder of JPEGs or a JPEG-format packed file)."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        data, label = self.source.read(index)
        if isinstance(data, np.ndarray):
            raise TypeError("EncodedImages needs encoded files; this source holds decoded "
                            "pixels (a raw packed file): crop it on the CPU instead")
        return torch.frombuffer(bytearray(data), dtype=torch.uint8), label


class GpuDecoder:
    """Decode a batch of JPEGs on a CUDA device and crop each to ``size x size``: random
    resized crops and flips when ``train`` (else centre crops), drawn from ``rng`` (the main
    process's; default Python's global one)."""

    def __init__(self, device: torch.device | str, size: int = 224, *, train: bool = True,
                 scale: tuple[float, float] = SCALE, ratio: tuple[float, float] = RATIO,
                 rng: random.Random | None = None) -> None:
        self.device = torch.device(device)
        self.size = size
        self.train = train
        self.scale, self.ratio = scale, ratio
        # the module's functions: its global generator (they are the methods of a Random)
        self.rng = rng or cast(random.Random, random)

    def __call__(self, blobs: list[torch.Tensor]) -> torch.Tensor:
        """``uint8 [N, 3, size, size]`` crops of the decoded batch, on the device."""
        crops = []
        for image in decode_jpeg_cuda(blobs, self.device):
            h, w = image.shape[-2:]
            if self.train:
                box = random_resized_crop_box(h, w, self.rng, self.scale, self.ratio)
                flip = self.rng.random() < 0.5
            else:
                box, flip = center_box(h, w), False
            crops.append(resized_crop(image, box, self.size, flip=flip))
        return torch.stack(crops)
