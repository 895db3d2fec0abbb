"""Fashion-MNIST on the real files of the `dataset-fashion-mnist` package, and on broken copies."""

from __future__ import annotations

import gzip
import shutil
import struct
from pathlib import Path

import pytest
import torch

from ringtrain.data.fashion_mnist import (
    CLASSES,
    DEFAULT_DATA_DIR,
    FashionMNIST,
    load_fashion_mnist,
)
from ringtrain.data.idx import DatasetFileError

pytestmark = pytest.mark.skipif(
    not (DEFAULT_DATA_DIR / "t10k-labels-idx1-ubyte.gz").exists(),
    reason="Fashion-MNIST not installed: apt-get install dataset-fashion-mnist",
)


@pytest.fixture(scope="module")
def test_split() -> tuple[torch.Tensor, torch.Tensor]:
    return load_fashion_mnist("test")


def test_train_split_has_60000_examples() -> None:
    images, labels = load_fashion_mnist("train")
    assert images.shape == (60_000, 28, 28) and images.dtype == torch.uint8
    assert labels.shape == (60_000,) and labels.dtype == torch.uint8
    # The published set is balanced: 6,000 of each class.
    assert torch.bincount(labels.long(), minlength=10).tolist() == [6000] * 10


def test_test_split_shapes_and_label_range(test_split: tuple[torch.Tensor, torch.Tensor]) -> None:
    images, labels = test_split
    assert images.shape == (10_000, 28, 28)
    assert labels.shape == (10_000,)
    assert int(labels.min()) == 0 and int(labels.max()) == len(CLASSES) - 1
    assert 0 < images.float().mean() < 255


def test_dataset_normalises_to_unit_range() -> None:
    ds = FashionMNIST("test")
    image, label = ds[0]
    assert len(ds) == 10_000
    assert image.shape == (1, 28, 28) and image.dtype == torch.float32
    assert 0.0 <= float(image.min()) and float(image.max()) <= 1.0
    assert label.dtype == torch.int64


def test_augmented_dataset_keeps_shape_range_and_labels() -> None:
    plain = FashionMNIST("test")
    augmented = FashionMNIST("test", augment=True, generator=torch.Generator().manual_seed(0))
    changed = 0
    for i in range(50):
        (x, y), (xa, ya) = plain[i], augmented[i]
        assert xa.shape == x.shape and int(ya) == int(y)
        assert 0.0 <= float(xa.min()) and float(xa.max()) <= 1.0
        changed += not torch.equal(x, xa)
    # The identity (no shift, no flip) has probability 1/50, so most examples change.
    assert changed > 40


def test_unknown_split_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="'train' or 'test'"):
        load_fashion_mnist("validation")  # type: ignore[arg-type]


def test_missing_directory_says_how_to_install(tmp_path: Path) -> None:
    with pytest.raises(DatasetFileError, match="apt-get install dataset-fashion-mnist") as info:
        load_fashion_mnist("test", tmp_path)
    assert str(tmp_path / "t10k-images-idx3-ubyte.gz") in str(info.value)


def test_uncompressed_files_are_read_too(tmp_path: Path) -> None:
    for name in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        with gzip.open(DEFAULT_DATA_DIR / f"{name}.gz", "rb") as src:
            (tmp_path / name).write_bytes(src.read())
    images, labels = load_fashion_mnist("test", tmp_path)
    assert images.shape == (10_000, 28, 28) and labels.shape == (10_000,)


def _copy_test_split(tmp_path: Path) -> None:
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(DEFAULT_DATA_DIR / name, tmp_path / name)


def test_wrong_count_is_refused(tmp_path: Path) -> None:
    _copy_test_split(tmp_path)
    with gzip.open(tmp_path / "t10k-labels-idx1-ubyte.gz", "wb") as f:
        f.write(struct.pack(">HBBI", 0, 8, 1, 3) + bytes(3))
    with pytest.raises(DatasetFileError, match="3 labels, expected 10000"):
        load_fashion_mnist("test", tmp_path)


def test_label_out_of_range_is_refused(tmp_path: Path) -> None:
    _copy_test_split(tmp_path)
    with gzip.open(tmp_path / "t10k-labels-idx1-ubyte.gz", "wb") as f:
        f.write(struct.pack(">HBBI", 0, 8, 1, 10_000) + bytes([10]) * 10_000)
    with pytest.raises(DatasetFileError, match="label 10 outside 0..9"):
        load_fashion_mnist("test", tmp_path)


def test_images_swapped_for_labels_is_refused(tmp_path: Path) -> None:
    _copy_test_split(tmp_path)
    shutil.copy(
        tmp_path / "t10k-labels-idx1-ubyte.gz", tmp_path / "t10k-images-idx3-ubyte.gz"
    )
    with pytest.raises(DatasetFileError, match="t10k-images-idx3-ubyte.gz: magic number"):
        load_fashion_mnist("test", tmp_path)
