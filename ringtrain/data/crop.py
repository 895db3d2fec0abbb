"""Crops, resizes and flips of ``uint8`` images with torchvision.transforms.v2's semantics.

:func:`random_resized_crop_box` draws the box exactly as ``v2.RandomResizedCrop`` does (area
fraction uniform in ``scale``, log aspect ratio uniform in ``ratio``, ten tries then a centre
crop); :func:`resized_crop` resamples with bilinear interpolation and antialiasing, as v2 does on
tensors. The images stay ``uint8`` (a quarter of float32's bytes to move); conversion to float
and normalisation come last, on the training device (:mod:`ringtrain.data.normalize`).
"""

from __future__ import annotations

import math
import random
from typing import NamedTuple

import torch
import torch.nn.functional as F

#: ``v2.RandomResizedCrop``'s defaults.
SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)


class Box(NamedTuple):
    """A crop: top row, left column, height, width (torchvision's ``i, j, h, w``)."""

    top: int
    left: int
    height: int
    width: int

    def scaled(self, fy: float, fx: float) -> Box:
        """The same region in an image resized by ``fy`` vertically and ``fx`` horizontally."""
        return Box(int(self.top * fy), int(self.left * fx), max(1, round(self.height * fy)),
                   max(1, round(self.width * fx)))


def random_resized_crop_box(height: int, width: int, rng: random.Random,
                            scale: tuple[float, float] = SCALE,
                            ratio: tuple[float, float] = RATIO) -> Box:
    """The box, inside the image, that ``v2.RandomResizedCrop.make_params`` would draw for a
    ``height x width`` image from ``rng`` (one per loader worker, seeded per epoch): ``scale``
    bounds its area as a fraction of the image's, ``ratio`` its aspect (width / height)."""
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            return Box(rng.randint(0, height - h), rng.randint(0, width - w), h, w)
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        h, w = height, round(height * max(ratio))
    else:
        w, h = width, height
    return Box((height - h) // 2, (width - w) // 2, h, w)


def center_box(height: int, width: int, crop_fraction: float = 0.875) -> Box:
    """The evaluation crop: a centred square of ``crop_fraction`` of the short side (ImageNet's
    resize-256-crop-224)."""
    side = max(1, round(min(height, width) * crop_fraction))
    return Box((height - side) // 2, (width - side) // 2, side, side)


def resized_crop(image: torch.Tensor, box: Box, size: int, *, flip: bool = False) -> torch.Tensor:
    """Cut ``box`` out of a ``uint8 [C, H, W]`` or ``[N, C, H, W]`` image (any device), resize
    it to ``size x size`` and mirror it left to right if ``flip``."""
    crop = image[..., box.top:box.top + box.height, box.left:box.left + box.width]
    if flip:
        crop = crop.flip(-1)
    if crop.shape[-2:] == (size, size):
        return crop.contiguous()
    batched = crop if crop.dim() == 4 else crop.unsqueeze(0)
    out = F.interpolate(batched, size=(size, size), mode="bilinear", antialias=True,
                        align_corners=False)
    return out if crop.dim() == 4 else out.squeeze(0)
