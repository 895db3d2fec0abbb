"""An image classification data set read from a folder tree in ImageNet's layout.

``ROOT/<class>/<image>``: one folder per class, sorted by name to give the labels (the order
``torchvision.datasets.ImageFolder`` uses, so labels agree with it). Items are the encoded bytes
and the label: decoding is a separate stage (:mod:`ringtrain.data.jpeg`) so that it can run in
loader workers on the CPU or batched on the GPU.
"""

from __future__ import annotations

from pathlib import Path

from ringtrain.data.idx import DatasetFileError

#: File suffixes read as images (lower case); everything else in the tree is ignored.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


class ImageFolder:
    """The images of ``root`` (one sub-folder per class) as ``(bytes, label)`` items.

    Raises:
        DatasetFileError: ``root`` is not a folder, or holds no class folder with images.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise DatasetFileError(f"{self.root}: not a folder; pass the folder that holds one "
                                   "sub-folder of images per class (e.g. imagenet/train)")
        self.classes = sorted(d.name for d in self.root.iterdir() if d.is_dir())
        self.samples: list[tuple[Path, int]] = [
            (path, label)
            for label, name in enumerate(self.classes)
            for path in sorted((self.root / name).rglob("*"))
            if path.suffix.lower() in IMAGE_SUFFIXES
        ]
        if not self.samples:
            raise DatasetFileError(
                f"{self.root}: no images ({', '.join(IMAGE_SUFFIXES)}) in class sub-folders; "
                "expected ROOT/<class>/<image> as in ImageNet's train/ and val/ folders")
        self.targets = [label for _, label in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def read(self, index: int) -> tuple[bytes, int]:
        """The encoded image file ``index`` and its label."""
        path, label = self.samples[index]
        return path.read_bytes(), label
