"""Pascal VOC annotation files: one XML per image, a ``<bndbox>`` per object.

Only what detection needs is read: the image size and each object's name and corner box. VOC
coordinates are 1-based pixel indices in the original tools, but the files in circulation (the
DeepForest ones included) write 0-based corners; they are taken as given, in pixels.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from ringtrain.errors import RingtrainError


class AnnotationFileError(RingtrainError, ValueError):
    """An annotation file is missing a field or holds an impossible box."""


@dataclass(frozen=True)
class Box:
    """One object: its class name and corners ``(x1, y1, x2, y2)`` in pixels, ``x1 < x2``."""

    label: str
    x1: float
    y1: float
    x2: float
    y2: float

    @property
    def area(self) -> float:
        return (self.x2 - self.x1) * (self.y2 - self.y1)


@dataclass(frozen=True)
class VocAnnotation:
    """One annotated image: its size as the file states it and its boxes."""

    width: int
    height: int
    boxes: tuple[Box, ...]


def read_voc(path: Path) -> VocAnnotation:
    """The image size and every object's box of one Pascal VOC ``.xml`` file.

    Raises:
        AnnotationFileError: The file is not VOC XML, lacks a size or a box corner, or holds a box
            with no area or outside the image.
        OSError: The file cannot be read.
    """
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        raise AnnotationFileError(f"{path}: not an XML file ({e})") from None
    width = _number(root, "size/width", path)
    height = _number(root, "size/height", path)
    boxes = []
    for i, obj in enumerate(root.iter("object")):
        label = (obj.findtext("name") or "").strip()
        if not label:
            raise AnnotationFileError(f"{path}: object {i} has no <name>")
        x1, y1, x2, y2 = (_number(obj, f"bndbox/{k}", path)
                          for k in ("xmin", "ymin", "xmax", "ymax"))
        if not (0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height):
            raise AnnotationFileError(f"{path}: object {i} has box ({x1}, {y1}, {x2}, {y2}), "
                                      f"which is empty or outside the {width}x{height} image")
        boxes.append(Box(label, x1, y1, x2, y2))
    return VocAnnotation(int(width), int(height), tuple(boxes))


def _number(element: ET.Element, field: str, path: Path) -> float:
    text = element.findtext(field)
    try:
        return float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise AnnotationFileError(f"{path}: <{field}> is {text!r}, not a number") from None
