"""Synthetic benchmark batches."""

from __future__ import annotations

import pytest
import torch

from ringtrain.data.synthetic import synthetic_batch


def test_shapes_dtypes_and_label_range() -> None:
    images, labels = synthetic_batch(4, image_shape=(3, 32, 32), num_classes=10)
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32
    assert labels.shape == (4,) and labels.dtype == torch.int64
    assert 0 <= int(labels.min()) and int(labels.max()) < 10


def test_fixed_by_seed_and_leaves_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a = synthetic_batch(2, image_shape=(1, 4, 4), dtype=torch.float64)
    b = synthetic_batch(2, image_shape=(1, 4, 4), dtype=torch.float64)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert a[0].dtype == torch.float64
    assert torch.equal(torch.rand(1), expected_next)
    assert not torch.equal(a[0], synthetic_batch(2, image_shape=(1, 4, 4), seed=1)[0].double())


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_size": 0},
        {"batch_size": 1, "num_classes": 0},
        {"batch_size": 1, "image_shape": (3, 4)},
    ],
)
def test_bad_sizes_are_value_errors(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        synthetic_batch(**kwargs)  # type: ignore[arg-type]
