"""Building a COCO detection annotation file (``annotations.json``) one image at a time.

The format is the one pycocotools reads: ``images`` (id, file_name, width, height),
``annotations`` (id, image_id, category_id, bbox as ``[x, y, width, height]``, area, iscrowd) and
``categories`` (id, name), ids from 1 as in COCO itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ringtrain.data.voc import Box


class CocoBuilder:
    """Collects images and their boxes; :meth:`write` saves the JSON. The ``categories`` get
    the ids 1, 2, ... in their order."""

    def __init__(self, categories: list[str]) -> None:
        self.categories = list(categories)
        self._category_ids = {name: i + 1 for i, name in enumerate(self.categories)}
        self.images: list[dict[str, Any]] = []
        self.annotations: list[dict[str, Any]] = []

    def add_image(self, file_name: str, width: int, height: int, boxes: list[Box],
                  **extra: Any) -> int:
        """Add one image (its path relative to the images folder, its size in pixels) and its
        boxes, corners in its own pixels; returns its id. ``extra`` adds fields to the image
        record (COCO readers ignore unknown fields).

        Raises:
            ValueError: A box's label is not a category.
        """
        image_id = len(self.images) + 1
        self.images.append({"id": image_id, "file_name": file_name, "width": width,
                            "height": height, **extra})
        for box in boxes:
            if box.label not in self._category_ids:
                raise ValueError(f"label {box.label!r} is not one of the categories "
                                 f"{self.categories}")
            w, h = box.x2 - box.x1, box.y2 - box.y1
            self.annotations.append({
                "id": len(self.annotations) + 1, "image_id": image_id,
                "category_id": self._category_ids[box.label],
                "bbox": [round(box.x1, 2), round(box.y1, 2), round(w, 2), round(h, 2)],
                "area": round(w * h, 2), "iscrowd": 0,
            })
        return image_id

    def to_dict(self) -> dict[str, Any]:
        """The whole annotation file as a dictionary."""
        return {"info": {"description": "built by ringtrain data"},
                "images": self.images, "annotations": self.annotations,
                "categories": [{"id": i + 1, "name": n, "supercategory": "object"}
                               for i, n in enumerate(self.categories)]}

    def write(self, path: Path) -> None:
        """Write the annotation file (JSON) to ``path``."""
        path.write_text(json.dumps(self.to_dict()))
