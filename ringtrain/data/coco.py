"""A detection data set in the COCO format: one JSON file of annotations and a folder of images.

One reader for the input pipeline and the detection example. Boxes come as ``(x1, y1, x2, y2)``
pixels (COCO stores ``(x, y, width, height)``); labels are the categories' positions in the order
of their sorted ids, counted from ``first_label`` (0 for the pipeline, 1 for torchvision's
detectors, whose label 0 is the background), since COCO's own ids may have gaps:
:meth:`CocoDetection.category_id` maps a label back for evaluation. Crowd annotations and boxes
without area are skipped, as detection training recipes do (a zero-width box makes the
box-regression loss undefined).

Items come two ways: :meth:`CocoDetection.read` gives the encoded image bytes (the pipeline
decodes them where it likes), ``dataset[i]`` a decoded image ``[3, H, W]`` in ``[0, 1]``, flipped
at random when asked (what torchvision's detectors take).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ringtrain.data.idx import DatasetFileError

#: The layout of one split written by ``ringtrain data deepforest-coco``.
SPLIT_ANNOTATIONS = "annotations.json"
SPLIT_IMAGES = "images"


class CocoDetection(Dataset):
    """COCO images (``file_name`` relative to ``image_dir``) with their boxes and labels from
    ``annotation_file`` (``instances_*.json``). With ``flip``, ``dataset[i]`` flips each image
    and its boxes left-right and top-bottom at random, each with probability 1/2 (aerial photos
    have no up or down).

    ``images`` holds the image records by id (a trainer may filter it); ``categories`` and
    ``category_ids`` the names and COCO ids by label.

    Raises:
        DatasetFileError: The JSON file is missing, not JSON, or lacks ``images``,
            ``annotations`` or ``categories``.
    """

    def __init__(self, image_dir: str | Path, annotation_file: str | Path, *, flip: bool = False,
                 first_label: int = 0) -> None:
        self.image_dir = Path(image_dir)
        self.annotation_file = Path(annotation_file)
        self.flip = flip
        self.first_label = first_label
        path = self.annotation_file
        try:
            doc = json.loads(path.read_text())
            images, annotations, categories = (doc["images"], doc["annotations"],
                                               doc["categories"])
            names = {c["id"]: c["name"] for c in categories}
        except FileNotFoundError:
            raise DatasetFileError(f"{path}: no such annotation file") from None
        except (ValueError, KeyError, TypeError) as e:
            raise DatasetFileError(f"{path}: not a COCO annotation file ({e!r}); expected JSON "
                                   "with images, annotations and categories lists") from None
        self.category_ids = sorted(names)
        self.categories = [names[cid] for cid in self.category_ids]
        label_of = {cid: first_label + i for i, cid in enumerate(self.category_ids)}
        self.images: list[dict[str, Any]] = sorted(images, key=lambda im: im["id"])
        self._boxes: dict[int, list[tuple[list[float], int]]] = {im["id"]: [] for im in self.images}
        for ann in annotations:
            if ann.get("iscrowd", 0) or ann["image_id"] not in self._boxes:
                continue
            x, y, w, h = ann["bbox"]
            if w <= 0 or h <= 0:
                continue
            self._boxes[ann["image_id"]].append(([x, y, x + w, y + h],
                                                 label_of[ann["category_id"]]))

    @classmethod
    def split(cls, root: str | Path, *, flip: bool = False,
              first_label: int = 0) -> CocoDetection:
        """One split of a data set that ``ringtrain data deepforest-coco`` wrote:
        ``root/annotations.json`` and ``root/images/`` (other arguments as the class).

        Raises:
            DatasetFileError: The split is not there (the message says how to build it), or its
                annotations are not COCO.
        """
        root = Path(root)
        if not (root / SPLIT_ANNOTATIONS).is_file():
            raise DatasetFileError(f"{root / SPLIT_ANNOTATIONS} does not exist: build the data set "
                                   f"first, e.g. `ringtrain data deepforest-coco {root.parent}`")
        return cls(root / SPLIT_IMAGES, root / SPLIT_ANNOTATIONS, flip=flip,
                   first_label=first_label)

    def __len__(self) -> int:
        return len(self.images)

    def box_count(self, image_id: int) -> int:
        """How many boxes the image of that id has."""
        return len(self._boxes[image_id])

    def category_id(self, label: int) -> int:
        """The COCO category id of a label."""
        return self.category_ids[label - self.first_label]

    def read(self, index: int) -> tuple[bytes, dict[str, Any]]:
        """The encoded image ``index`` and its target (see :meth:`target`)."""
        record = self.images[index]
        return (self.image_dir / record["file_name"]).read_bytes(), self.target(index)

    def target(self, index: int) -> dict[str, Any]:
        """``boxes [N, 4]`` float32, ``labels [N]`` int64 and the COCO ``image_id`` (an int)."""
        image_id = self.images[index]["id"]
        pairs = self._boxes[image_id]
        return {"boxes": torch.tensor([b for b, _ in pairs], dtype=torch.float32).reshape(-1, 4),
                "labels": torch.tensor([label for _, label in pairs], dtype=torch.int64),
                "image_id": image_id}

    def __getitem__(self, index: int) -> tuple[torch.Tensor, dict[str, Any]]:
        from PIL import Image

        with Image.open(self.image_dir / self.images[index]["file_name"]) as opened:
            pixels = np.asarray(opened.convert("RGB"), dtype=np.uint8)
        image = torch.from_numpy(pixels.copy()).permute(2, 0, 1).float().div_(255)
        target = self.target(index)
        if self.flip:
            boxes = target["boxes"]
            height, width = image.shape[1:]
            if torch.rand(()) < 0.5:
                image = image.flip(2)
                boxes[:, [0, 2]] = width - boxes[:, [2, 0]]
            if torch.rand(()) < 0.5:
                image = image.flip(1)
                boxes[:, [1, 3]] = height - boxes[:, [3, 1]]
        return image, target


def collate(batch: list[tuple[torch.Tensor, dict[str, Any]]]) -> tuple[list, list]:
    """Detection batches stay lists: images may differ in size."""
    images, targets = zip(*batch)
    return list(images), list(targets)
