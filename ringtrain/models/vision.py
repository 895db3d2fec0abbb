"""torchvision as an optional extra, made importable on CPU-only PyTorch.

ringtrain does not depend on torchvision: its own :mod:`ringtrain.models.resnet` gives the ResNets
the examples and benchmarks need. When torchvision is installed, :func:`load_torchvision` imports
it and :func:`vision_model` prefers its builders (they cover every classic architecture).

Why importing needs help: torchvision's PyPI wheel ships compiled operators built against CUDA
PyTorch; next to the CPU build they fail to load, and torchvision then dies registering fake
kernels (``operator torchvision::nms does not exist``). Where the compiled library cannot load,
:func:`load_torchvision` defines ``torchvision::nms`` and ``qnms`` with the pure-PyTorch
:func:`nms` (other compiled operators still refuse with torchvision's own message), and points
the ``torchvision.ops.nms`` wrapper its detectors call at it.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import logging
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from ringtrain.models import resnet

log = logging.getLogger(__name__)

# Schemas exactly as torchvision's C++ library declares them, so its Python code and its fake
# kernels see the same operators whichever defined them.
_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}

# The fallback's registration lives as long as this object; dropping it would unregister the
# operators, so it is kept for the life of the process once made.
_fallback_library: torch.library.Library | None = None


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Non-maximum suppression with torchvision's semantics, in plain PyTorch.

    Boxes are visited in decreasing score order (ties in input order); each box kept removes the
    later boxes whose IoU with it is greater than ``iou_threshold``. As in torchvision's kernel,
    a box of zero area has an undefined IoU and so removes nothing and is never removed.

    Args:
        boxes: ``[N, 4]`` boxes as ``(x1, y1, x2, y2)``, floating point.
        scores: ``[N]`` scores.

    Returns:
        ``int64`` indices of the kept boxes, in decreasing score order, on ``boxes``'s device.

    Raises:
        ValueError: The shapes are not ``[N, 4]`` and ``[N]``.
    """
    if boxes.dim() != 2 or boxes.shape[1] != 4 or scores.shape != boxes.shape[:1]:
        raise ValueError(
            f"expected boxes [N, 4] and scores [N], got {tuple(boxes.shape)} and "
            f"{tuple(scores.shape)}"
        )
    x1, y1, x2, y2 = boxes.unbind(1)
    areas = (x2 - x1) * (y2 - y1)
    order = scores.argsort(descending=True, stable=True)
    keep = []
    # One pass per kept box over the survivors: O(kept * N) time and O(N) memory, where an
    # all-pairs IoU matrix would need O(N^2) memory.
    while order.numel() > 0:
        i, rest = order[0], order[1:]
        keep.append(i)
        w = (torch.minimum(x2[i], x2[rest]) - torch.maximum(x1[i], x1[rest])).clamp(min=0)
        h = (torch.minimum(y2[i], y2[rest]) - torch.maximum(y1[i], y1[rest])).clamp(min=0)
        inter = w * h
        iou = inter / (areas[i] + areas[rest] - inter)
        # `~(iou > t)`, not `iou <= t`: a NaN IoU (zero-area boxes) must keep the box.
        order = rest[~(iou > iou_threshold)]
    if not keep:
        return torch.empty(0, dtype=torch.int64, device=boxes.device)
    return torch.stack(keep)


def _qnms(dets: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    # torchvision passes the integer representation of quantized tensors. One scale and zero
    # point shift and scale every coordinate alike, which changes no IoU and no score order.
    if dets.is_quantized:
        dets, scores = dets.dequantize(), scores.dequantize()
    return nms(dets.double(), scores.double(), iou_threshold)


def _torchvision_has(op: str) -> bool:
    return hasattr(torch.ops.torchvision, op)


def register_nms_fallback() -> bool:
    """Define ``torchvision::nms`` and ``torchvision::qnms`` with :func:`nms`, where missing.

    Call it only after the compiled torchvision library has had its chance to load (as
    :func:`load_torchvision` does): that library defines the same operators and cannot load
    after them.

    Returns:
        Whether anything was defined (``False`` when both operators already exist).
    """
    global _fallback_library
    missing = [op for op in _SCHEMAS if not _torchvision_has(op)]
    if not missing:
        return False
    if _fallback_library is None:
        _fallback_library = torch.library.Library("torchvision", "FRAGMENT")
    impls = {"nms": nms, "qnms": _qnms}
    for op in missing:
        _fallback_library.define(_SCHEMAS[op])
        # CompositeExplicitAutograd: one kernel for every device, as it uses only torch ops.
        _fallback_library.impl(op, impls[op], "CompositeExplicitAutograd")
    log.debug("registered pure-PyTorch fallbacks for torchvision::%s", ", ".join(missing))
    return True


def _load_compiled_torchvision_ops(package_dir: Path) -> bool:
    """Load torchvision's compiled operator library without importing torchvision."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = package_dir / f"_C{suffix}"
        if path.exists():
            try:
                torch.ops.load_library(str(path))
                return True
            # A build for another torch fails in dlopen (a missing CUDA library, an undefined
            # symbol) before any of its operators is registered, so nothing is left half-made.
            except (OSError, ImportError, RuntimeError) as e:
                # Handled (the fallback below): worth a line for a developer, not for a user.
                log.debug("torchvision's compiled operators do not load here: %s", e)
                return False
    return False


def load_torchvision() -> ModuleType | None:
    """Import torchvision if it is installed, with the :func:`nms` fallback where needed.

    Returns:
        The ``torchvision`` module, or ``None`` when it is not installed.

    Raises:
        ImportError: torchvision is installed but fails to import for another reason.
    """
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return None
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    if not _torchvision_has("nms") and not _load_compiled_torchvision_ops(package_dir):
        register_nms_fallback()
    torchvision = importlib.import_module("torchvision")
    if _fallback_library is not None:
        _route_nms_wrapper(torchvision)
    return torchvision


def _call_nms_op(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """``torchvision.ops.nms`` without its check for the compiled library."""
    return torch.ops.torchvision.nms(boxes, scores, iou_threshold)


def _route_nms_wrapper(torchvision: ModuleType) -> None:
    """Point ``torchvision.ops.nms`` (and the module global ``batched_nms`` looks it up in) at
    the registered operator: the wrapper asserts the compiled library before calling it, so the
    detectors' post-processing would refuse although the operator exists."""
    try:
        # Any: the module gets an attribute assigned, which ModuleType's stub does not allow
        boxes: Any = importlib.import_module("torchvision.ops.boxes")
    except ModuleNotFoundError:
        return  # a torchvision without ops (a stripped or stub build): nothing to route
    boxes.nms = _call_nms_op
    torchvision.ops.nms = _call_nms_op


def vision_model(name: str, **kwargs: object) -> nn.Module:
    """Build an image classifier by torchvision's name for it (``"resnet50"``), randomly
    initialised, with ``kwargs`` passed to the builder (``num_classes``, ...).

    torchvision's builder is used when torchvision imports (any of its classification models);
    otherwise ringtrain's own (``resnet18`` to ``resnet152``, with the same ``state_dict`` keys).

    Raises:
        ValueError: Neither torchvision nor ringtrain has a model of that name.
    """
    torchvision = load_torchvision()
    if torchvision is not None and name in torchvision.models.list_models(torchvision.models):
        return torchvision.models.get_model(name, weights=None, **kwargs)
    if name in resnet.BUILDERS:
        return resnet.BUILDERS[name](**kwargs)
    hint = "" if torchvision is not None else "; install torchvision for more"
    raise ValueError(f"unknown model {name!r}: choose from {sorted(resnet.BUILDERS)}{hint}")
