"""Tiny image data sets made by the tests: JPEG folder trees, COCO files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image


def photo(seed: int, width: int = 96, height: int = 80) -> Image.Image:
    """A smooth random colour picture (gradients plus noise), JPEG-friendly like a photo."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = rng.uniform(0, 255, 3)
    slope = rng.uniform(-1.5, 1.5, (3, 2))
    channels = [base[c] + slope[c, 0] * x + slope[c, 1] * y for c in range(3)]
    pixels = np.stack(channels, -1) + rng.normal(0, 8, (height, width, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def make_folder(root: Path, classes: int = 3, per_class: int = 4, *, width: int = 96,
                height: int = 80, suffix: str = ".jpg") -> Path:
    """``root/class_<k>/<i>.jpg``: ``classes * per_class`` pictures."""
    for k in range(classes):
        (root / f"class_{k}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            photo(k * 1000 + i, width, height).save(root / f"class_{k}" / f"{i:03d}{suffix}",
                                                    quality=90)
    return root


def make_coco(root: Path) -> tuple[Path, Path]:
    """Two images with boxes (one crowd, one degenerate) in a COCO JSON file."""
    images = root / "images"
    images.mkdir(parents=True)
    photo(1).save(images / "a.jpg")
    photo(2).save(images / "b.jpg")
    doc = {
        "images": [{"id": 7, "file_name": "b.jpg", "width": 96, "height": 80},
                   {"id": 3, "file_name": "a.jpg", "width": 96, "height": 80}],
        "categories": [{"id": 18, "name": "dog"}, {"id": 1, "name": "person"}],
        "annotations": [
            {"id": 1, "image_id": 3, "category_id": 18, "bbox": [10, 20, 30, 40], "iscrowd": 0},
            {"id": 2, "image_id": 3, "category_id": 1, "bbox": [0, 0, 5, 5], "iscrowd": 1},
            {"id": 3, "image_id": 7, "category_id": 1, "bbox": [1, 2, 3, 4]},
            {"id": 4, "image_id": 7, "category_id": 1, "bbox": [1, 2, 0, 4]},
        ],
    }
    ann = root / "instances.json"
    ann.write_text(json.dumps(doc))
    return images, ann
