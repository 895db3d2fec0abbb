"""The optional torchvision path: the pure-PyTorch nms, its registration, and model building."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from ringtrain.models import resnet, vision


def _reference_nms(boxes: list[list[float]], scores: list[float], threshold: float) -> list[int]:
    """Greedy NMS written from its definition, one pair at a time, in plain Python."""

    def iou(a: list[float], b: list[float]) -> float:
        w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
        h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
        inter = w * h
        union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
        return inter / union if union > 0 else float("nan")

    order = sorted(range(len(scores)), key=lambda i: -scores[i])  # stable: ties in input order
    removed: set[int] = set()
    keep = []
    for pos, i in enumerate(order):
        if i in removed:
            continue
        keep.append(i)
        removed.update(j for j in order[pos + 1 :] if iou(boxes[i], boxes[j]) > threshold)
    return keep


def _random_boxes(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g, dtype=torch.float64) * 100
    wh = torch.rand(n, 2, generator=g, dtype=torch.float64) * 40 + 1
    # Rounded scores make ties, which must be broken by input order.
    scores = (torch.rand(n, generator=g, dtype=torch.float64) * 20).round() / 20
    return torch.cat([xy, xy + wh], dim=1), scores


@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.5, 0.9])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nms_matches_the_reference(seed: int, threshold: float) -> None:
    boxes, scores = _random_boxes(120, seed)
    kept = vision.nms(boxes, scores, threshold)
    assert kept.dtype == torch.int64
    assert kept.tolist() == _reference_nms(boxes.tolist(), scores.tolist(), threshold)


def test_nms_edge_cases() -> None:
    empty = vision.nms(torch.zeros(0, 4), torch.zeros(0), 0.5)
    assert empty.dtype == torch.int64 and empty.numel() == 0
    same = torch.tensor([[0.0, 0, 10, 10]] * 3)
    assert vision.nms(same, torch.tensor([0.1, 0.9, 0.5]), 0.5).tolist() == [1]
    # A zero-area box has no defined IoU: it neither removes nor is removed.
    degenerate = torch.tensor([[0.0, 0, 10, 10], [5.0, 5, 5, 5], [1.0, 1, 10, 10]])
    assert vision.nms(degenerate, torch.tensor([0.9, 0.8, 0.7]), 0.5).tolist() == [0, 1]
    with pytest.raises(ValueError, match=r"\[N, 4\]"):
        vision.nms(torch.zeros(3, 5), torch.zeros(3), 0.5)


def test_registered_operator_agrees_with_the_reference() -> None:
    # Defines torchvision::nms/qnms here unless a real torchvision already did; either way the
    # operator must give the reference answer.
    vision.register_nms_fallback()
    assert vision.register_nms_fallback() is False  # idempotent
    boxes, scores = _random_boxes(60, 5)
    expected = _reference_nms(boxes.tolist(), scores.tolist(), 0.4)
    assert torch.ops.torchvision.nms(boxes, scores, 0.4).tolist() == expected
    ints = (boxes * 10).round().to(torch.int32)
    assert torch.ops.torchvision.qnms(ints, (scores * 100).to(torch.int32), 0.4).tolist() == (
        _reference_nms(ints.tolist(), (scores * 100).to(torch.int32).tolist(), 0.4)
    )


_FAKE_TORCHVISION = """
import torch

# What torchvision 0.28 does at import: a fake kernel for an operator its compiled library
# should have defined. Without the operator this raises "operator torchvision::nms does not exist".
@torch.library.register_fake("torchvision::nms")
def meta_nms(dets, scores, iou_threshold):
    return dets.new_empty(0, dtype=torch.long)

@torch.library.register_fake("torchvision::qnms")
def meta_qnms(dets, scores, iou_threshold):
    return dets.new_empty(0, dtype=torch.long)
"""


def test_load_torchvision_makes_a_broken_build_importable(tmp_path: Path) -> None:
    package = tmp_path / "torchvision"
    package.mkdir()
    (package / "__init__.py").write_text(_FAKE_TORCHVISION)
    # A compiled library built for another torch: loading it fails, so the fallback is used.
    (package / "_C.so").write_bytes(b"not an ELF file")
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import torch
        from ringtrain.models import vision
        try:
            import torchvision
            raise SystemExit("the fake torchvision imported without help")
        except RuntimeError as e:
            assert "torchvision::nms does not exist" in str(e), e
        sys.modules.pop("torchvision", None)
        tv = vision.load_torchvision()
        assert tv is not None and tv.__file__.startswith({str(tmp_path)!r})
        boxes = torch.tensor([[0.0, 0, 10, 10], [1.0, 1, 10, 10], [20.0, 20, 30, 30]])
        print(torch.ops.torchvision.nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5).tolist())
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[0, 2]"


def test_a_library_that_does_not_load_is_said_once_at_debug_never_at_info(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """In-process twin of tests/integration/test_vision_quiet.py (a fresh interpreter, ~10 s
    on a loaded machine): the failure is a debug line, and a second load tries nothing."""
    (tmp_path / "_C.so").write_bytes(b"not an ELF file")
    with caplog.at_level(logging.DEBUG, logger=vision.__name__):
        assert not vision._load_compiled_torchvision_ops(tmp_path)
    said = [r for r in caplog.records if "compiled operators do not load" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.DEBUG]
    if vision.load_torchvision() is None:
        return  # no torchvision: nothing is loaded twice
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=vision.__name__):
        vision.load_torchvision()  # nms exists now (compiled or the fallback): nothing to say
    assert not caplog.records


@pytest.mark.skipif(vision.load_torchvision() is not None, reason="torchvision is installed")
def test_without_torchvision_ringtrain_builds_its_own() -> None:
    assert vision.load_torchvision() is None
    model = vision.vision_model("resnet50", num_classes=10)
    assert isinstance(model, resnet.ResNet) and model.fc.out_features == 10
    assert isinstance(vision.vision_model("resnet18"), resnet.ResNet)
    with pytest.raises(ValueError, match="install torchvision"):
        vision.vision_model("vgg16")
