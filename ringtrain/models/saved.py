"""A trained model on disk: ``model.pt`` (a ``state_dict``) and ``model.json`` (how to rebuild it).

The weights load with ``torch.load(weights_only=True)``, which runs no code from the file; the
JSON names the architecture (a key of :data:`ARCHITECTURES`), the arguments of its builder, the
task and class names, and how an image becomes the model's input. Training scripts write both on
rank 0 with :func:`save_model`; ``ringtrain serve`` reads them with :func:`load_model`.

A Keras 3 classifier is ``model.keras`` (Keras' own file: architecture and weights) with the
same ``model.json`` beside it, ``arch: keras`` (see :mod:`ringtrain.models.keras_model`); a
``.keras`` file alone is served too, with classes named by their index.
"""

from __future__ import annotations

import json
import pickle
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from ringtrain.errors import RingtrainError

WEIGHTS_FILE = "model.pt"
KERAS_FILE = "model.keras"
METADATA_FILE = "model.json"
#: ``ModelInfo.arch`` of a Keras model: built from its own file, not from ARCHITECTURES.
KERAS_ARCH = "keras"


class SavedModelError(RingtrainError, ValueError):
    """A saved model is missing a file, names an unknown architecture, or its weights do not fit."""


def _retinanet(**kwargs: Any) -> nn.Module:
    from ringtrain.models.detection import retinanet_mobilenet_v2

    return retinanet_mobilenet_v2(**kwargs)


def _cifar_cnn(**kwargs: Any) -> nn.Module:
    from ringtrain.models.cifar_cnn import CifarCNN

    return CifarCNN(**kwargs)


def _fashion_cnn(**kwargs: Any) -> nn.Module:
    from ringtrain.models.fashion_cnn import FashionCNN

    return FashionCNN(**kwargs)


def _vision(**kwargs: Any) -> nn.Module:
    from ringtrain.models.vision import vision_model

    return vision_model(**kwargs)


#: Architecture name -> builder taking :attr:`ModelInfo.kwargs`.
ARCHITECTURES: dict[str, Callable[..., nn.Module]] = {
    "retinanet_mobilenet_v2": _retinanet,
    "cifar_cnn": _cifar_cnn,
    "fashion_cnn": _fashion_cnn,
    "torchvision": _vision,  # kwargs: name="resnet18", num_classes=...
}


@dataclass(frozen=True)
class ModelInfo:
    """What ``model.json`` holds.

    Attributes:
        arch: A key of :data:`ARCHITECTURES`, or ``keras`` for a ``.keras`` file.
        task: ``classification`` (logits ``[N, classes]``) or ``detection`` (torchvision's list
            of ``{"boxes", "labels", "scores"}``, labels from 1).
        classes: Class names; a label ``k`` names ``classes[k]`` (classification) or
            ``classes[k - 1]`` (detection).
        kwargs: Arguments of the builder.
        input_shape: ``[C, H, W]`` of one input image (detection: ``[3, -1, -1]``, any size).
        mean: Per-channel mean subtracted after scaling pixels to ``[0, 1]``.
        std: Per-channel deviation divided by after that.
        extra: Anything else the trainer recorded (epoch, metrics).
    """

    arch: str
    task: Literal["classification", "detection"]
    classes: list[str]
    kwargs: dict[str, Any] = field(default_factory=dict)
    input_shape: list[int] = field(default_factory=lambda: [3, -1, -1])
    mean: list[float] = field(default_factory=lambda: [0.0])
    std: list[float] = field(default_factory=lambda: [1.0])
    extra: dict[str, Any] = field(default_factory=dict)


def save_model(directory: Path, model: nn.Module, info: ModelInfo) -> Path:
    """Write ``model.pt`` and ``model.json`` into ``directory`` (created); returns the weights
    file's path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / WEIGHTS_FILE
    torch.save(model.state_dict(), path)
    (directory / METADATA_FILE).write_text(json.dumps(asdict(info), indent=2))
    return path


def read_info(path: Path) -> tuple[Path, ModelInfo]:
    """Find and read the metadata of a saved model.

    Args:
        path: The model's folder (``model.pt`` or ``model.keras``, and ``model.json``), or its
            weights file (``model.json`` then lies beside it, or a JSON of the same stem does;
            a ``.keras`` file needs none).

    Returns:
        The weights file and the metadata (of a lone ``.keras`` file: ``arch`` keras, classes
        still empty: :func:`load_model` names them from the model's outputs).

    Raises:
        SavedModelError: Either file is missing or the JSON is not a model's metadata.
    """
    path = Path(path)
    if path.is_dir():
        weights, meta = path / WEIGHTS_FILE, path / METADATA_FILE
        if not weights.is_file() and (path / KERAS_FILE).is_file():
            weights = path / KERAS_FILE
    else:
        weights = path
        meta = path.with_suffix(".json")
        meta = meta if meta.is_file() else path.parent / METADATA_FILE
    if weights.suffix == ".keras" and weights.is_file() and not meta.is_file():
        return weights, ModelInfo(arch=KERAS_ARCH, task="classification", classes=[])
    for p in (weights, meta):
        if not p.is_file():
            raise SavedModelError(f"{p} does not exist: a saved model is a folder with "
                                  f"{WEIGHTS_FILE} (or {KERAS_FILE}) and {METADATA_FILE} (see "
                                  "save_model)")
    try:
        info = ModelInfo(**json.loads(meta.read_text()))
    except (ValueError, TypeError) as e:
        raise SavedModelError(f"{meta} is not a model's metadata: {e}") from None
    if info.arch not in ARCHITECTURES and info.arch != KERAS_ARCH:
        raise SavedModelError(f"{meta} names architecture {info.arch!r}; this ringtrain knows "
                              f"{', '.join(sorted([*ARCHITECTURES, KERAS_ARCH]))}")
    if (info.arch == KERAS_ARCH) != (weights.suffix == ".keras"):
        raise SavedModelError(f"{meta} says {info.arch!r} but the weights are {weights.name}: "
                              f"arch {KERAS_ARCH!r} goes with a .keras file, others with "
                              f"{WEIGHTS_FILE}")
    return weights, info


def _load_keras(weights: Path, info: ModelInfo) -> tuple[nn.Module, ModelInfo]:
    from ringtrain.models.keras_model import KerasModelError, load_keras_classifier

    if info.task != "classification":
        raise SavedModelError(f"{weights}: Keras models are served as classifiers, not "
                              f"{info.task!r}")
    try:
        model, shapes = load_keras_classifier(weights, info.extra.get("outputs"))
    except KerasModelError as e:
        raise SavedModelError(str(e)) from None
    classes = info.classes or [str(k) for k in range(shapes["num_classes"])]
    if len(classes) != shapes["num_classes"]:
        raise SavedModelError(f"{weights} answers {shapes['num_classes']} classes, its metadata "
                              f"names {len(classes)}")
    return model, replace(info, classes=classes, input_shape=shapes["input_shape"])


def load_model(path: Path, device: torch.device | str = "cpu") -> tuple[nn.Module, ModelInfo]:
    """The saved model at ``path`` (as :func:`read_info` finds it) rebuilt with its weights, in
    eval mode on ``device``, and its metadata.

    Raises:
        SavedModelError: As :func:`read_info`; or the weights file asks to run code, is no
            ``state_dict``, or does not fit the architecture its metadata describes (each said
            in one line).
    """
    weights, info = read_info(path)
    if info.arch == KERAS_ARCH:
        model, info = _load_keras(weights, info)
        return model.to(device).eval(), info
    state = _read_state(weights)
    # Built on the meta device first, which allocates nothing: a model.json asking for two
    # billion classes is refused by its shapes before a byte is taken for them. A builder that
    # computes with its tensors cannot run there (torchvision's RegNets): its model is compared
    # once built.
    try:
        with torch.device("meta"):
            expected: dict[str, torch.Tensor] | None = _build(weights, info).state_dict()
    except NotImplementedError:
        expected = None
    if expected is not None:
        _check_fits(weights, info, expected, state)
    model = _build(weights, info)
    if expected is None:
        _check_fits(weights, info, model.state_dict(), state)
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise SavedModelError(f"{weights} does not load into {info.arch}: {_line(e)}") from None
    return model.to(device).eval(), info


def _read_state(weights: Path) -> dict[str, torch.Tensor]:
    """The ``state_dict`` in ``weights``, read without running any code it holds."""
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # weights_only refuses every object but tensors and plain containers; the global it
        # names is the code the file asked to run (os.system, a class of the trainer's).
        found = re.search(r"GLOBAL (\S+)", str(e))
        what = f" ({found.group(1)})" if found else ""
        raise SavedModelError(
            f"{weights} asks to run code when loaded{what}: it is not a plain state_dict, and "
            "ringtrain never runs code from a model file; save the weights with "
            "torch.save(model.state_dict(), path)") from None
    except (RuntimeError, ValueError, OSError, EOFError) as e:
        raise SavedModelError(f"{weights} is not a PyTorch weights file: {_line(e)}") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise SavedModelError(f"{weights} holds a {type(state).__name__} that is not a "
                              "state_dict (names to tensors); save the weights with "
                              "torch.save(model.state_dict(), path)")
    return state


def _build(weights: Path, info: ModelInfo) -> nn.Module:
    """The architecture built with the metadata's arguments (on the current default device).

    Raises:
        NotImplementedError: On the meta device, a builder that needs its tensors' data.
        SavedModelError: The arguments do not build a model, or memory runs out.
    """
    try:
        return ARCHITECTURES[info.arch](**info.kwargs)
    except NotImplementedError:
        raise
    except (TypeError, ValueError, ImportError, RuntimeError) as e:  # Runtime: out of memory
        raise SavedModelError(f"{weights}: the metadata's kwargs do not build {info.arch}: "
                              f"{_line(e)}") from None


def _check_fits(weights: Path, info: ModelInfo, expected: dict[str, torch.Tensor],
                state: dict[str, torch.Tensor]) -> None:
    """Raise SavedModelError, naming the first difference, unless ``state`` has exactly the
    names and shapes of ``expected`` (the built model's ``state_dict``)."""
    wrong = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if not (wrong or missing or unexpected):
        return
    if wrong:
        k = wrong[0]
        what = (f"{k} is {list(state[k].shape)} in the weights, {list(expected[k].shape)} in "
                "the model")
    elif missing:
        what = f"the weights lack {missing[0]}"
    else:
        what = f"the weights hold {unexpected[0]}, which the model has not"
    more = len(wrong) + len(missing) + len(unexpected) - 1
    if more:
        what += f" (and {more} more difference{'s' if more > 1 else ''})"
    raise SavedModelError(f"{weights} does not fit the {info.arch} its metadata describes: "
                          f"{what}")


def _line(error: BaseException) -> str:
    """An error's first line, as long as one line should be: torch's go on for paragraphs."""
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    return first[:300] or type(error).__name__
