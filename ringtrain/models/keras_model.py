"""A saved Keras 3 classifier (``model.keras``) behind the interface of the torch models.

``ringtrain serve`` hands models ``[N, C, H, W]`` float tensors and reads class scores it turns
into probabilities with a softmax. Keras image models take ``[N, H, W, C]`` (channels last) and
often end in a softmax themselves (the tutorial's CNN does). :class:`KerasClassifier` permutes
the input and, for a model that outputs probabilities, answers their logarithms, whose softmax
is those probabilities again. Keras on its torch backend is a ``torch.nn.Module``, so ``to``,
``eval`` and inference mode apply to it as to any model.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ringtrain.errors import RingtrainError


class KerasModelError(RingtrainError, ValueError):
    """A ``.keras`` file cannot be loaded as a classifier on Keras' torch backend."""


def _keras() -> Any:
    """Keras on its torch backend (made the default here if keras is not imported yet)."""
    if "keras" not in sys.modules:
        backend = os.environ.setdefault("KERAS_BACKEND", "torch")
        if backend != "torch":
            raise KerasModelError(f"KERAS_BACKEND is {backend!r}; a .keras model is served on "
                                  "Keras' torch backend: unset it or set KERAS_BACKEND=torch")
    try:
        import keras
    except ImportError as e:
        raise KerasModelError(f"serving a .keras model needs Keras 3: pip install "
                              f"'ringtrain[keras]' ({e})") from None
    if keras.backend.backend() != "torch":
        raise KerasModelError(f"keras runs on {keras.backend.backend()!r} in this process; a "
                              ".keras model is served on its torch backend (KERAS_BACKEND=torch)")
    return keras


class KerasClassifier(nn.Module):
    """A Keras classifier (torch backend) taking ``[N, C, H, W]`` and answering logits, or
    log-probabilities when its outputs are ``probabilities`` (a softmax at the end);
    ``channels_last``: the Keras model takes ``[N, H, W, C]``."""

    def __init__(self, model: Any, channels_last: bool, probabilities: bool):
        super().__init__()
        self.keras_model = model
        self.channels_last = channels_last
        self.probabilities = probabilities

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last and x.dim() == 4:
            x = x.permute(0, 2, 3, 1)
        out = self.keras_model(x, training=False)
        out = torch.as_tensor(out)
        return torch.log(out.clamp_min(1e-30)) if self.probabilities else out


def _ends_in_softmax(model: Any) -> bool:
    last = model.layers[-1] if getattr(model, "layers", None) else None
    activation = getattr(last, "activation", None)
    return getattr(activation, "__name__", "") == "softmax"


def load_keras_classifier(path: Path, outputs: str | None = None) -> tuple[KerasClassifier, dict]:
    """Load ``path`` (a ``.keras`` file) without its optimizer, as a classifier in eval mode,
    with what the file says of its shapes: ``{"input_shape": [C, H, W], "num_classes": K}``.
    ``outputs`` is ``"probabilities"`` or ``"logits"`` as its trainer recorded (missing: found
    from the last layer's activation).

    Raises:
        KerasModelError: keras is missing or on another backend, or the file does not load or
            is not an image classifier.
    """
    keras = _keras()
    try:
        model = keras.saving.load_model(path, compile=False)
    except (ValueError, OSError, TypeError, KeyError) as e:
        raise KerasModelError(f"{path} does not load as a Keras model: {e}") from None
    in_shape, out_shape = tuple(model.input_shape), tuple(model.output_shape)
    if len(in_shape) != 4 or len(out_shape) != 2:
        raise KerasModelError(f"{path}: a served Keras model takes images [N, H, W, C] and "
                              f"answers class scores [N, K]; this one takes {list(in_shape)} "
                              f"and answers {list(out_shape)}")
    channels_last = keras.config.image_data_format() == "channels_last"
    c, h, w = (in_shape[3], in_shape[1], in_shape[2]) if channels_last else in_shape[1:]
    probabilities = _ends_in_softmax(model) if outputs is None else outputs == "probabilities"
    classifier = KerasClassifier(model, channels_last, probabilities).eval()
    return classifier, {"input_shape": [c, h, w], "num_classes": out_shape[1]}
