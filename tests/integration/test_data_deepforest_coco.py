"""`ringtrain data deepforest-coco` on the real photos and boxes of the deepforest wheel."""

from __future__ import annotations

import importlib.util
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ringtrain.data.cli import main as data_main
from ringtrain.data.commands.deepforest_coco import (
    annotated_photos,
    deepforest_data_dir,
)
from ringtrain.data.voc import read_voc

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("deepforest") is None or importlib.util.find_spec("PIL") is None,
    reason="needs the deepforest wheel (pip install --no-deps deepforest==2.1.0) and Pillow",
)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("coco") / "trees"
    assert data_main(["deepforest-coco", str(out), "--format", "jpeg"]) == 0
    return out


def test_only_the_photos_with_boxes_are_used() -> None:
    names = [p.stem for p in annotated_photos(deepforest_data_dir())]
    assert "OSBS_029" in names and "SOAP_061" in names
    assert "SOAP_031" not in names  # a PNG with no XML


def test_splits_are_valid_coco_split_by_photo(built: Path) -> None:
    from pycocotools.coco import COCO

    sources = {}
    for split in ("train", "val"):
        data = json.loads((built / split / "annotations.json").read_text())
        coco = COCO(str(built / split / "annotations.json"))  # pycocotools accepts it
        assert len(coco.getImgIds()) == len(data["images"]) > 0
        assert [c["name"] for c in data["categories"]] == ["Tree"]
        sources[split] = {img["source"] for img in data["images"]}
        by_id = {img["id"]: img for img in data["images"]}
        for img in data["images"]:
            assert (built / split / "images" / img["file_name"]).is_file()
        for ann in data["annotations"]:
            x, y, w, h = ann["bbox"]
            img = by_id[ann["image_id"]]
            assert w > 0 and h > 0 and x >= 0 and y >= 0
            assert x + w <= img["width"] and y + h <= img["height"]
            assert ann["area"] == pytest.approx(w * h, abs=0.1) and ann["iscrowd"] == 0
    assert sources["val"] == {"2019_YELL_2_541000_4977000_image_crop.png"}
    assert not sources["train"] & sources["val"]


def test_every_tree_of_the_photo_is_kept_in_some_tile(built: Path) -> None:
    # OSBS_029 is 400x400: one tile, which must hold every one of its boxes unchanged.
    xml = read_voc(deepforest_data_dir() / "OSBS_029.xml")
    data = json.loads((built / "train" / "annotations.json").read_text())
    (image,) = [i for i in data["images"] if i["source"] == "OSBS_029.png"]
    boxes = sorted(a["bbox"] for a in data["annotations"] if a["image_id"] == image["id"])
    assert boxes == sorted([b.x1, b.y1, b.x2 - b.x1, b.y2 - b.y1] for b in xml.boxes)


def test_keep_labels_and_tiles_of_a_chosen_size(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for name in ("SOAP_061.png", "SOAP_061.xml", "OSBS_029.png", "OSBS_029.xml"):
        shutil.copy(deepforest_data_dir() / name, source / name)
    out = tmp_path / "out"
    assert data_main(["deepforest-coco", str(out), "--source", str(source), "--tile", "200",
                      "--overlap", "0", "--labels", "keep", "--val", "SOAP_061"]) == 0
    val = json.loads((out / "val" / "annotations.json").read_text())
    assert [c["name"] for c in val["categories"]] == ["Alive", "Dead", "Tree"]
    assert {(i["width"], i["height"]) for i in val["images"]} == {(200, 200)}
    assert len(val["images"]) == 4 and len(list((out / "val" / "images").glob("*.png"))) == 4


def test_bad_input_is_exit_2_with_a_message(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "ringtrain.data.cli", "deepforest-coco"]
    r = subprocess.run([*cmd, str(tmp_path / "o"), "--val", "nope"], capture_output=True,
                       text=True, timeout=60, check=False)
    assert r.returncode == 2 and "--val nope: no such annotated photo" in r.stderr
    r = subprocess.run([*cmd, str(tmp_path / "o2"), "--tile", "100", "--overlap", "100"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and "--overlap (100) must be smaller than --tile" in r.stderr


def _expected(boxes: list[list[float]], height: int, width: int, draws: random.Random,
              scale: tuple[float, float], crop: int, flip: float) -> tuple[list, int, int]:
    """The boxes the augmentation must give, computed here in plain Python from the same
    draws: resize by the factor, crop (shift, clip, drop empty), flip."""
    factor = draws.uniform(*scale)
    h, w = max(1, round(height * factor)), max(1, round(width * factor))
    fx, fy = w / width, h / height
    scaled = [[b[0] * fx, b[1] * fy, b[2] * fx, b[3] * fy] for b in boxes]
    ch, cw = min(crop, h), min(crop, w)
    top, left = draws.randint(0, h - ch), draws.randint(0, w - cw)
    out = []
    for x1, y1, x2, y2 in scaled:
        c = [min(max(x1 - left, 0), cw), min(max(y1 - top, 0), ch),
             min(max(x2 - left, 0), cw), min(max(y2 - top, 0), ch)]
        if (c[2] - c[0]) * (c[3] - c[1]) > 0:
            out.append(c)
    if draws.random() < flip:
        out = [[cw - x2, y1, cw - x1, y2] for x1, y1, x2, y2 in out]
    return out, ch, cw


def test_augmentation_moves_the_real_boxes_exactly(built: Path) -> None:
    import torch

    from ringtrain.data.coco import CocoDetection
    from ringtrain.data.detection import DetectionImages

    source = CocoDetection(built / "train" / "images", built / "train" / "annotations.json")
    scale, crop = (0.6, 1.4), 256
    dataset = DetectionImages(source, scale=scale, crop=(crop, crop), seed=7)
    unflipped = DetectionImages(source, scale=scale, crop=(crop, crop), flip=0.0, seed=7)
    checked = dropped = flipped = samples = 0
    for index in range(0, len(source), max(1, len(source) // 40)):
        _, target = source.read(index)
        record = source.images[index]
        for epoch in (0, 1):
            image, out = dataset[(epoch, index)]
            boxes, ch, cw = _expected(target["boxes"].tolist(), record["height"],
                                      record["width"], dataset.rng(epoch, index), scale, crop, 0.5)
            assert image.shape == (3, ch, cw) and image.dtype == torch.uint8
            assert torch.allclose(out["boxes"], torch.tensor(boxes).reshape(-1, 4), atol=1e-4)
            assert len(out["labels"]) == len(out["boxes"])
            assert out["image_id"] == target["image_id"]
            checked += len(boxes)
            samples += 1
            dropped += len(target["boxes"]) - len(boxes)
            plain, _ = unflipped[(epoch, index)]  # the same draws, never flipped
            if not torch.equal(plain, image):
                assert torch.equal(plain.flip(-1), image)
                flipped += 1
    # Real photos: many boxes checked, crops dropped some, both flip outcomes happened.
    assert checked > 200 and dropped > 0 and 0 < flipped < samples
