"""Fashion-MNIST (Zalando's 28x28 grey clothing images, 10 classes) from its IDX files.

The files come from the Debian package ``dataset-fashion-mnist``, which puts them in
:data:`DEFAULT_DATA_DIR`. Nothing is downloaded: a missing file is an error that says how to
install it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from torch.utils.data import Dataset

from ringtrain.data.augment import random_shift_flip
from ringtrain.data.idx import DatasetFileError, read_idx

DEFAULT_DATA_DIR = Path("/usr/share/datasets/fashion-mnist")

CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)

Split = Literal["train", "test"]

# split -> (images file, labels file, number of examples), names as published by Zalando.
_FILES: dict[str, tuple[str, str, int]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", 60_000),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", 10_000),
}
_SIDE = 28
_HINT = (
    "install the files with `apt-get install dataset-fashion-mnist`, or point data_dir at a "
    "directory holding the four *-ubyte.gz files"
)


def load_fashion_mnist(
    split: Split, data_dir: str | Path = DEFAULT_DATA_DIR
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read the ``"train"`` (60,000 examples) or ``"test"`` (10,000) split from the IDX files
    in ``data_dir`` (gzip-compressed or not) as ``uint8`` images ``[N, 28, 28]`` and labels
    ``[N]`` in ``0..9`` (names in :data:`CLASSES`).

    Raises:
        ValueError: ``split`` is neither ``"train"`` nor ``"test"``.
        DatasetFileError: A file is missing or corrupt, or holds the wrong number or shape of
            examples; the message names the file and how to get a good one.
    """
    if split not in _FILES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    images_name, labels_name, count = _FILES[split]
    images_path = _find(Path(data_dir), images_name)
    labels_path = _find(Path(data_dir), labels_name)
    images = read_idx(images_path, ndim=3, hint=_HINT)
    labels = read_idx(labels_path, ndim=1, hint=_HINT)
    if tuple(images.shape) != (count, _SIDE, _SIDE):
        raise DatasetFileError(
            f"{images_path}: shape {tuple(images.shape)}, expected {(count, _SIDE, _SIDE)} for "
            f"the {split} split ({_HINT})"
        )
    if tuple(labels.shape) != (count,):
        raise DatasetFileError(
            f"{labels_path}: {labels.shape[0]} labels, expected {count} for the {split} split "
            f"({_HINT})"
        )
    if int(labels.max()) >= len(CLASSES):
        raise DatasetFileError(
            f"{labels_path}: label {int(labels.max())} outside 0..{len(CLASSES) - 1} ({_HINT})"
        )
    return images, labels


def _find(data_dir: Path, name: str) -> Path:
    """The compressed file if present, else the plain one (whose absence read_idx reports)."""
    gz = data_dir / f"{name}.gz"
    if gz.exists() or not (data_dir / name).exists():
        return gz
    return data_dir / name


class FashionMNIST(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Fashion-MNIST as ``(image, label)`` pairs: ``float32 [1, 28, 28]`` in ``[0, 1]`` and an
    ``int64`` scalar.

    The whole split is held in memory as bytes (47 MB for train) and converted per example, so
    every process of a job can hold its own copy cheaply.

    ``augment`` applies :func:`~ringtrain.data.augment.random_shift_flip` (10 % shifts, flips)
    to every example as it is read, drawing from ``generator`` (``None``: the global one).

    Raises:
        ValueError, DatasetFileError: As :func:`load_fashion_mnist`.
    """

    def __init__(
        self,
        split: Split = "train",
        data_dir: str | Path = DEFAULT_DATA_DIR,
        *,
        augment: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        images, labels = load_fashion_mnist(split, data_dir)
        self.images = images.unsqueeze(1)
        self.labels = labels.long()
        self.augment = augment
        self.generator = generator

    def __len__(self) -> int:
        return self.labels.shape[0]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[index].float().div_(255.0)
        if self.augment:
            image = random_shift_flip(image, generator=self.generator)
        return image, self.labels[index]
