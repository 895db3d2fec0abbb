"""Crops with torchvision.transforms.v2's semantics, and the normalisation."""

from __future__ import annotations

import math
import random

import pytest
import torch

from ringtrain.data.crop import center_box, random_resized_crop_box, resized_crop
from ringtrain.data.normalize import normalize
from ringtrain.models.vision import load_torchvision


def test_random_boxes_stay_inside_and_within_scale_and_ratio():
    rng = random.Random(0)
    for _ in range(500):
        h, w = rng.randint(20, 400), rng.randint(20, 400)
        box = random_resized_crop_box(h, w, rng)
        assert 0 <= box.top and box.top + box.height <= h
        assert 0 <= box.left and box.left + box.width <= w
        area = box.height * box.width / (h * w)
        ratio = box.width / box.height
        fallback = box == center_box(h, w, 1.0) or box.top == (h - box.height) // 2
        assert fallback or (0.08 * 0.8 <= area <= 1.0 and 0.7 <= ratio <= 1.4)


def test_extreme_aspect_falls_back_to_a_centre_crop_like_torchvision():
    box = random_resized_crop_box(10, 1000, random.Random(0), scale=(0.9, 1.0))
    assert (box.height, box.width) == (10, round(10 * 4 / 3))
    assert box.left == (1000 - box.width) // 2


def test_resized_crop_matches_torchvision_v2():
    if load_torchvision() is None:
        pytest.skip("torchvision not installed")
    from torchvision.transforms.v2 import functional as TF

    image = torch.randint(0, 256, (3, 90, 120), dtype=torch.uint8)
    box = random_resized_crop_box(90, 120, random.Random(4))
    ours = resized_crop(image, box, 32, flip=True)
    theirs = TF.horizontal_flip(TF.resized_crop(image, *box, [32, 32], antialias=True))
    assert ours.dtype == torch.uint8 and ours.shape == (3, 32, 32)
    assert (ours.int() - theirs.int()).abs().max() <= 1


def test_normalize_makes_floats_per_channel():
    images = torch.full((2, 3, 4, 4), 128, dtype=torch.uint8)
    out = normalize(images, (128.0, 0.0, 28.0), (1.0, 128.0, 50.0), channels_last=True)
    assert out.dtype == torch.float32 and out.is_contiguous(memory_format=torch.channels_last)
    assert out[:, 0].eq(0).all() and out[:, 1].eq(1).all() and math.isclose(out[0, 2, 0, 0], 2)
    with pytest.raises(ValueError, match="one per channel"):
        normalize(images, (0.0,), (1.0,))
    with pytest.raises(ValueError, match=r"\[N, C, H, W\]"):
        normalize(images[0])
