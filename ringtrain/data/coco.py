"""A detection data set in the COCO format: one JSON file of annotations and a folder of images.

Items are the encoded image bytes and a target: boxes as ``(x1, y1, x2, y2)`` pixels (COCO stores
``(x, y, width, height)``), labels as contiguous indices ``0..K-1`` in the order of the sorted
category ids (names in :attr:`CocoDetection.categories`), and the COCO image id. Crowd
annotations are skipped, as detection training recipes do.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ringtrain.data.idx import DatasetFileError


class CocoDetection:
    """COCO images with their boxes and labels.

    Args:
        image_dir: The folder the ``file_name`` entries are relative to.
        annotation_file: The COCO JSON file (``instances_*.json``).

    Raises:
        DatasetFileError: The JSON file is missing, not JSON, or lacks ``images``,
            ``annotations`` or ``categories``.
    """

    def __init__(self, image_dir: str | Path, annotation_file: str | Path) -> None:
        self.image_dir = Path(image_dir)
        path = Path(annotation_file)
        try:
            doc = json.loads(path.read_text())
            images, annotations, categories = (doc["images"], doc["annotations"],
                                               doc["categories"])
        except FileNotFoundError:
            raise DatasetFileError(f"{path}: no such annotation file") from None
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise DatasetFileError(f"{path}: not a COCO annotation file ({e!r}); expected JSON "
                                   "with images, annotations and categories lists") from e
        category_ids = sorted(c["id"] for c in categories)
        self._label_of = {cid: i for i, cid in enumerate(category_ids)}
        names = {c["id"]: c["name"] for c in categories}
        self.categories = [names[cid] for cid in category_ids]
        self.images = sorted(images, key=lambda im: im["id"])
        boxes: dict[int, list[list[float]]] = {im["id"]: [] for im in self.images}
        labels: dict[int, list[int]] = {im["id"]: [] for im in self.images}
        for ann in annotations:
            if ann.get("iscrowd", 0) or ann["image_id"] not in boxes:
                continue
            x, y, w, h = ann["bbox"]
            if w <= 0 or h <= 0:
                continue  # degenerate boxes make the box-regression loss undefined
            boxes[ann["image_id"]].append([x, y, x + w, y + h])
            labels[ann["image_id"]].append(self._label_of[ann["category_id"]])
        self._boxes = boxes
        self._labels = labels

    def __len__(self) -> int:
        return len(self.images)

    def read(self, index: int) -> tuple[bytes, dict[str, torch.Tensor]]:
        """The encoded image ``index`` and its target (``boxes [N, 4]`` float32, ``labels [N]``
        int64, ``image_id`` int64 scalar)."""
        image = self.images[index]
        image_id = image["id"]
        target = {
            "boxes": torch.tensor(self._boxes[image_id], dtype=torch.float32).reshape(-1, 4),
            "labels": torch.tensor(self._labels[image_id], dtype=torch.int64),
            "image_id": torch.tensor(image_id, dtype=torch.int64),
        }
        return (self.image_dir / image["file_name"]).read_bytes(), target
