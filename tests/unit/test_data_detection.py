"""Box-aware flips, resizes and crops, and detection samples that depend on (seed, epoch,
index) only."""

from __future__ import annotations

import io
import json

import pytest
import torch
from torch.utils.data import DataLoader

from ringtrain.data import box_transforms
from ringtrain.data.coco import CocoDetection, collate
from ringtrain.data.detection import DetectionImages, EpochKeys
from ringtrain.data.sharding import ShardedSampler


def _image(height: int, width: int) -> torch.Tensor:
    return torch.arange(3 * height * width, dtype=torch.int64).reshape(3, height, width).remainder(
        251).to(torch.uint8)


def test_hflip_mirrors_pixels_and_boxes():
    image = _image(6, 10)
    boxes = torch.tensor([[1.0, 2.0, 4.0, 5.0], [0.0, 0.0, 10.0, 6.0]])
    flipped, out = box_transforms.hflip(image, boxes)
    assert torch.equal(out, torch.tensor([[6.0, 2.0, 9.0, 5.0], [0.0, 0.0, 10.0, 6.0]]))
    assert torch.equal(flipped[:, :, 0], image[:, :, 9])
    # The pixels a box covers are the mirrored pixels of its original.
    assert torch.equal(flipped[:, 2:5, 6:9], image[:, 2:5, 1:4].flip(-1))


def test_resize_scales_boxes_by_the_size_ratio():
    image = _image(10, 20)
    boxes = torch.tensor([[2.0, 4.0, 6.0, 10.0]])
    resized, out = box_transforms.resize(image, boxes, 15, 40)
    assert resized.shape == (3, 15, 40) and resized.dtype == torch.uint8
    assert torch.equal(out, torch.tensor([[4.0, 6.0, 12.0, 15.0]]))
    with pytest.raises(ValueError, match="positive size"):
        box_transforms.resize(image, boxes, 0, 5)


def test_crop_shifts_clips_and_drops_boxes():
    image = _image(20, 30)
    boxes = torch.tensor([[12.0, 6.0, 16.0, 9.0],     # inside
                          [5.0, 5.0, 15.0, 8.0],      # crosses the left edge: clipped
                          [0.0, 0.0, 4.0, 4.0],       # outside: dropped
                          [10.0, 15.0, 14.0, 20.0]])  # touches the bottom edge only: dropped
    labels = torch.tensor([1, 2, 3, 4])
    out_image, out, kept = box_transforms.crop(image, boxes, labels, 5, 10, 10, 15)
    assert torch.equal(out_image, image[:, 5:15, 10:25])
    assert torch.equal(out, torch.tensor([[2.0, 1.0, 6.0, 4.0], [0.0, 0.0, 5.0, 3.0]]))
    assert torch.equal(kept, torch.tensor([1, 2]))
    # min_visible: the clipped box keeps 5/10 of its width, below 0.6.
    _, out, kept = box_transforms.crop(image, boxes, labels, 5, 10, 10, 15, min_visible=0.6)
    assert torch.equal(kept, torch.tensor([1]))
    with pytest.raises(ValueError, match="not inside"):
        box_transforms.crop(image, boxes, labels, 15, 0, 10, 10)


def _coco(tmp_path, count: int = 6) -> CocoDetection:
    from PIL import Image

    (tmp_path / "images").mkdir()
    images, annotations = [], []
    for i in range(count):
        buf = io.BytesIO()
        Image.fromarray(_image(48, 64).permute(1, 2, 0).numpy()).save(buf, format="JPEG")
        (tmp_path / "images" / f"{i}.jpg").write_bytes(buf.getvalue())
        images.append({"id": i + 1, "file_name": f"{i}.jpg", "width": 64, "height": 48})
        annotations += [{"id": 2 * i + k + 1, "image_id": i + 1, "category_id": 1,
                         "bbox": [4 + 10 * k, 6, 20, 16], "iscrowd": 0} for k in range(2)]
    (tmp_path / "ann.json").write_text(json.dumps({
        "images": images, "annotations": annotations, "categories": [{"id": 1, "name": "x"}]}))
    return CocoDetection(tmp_path / "images", tmp_path / "ann.json")


def _epoch(dataset: DetectionImages, epoch: int, workers: int) -> list:
    sampler = ShardedSampler(dataset, 2, rank=0, num_replicas=1, seed=3)
    sampler.set_epoch(epoch)
    loader = DataLoader(dataset, batch_size=2, sampler=EpochKeys(sampler), collate_fn=collate,
                        num_workers=workers)
    return [(image, target) for images, targets in loader for image, target in
            zip(images, targets)]


def test_samples_depend_on_seed_epoch_and_index_only(tmp_path):
    dataset = DetectionImages(_coco(tmp_path), scale=(0.5, 1.5), crop=(40, 40))
    first = _epoch(dataset, 1, workers=0)
    again = _epoch(dataset, 1, workers=2)
    assert len(first) == 6
    for (a, ta), (b, tb) in zip(first, again):
        assert torch.equal(a, b) and torch.equal(ta["boxes"], tb["boxes"])
        assert a.shape[1] <= 40 and a.shape[2] <= 40
    other = _epoch(dataset, 2, workers=0)
    assert any(a.shape != b.shape or not torch.equal(a, b) for (a, _), (b, _) in
               zip(sorted(first, key=lambda x: int(x[1]["image_id"])),
                   sorted(other, key=lambda x: int(x[1]["image_id"]))))
    assert torch.equal(dataset[(1, 0)][0], dataset[(1, 0)][0])


def test_bad_augmentation_settings_are_refused(tmp_path):
    source = _coco(tmp_path, 1)
    for kwargs in ({"scale": (0.0, 1.0)}, {"crop": (0, 5)}, {"flip": 2.0}):
        with pytest.raises(ValueError):
            DetectionImages(source, **kwargs)
