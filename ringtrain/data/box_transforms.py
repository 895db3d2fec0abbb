"""Geometric transforms of a detection sample: a ``uint8 [C, H, W]`` image and its boxes move
together.

Boxes are ``float32 [N, 4]`` corners ``(x1, y1, x2, y2)`` in pixels of the image, as
:class:`~ringtrain.data.coco.CocoDetection` gives them (a box covers ``x1 <= x < x2``), so a
flip maps ``x`` to ``W - x`` and a resize multiplies by the size ratio exactly, as
``torchvision.transforms.v2`` does with its ``BoundingBoxes``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def hflip(image: torch.Tensor, boxes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The image and new boxes mirrored left to right: ``x1' = W - x2``, ``x2' = W - x1``."""
    width = image.shape[-1]
    flipped = boxes.clone()
    flipped[:, 0] = width - boxes[:, 2]
    flipped[:, 2] = width - boxes[:, 0]
    return image.flip(-1), flipped


def resize(image: torch.Tensor, boxes: torch.Tensor, height: int,
           width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Resample to ``height x width`` (bilinear, antialiased, as v2 on tensors); box ``x``s are
    multiplied by ``width / W`` and ``y``s by ``height / H``.

    Raises:
        ValueError: ``height`` or ``width`` is not positive.
    """
    if height < 1 or width < 1:
        raise ValueError(f"resize needs a positive size, got {height}x{width}")
    old_h, old_w = image.shape[-2:]
    if (old_h, old_w) == (height, width):
        return image, boxes.clone()
    out = F.interpolate(image.unsqueeze(0), size=(height, width), mode="bilinear",
                        antialias=True, align_corners=False).squeeze(0)
    factors = torch.tensor([width / old_w, height / old_h, width / old_w, height / old_h],
                           dtype=boxes.dtype)
    return out, boxes * factors


def crop(image: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor, top: int, left: int,
         height: int, width: int, *, min_visible: float = 0.0
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cut ``height x width`` pixels at ``(top, left)`` out of the image; boxes move by
    ``(-left, -top)`` and are clipped to the crop. A box left with no area is dropped (with its
    label), and so is one keeping less than ``min_visible`` of its area. Returns the crop, its
    boxes and their labels.

    Raises:
        ValueError: the region is not inside the image.
    """
    img_h, img_w = image.shape[-2:]
    if not (0 <= top and 0 <= left and height >= 1 and width >= 1 and top + height <= img_h
            and left + width <= img_w):
        raise ValueError(f"crop {height}x{width} at (top {top}, left {left}) is not inside the "
                         f"{img_h}x{img_w} image")
    shift = torch.tensor([left, top, left, top], dtype=boxes.dtype)
    limit = torch.tensor([width, height, width, height], dtype=boxes.dtype)
    moved = boxes - shift
    clipped = torch.minimum(moved.clamp(min=0), limit)
    area = (clipped[:, 2] - clipped[:, 0]) * (clipped[:, 3] - clipped[:, 1])
    before = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    keep = (area > 0) & (area >= min_visible * before)
    return (image[..., top:top + height, left:left + width], clipped[keep], labels[keep])
