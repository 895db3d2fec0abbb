"""A COCO detection set on disk (``annotations.json`` + ``images/``) as a torch ``Dataset``.

Items are what torchvision's detectors take: an image ``[3, H, W]`` in ``[0, 1]`` and a target
``{"boxes": [N, 4] (x1, y1, x2, y2), "labels": [N] from 1, "image_id": int}``. Labels are the
categories' positions in the file, counted from 1 (COCO's own ids may have gaps);
:attr:`CocoDetection.category_ids` maps them back for evaluation.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ringtrain.data.idx import DatasetFileError


class CocoDetection(Dataset):
    """One split written by ``ringtrain data deepforest-coco`` (or any COCO detection folder).

    Args:
        root: The split's folder, holding ``annotations.json`` and ``images/``.
        flip: Flip each image (and its boxes) left-right and top-bottom at random, each with
            probability 1/2 (aerial photos have no up or down).

    Raises:
        DatasetFileError: ``annotations.json`` is missing or not COCO.
    """

    def __init__(self, root: Path, flip: bool = False) -> None:
        path = Path(root) / "annotations.json"
        if not path.is_file():
            raise DatasetFileError(f"{path} does not exist: build the data set first, e.g. "
                                   f"`ringtrain data deepforest-coco {Path(root).parent}`")
        try:
            data = json.loads(path.read_text())
            categories = sorted(data["categories"], key=lambda c: c["id"])
            self.images: list[dict[str, Any]] = data["images"]
            annotations = data["annotations"]
        except (ValueError, KeyError, TypeError) as e:
            raise DatasetFileError(f"{path} is not a COCO annotation file: {e!r}") from None
        self.root = Path(root)
        self.annotation_file = path
        self.flip = flip
        self.classes = [c["name"] for c in categories]
        self.category_ids = [c["id"] for c in categories]
        label_of = {cid: i + 1 for i, cid in enumerate(self.category_ids)}
        self._boxes: dict[int, list[tuple[list[float], int]]] = {im["id"]: [] for im in self.images}
        for ann in annotations:
            x, y, w, h = ann["bbox"]
            self._boxes[ann["image_id"]].append(([x, y, x + w, y + h], label_of[ann["category_id"]]))

    def box_count(self, image_id: int) -> int:
        """How many boxes the image of that id has."""
        return len(self._boxes[image_id])

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, dict[str, Any]]:
        from PIL import Image

        record = self.images[index]
        with Image.open(self.root / "images" / record["file_name"]) as opened:
            pixels = np.asarray(opened.convert("RGB"), dtype=np.uint8)
        image = torch.from_numpy(pixels.copy()).permute(2, 0, 1).float().div_(255)
        pairs = self._boxes[record["id"]]
        boxes = torch.tensor([b for b, _ in pairs], dtype=torch.float32).reshape(-1, 4)
        labels = torch.tensor([label for _, label in pairs], dtype=torch.int64)
        if self.flip:
            height, width = image.shape[1:]
            if torch.rand(()) < 0.5:
                image = image.flip(2)
                boxes[:, [0, 2]] = width - boxes[:, [2, 0]]
            if torch.rand(()) < 0.5:
                image = image.flip(1)
                boxes[:, [1, 3]] = height - boxes[:, [3, 1]]
        return image, {"boxes": boxes, "labels": labels, "image_id": record["id"]}


def collate(batch: list[tuple[torch.Tensor, dict[str, Any]]]) -> tuple[list, list]:
    """Detection batches stay lists: images may differ in size."""
    images, targets = zip(*batch)
    return list(images), list(targets)
