"""Shifts and flips: what they may and may not do to an image."""

from __future__ import annotations

import pytest
import torch

from ringtrain.data.augment import random_shift_flip


def _find_offset(original: torch.Tensor, out: torch.Tensor) -> tuple[int, int, bool] | None:
    """The (dy, dx, flipped) that turns ``original`` into ``out``, if any does within 3 px."""
    _, h, w = original.shape
    for flipped in (False, True):
        src = original.flip(-1) if flipped else original
        for dy in range(-3, 4):
            for dx in range(-3, 4):
                expected = torch.zeros_like(src)
                expected[:, max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)] = src[
                    :, max(-dy, 0) : h - max(dy, 0), max(-dx, 0) : w - max(dx, 0)
                ]
                if torch.equal(expected, out):
                    return dy, dx, flipped
    return None


def test_output_is_a_shift_of_at_most_ten_percent_maybe_flipped() -> None:
    g = torch.Generator().manual_seed(1)
    image = torch.rand(1, 28, 28, generator=g) + 0.1  # no zeros: every shift is distinguishable
    seen: set[tuple[int, int, bool]] = set()
    for _ in range(400):
        out = random_shift_flip(image, generator=g)
        assert out.shape == image.shape and out.dtype == image.dtype
        found = _find_offset(image, out)
        assert found is not None
        dy, dx, _ = found
        assert abs(dy) <= 2 and abs(dx) <= 2  # int(0.1 * 28) == 2
        seen.add(found)
    # Every one of the 5 x 5 shifts, flipped and not, turns up in 400 draws.
    assert len(seen) == 50


def test_no_shift_and_no_flip_is_the_identity() -> None:
    image = torch.rand(3, 8, 8)
    assert torch.equal(random_shift_flip(image, max_shift=0.0, flip=False), image)


def test_content_is_preserved_not_resampled() -> None:
    image = torch.arange(2 * 20 * 20, dtype=torch.int64).reshape(2, 20, 20)
    out = random_shift_flip(image, generator=torch.Generator().manual_seed(3))
    kept = out[out != 0]
    # Whole-pixel moves copy values: each surviving value is one of the input's, once.
    assert kept.unique().numel() == kept.numel()
    assert torch.isin(kept, image).all()
    assert kept.numel() >= 16 * 16 * 2


def test_same_generator_seed_gives_the_same_result() -> None:
    image = torch.rand(1, 28, 28)
    a = random_shift_flip(image, generator=torch.Generator().manual_seed(7))
    b = random_shift_flip(image, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b)


def test_input_is_not_modified() -> None:
    image = torch.rand(1, 28, 28)
    before = image.clone()
    random_shift_flip(image)
    assert torch.equal(image, before)


@pytest.mark.parametrize(("shape", "max_shift"), [((28, 28), 0.1), ((1, 28, 28), 1.0)])
def test_bad_arguments_are_value_errors(shape: tuple[int, ...], max_shift: float) -> None:
    with pytest.raises(ValueError):
        random_shift_flip(torch.zeros(shape), max_shift=max_shift)
