"""Image augmentation on tensors: the random shifts and horizontal flips of the classic Keras
recipe (``ImageDataGenerator(width_shift_range=0.1, height_shift_range=0.1,
horizontal_flip=True)``), without torchvision.
"""

from __future__ import annotations

import torch


def random_shift_flip(
    image: torch.Tensor,
    *,
    max_shift: float = 0.1,
    flip: bool = True,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Shift an image by a random whole number of pixels and maybe mirror it left to right.

    Each axis is shifted independently by an integer drawn uniformly from
    ``[-int(max_shift * side), int(max_shift * side)]`` (2 pixels for 28-pixel images at the
    default 10 %). Pixels shifted in are zero: the background of the image sets this recipe is
    meant for is black, so zero reads as "more background" (Keras fills with the nearest pixel,
    which for such images is almost always zero too). Whole pixels keep it a copy, no resampling.

    ``image`` is ``[C, H, W]`` of any dtype; ``flip`` mirrors it with probability 1/2;
    ``generator`` is the random source (``None``: the global one). Returns a new tensor.

    Raises:
        ValueError: ``image`` is not three-dimensional or ``max_shift`` is outside ``[0, 1)``.
    """
    if image.dim() != 3:
        raise ValueError(f"expected a [C, H, W] image, got shape {tuple(image.shape)}")
    if not 0.0 <= max_shift < 1.0:
        raise ValueError(f"max_shift must be in [0, 1), got {max_shift}")
    _, h, w = image.shape
    max_dy, max_dx = int(max_shift * h), int(max_shift * w)
    # One draw for all three decisions keeps the per-sample cost to a single RNG call.
    u_dy, u_dx, u_flip = torch.rand(3, generator=generator).tolist()
    dy = min(int(u_dy * (2 * max_dy + 1)), 2 * max_dy) - max_dy
    dx = min(int(u_dx * (2 * max_dx + 1)), 2 * max_dx) - max_dx
    if flip and u_flip < 0.5:
        image = image.flip(-1)
    out = torch.zeros_like(image)
    out[:, max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)] = image[
        :, max(-dy, 0) : h - max(dy, 0), max(-dx, 0) : w - max(dx, 0)
    ]
    return out
