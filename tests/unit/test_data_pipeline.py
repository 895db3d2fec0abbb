"""The image pipeline on tiny JPEG folders made here: sources, decoding, crops, packing, loading."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
import torch
from PIL import Image

from ringtrain.data import cli as data_cli
from ringtrain.data import jpeg
from ringtrain.data.classification import ClassificationImages
from ringtrain.data.coco import CocoDetection
from ringtrain.data.idx import DatasetFileError
from ringtrain.data.image_folder import ImageFolder
from ringtrain.data.loader import DeviceLoader
from ringtrain.data.packed import PackedImages
from ringtrain.data.sharding import ShardedSampler
from ringtrain.data.tuning import (
    LoaderSettings,
    choose_loader_settings,
    measure_decode_ms,
    training_threads,
)
from ringtrain.models.vision import load_torchvision
from tests.data.images import make_coco, make_folder, photo


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("images") / "train")


def test_image_folder_labels_agree_with_torchvision(folder):
    ours = ImageFolder(folder)
    assert len(ours) == 12 and ours.classes == ["class_0", "class_1", "class_2"]
    if load_torchvision() is not None:
        from torchvision.datasets import ImageFolder as TorchvisionFolder

        theirs = TorchvisionFolder(str(folder))
        assert [(str(p), label) for p, label in ours.samples] == theirs.samples
    data, label = ours.read(5)
    assert jpeg.is_jpeg(data) and label == 1


def test_image_folder_errors_say_what_layout_is_expected(tmp_path):
    with pytest.raises(DatasetFileError, match="not a folder"):
        ImageFolder(tmp_path / "missing")
    (tmp_path / "empty_class").mkdir()
    with pytest.raises(DatasetFileError, match="ROOT/<class>/<image>"):
        ImageFolder(tmp_path)


def test_scaled_decode_is_smaller_and_close_to_a_full_decode_resized():
    buf = io.BytesIO()
    photo(0, 400, 320).save(buf, "JPEG", quality=92)
    data = buf.getvalue()
    assert jpeg.image_size(data) == (320, 400)
    full = jpeg.decode_rgb(data)
    half = jpeg.decode_rgb(data, min_height=150, min_width=150)
    assert full.shape == (320, 400, 3) and half.shape == (160, 200, 3)
    ref = np.asarray(Image.fromarray(full).resize((200, 160), Image.Resampling.BOX))
    assert np.abs(ref.astype(int) - half.astype(int)).mean() < 4
    with pytest.raises(ValueError, match="cannot decode"):
        jpeg.decode_rgb(b"\xff\xd8 not really a jpeg")
    with pytest.raises(ValueError, match="cannot decode"):
        jpeg.decode_rgb(b"neither an image")


def test_classification_crops_are_uint8_squares(folder):
    train = ClassificationImages(ImageFolder(folder), 32, rng=random.Random(0))
    image, label = train[4]
    assert image.shape == (3, 32, 32) and image.dtype == torch.uint8 and label == 1
    evaluation = ClassificationImages(ImageFolder(folder), 32, train=False)
    assert torch.equal(evaluation[4][0], evaluation[4][0])  # the centre crop is deterministic
    assert not torch.equal(train[4][0], train[4][0])


def test_png_files_decode_through_pillow(tmp_path):
    root = make_folder(tmp_path / "png", classes=1, per_class=1, suffix=".png")
    image, _ = ClassificationImages(ImageFolder(root), 16)[0]
    assert image.shape == (3, 16, 16)


@pytest.mark.parametrize("fmt", ["raw", "jpeg"])
def test_pack_command_writes_what_packed_images_reads(folder, tmp_path, fmt, capsys):
    out = tmp_path / "packed"
    assert data_cli.main(["pack", str(folder), str(out), "--size", "40", "--format", fmt]) == 0
    assert "wrote 12 images" in capsys.readouterr().out
    packed = PackedImages(out)
    assert len(packed) == 12 and packed.classes == ImageFolder(folder).classes
    data, label = packed.read(11)
    pixels = data if fmt == "raw" else jpeg.decode_rgb(data)
    assert pixels.shape == (40, 48, 3) and label == 2  # 80x96 with its short side at 40
    expected = Image.open(ImageFolder(folder).samples[11][0]).convert("RGB").resize((48, 40))
    assert np.abs(np.asarray(expected).astype(int) - pixels.astype(int)).mean() < 12
    image, _ = ClassificationImages(packed, 32)[3]
    assert image.shape == (3, 32, 32)
    assert data_cli.main(["pack", str(folder), str(out)]) == 2  # not empty: nothing overwritten


def test_packed_images_refuses_a_folder_that_is_not_one(tmp_path):
    with pytest.raises(DatasetFileError, match="ringtrain data pack"):
        PackedImages(tmp_path)


def test_coco_boxes_become_corners_and_labels_contiguous(tmp_path):
    images, ann = make_coco(tmp_path)
    coco = CocoDetection(images, ann)
    assert coco.categories == ["person", "dog"] and len(coco) == 2
    data, target = coco.read(0)  # image id 3: the crowd box is skipped
    assert jpeg.is_jpeg(data)
    assert target["boxes"].tolist() == [[10.0, 20.0, 40.0, 60.0]]
    assert target["labels"].tolist() == [1] and int(target["image_id"]) == 3
    _, target = coco.read(1)  # image id 7: the zero-width box is skipped
    assert target["boxes"].shape == (1, 4) and target["labels"].tolist() == [0]
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(DatasetFileError, match="not a COCO annotation file"):
        CocoDetection(images, tmp_path / "bad.json")


def test_coco_items_for_torchvision_detectors_are_decoded_flipped_and_labelled_from_1(tmp_path):
    images, ann = make_coco(tmp_path)
    coco = CocoDetection(images, ann, first_label=1)
    image, target = coco[0]
    assert image.shape == (3, 80, 96) and 0 <= float(image.min()) <= float(image.max()) <= 1
    assert target["labels"].tolist() == [2] and coco.category_id(2) == 18
    assert coco.box_count(3) == 1 and coco.box_count(7) == 1
    flipped = CocoDetection(images, ann, flip=True)
    seen = {tuple(flipped[0][1]["boxes"][0].tolist()) for _ in range(40)}
    # Flipped left-right at random (top-bottom leaves this box, centred in height, in place).
    assert seen == {(10.0, 20.0, 40.0, 60.0), (56.0, 20.0, 86.0, 60.0)}
    with pytest.raises(DatasetFileError, match="ringtrain data deepforest-coco"):
        CocoDetection.split(tmp_path / "missing")


@pytest.mark.parametrize("workers", [0, 1])
def test_device_loader_gives_normalised_batches_of_this_ranks_shard(folder, workers):
    dataset = ClassificationImages(ImageFolder(folder), 24)
    sampler = ShardedSampler(dataset, 4, last_batch="drop", rank=1, num_replicas=2)
    loader = DeviceLoader(dataset, 4, sampler=sampler,
                          settings=LoaderSettings(workers, 2, "test"))
    batches = list(loader)
    assert len(batches) == len(loader) == 1
    images, labels = batches[0]
    assert images.dtype == torch.float32 and images.shape == (4, 3, 24, 24)
    assert -3 < images.mean() < 3 and labels.tolist() == [dataset.source.targets[i]
                                                          for i in sampler.indices]


def test_loader_settings_follow_cores_ranks_and_decode_cost():
    plain = choose_loader_settings(local_size=2, batch_size=32, cores=8)
    assert plain.workers == 7
    fed = choose_loader_settings(local_size=1, batch_size=32, decode_ms=2.0, step_ms=32.0,
                                 cores=16)
    assert fed.workers == 2 and "needs 2 worker" in fed.reason
    starved = choose_loader_settings(local_size=1, batch_size=256, decode_ms=4.0, step_ms=64.0,
                                     cores=5)
    assert starved.workers == 4 and starved.prefetch == 8
    one_core = choose_loader_settings(local_size=2, batch_size=8, cores=1)
    assert one_core.workers == 1
    cpu = choose_loader_settings(local_size=2, batch_size=8, cores=1, cpu_training=True)
    assert cpu.workers == 0 and "in the training process" in cpu.reason
    assert training_threads(8, 3) == 5 and training_threads(1, 1) == 1


def test_measure_decode_ms_is_positive(folder):
    assert measure_decode_ms(ClassificationImages(ImageFolder(folder), 32), samples=4) > 0
