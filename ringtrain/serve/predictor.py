"""A loaded model and what turns requests into its inputs and its outputs into answers.

Two tasks: ``classification`` (inputs ``[C, H, W]`` as the model takes them, answers class
probabilities) and ``detection`` (inputs ``[3, H, W]`` pixels in ``[0, 1]`` of any size, answers
boxes with labels and scores). Input checks raise :class:`InputError`, whose message names the
problem; the server answers it with 400.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ringtrain.errors import RingtrainError
from ringtrain.models.saved import ModelInfo, load_model

# A decoded image of more pixels than this is refused before it is decoded (a small PNG can
# expand to gigabytes); 40 MP is a large camera photo.
MAX_IMAGE_PIXELS = 40_000_000


class InputError(RingtrainError, ValueError):
    """A request's input cannot be given to the model (shape, dtype, not an image, too large)."""


class Predictor:
    """A model in eval mode on one device, with its :class:`~ringtrain.models.saved.ModelInfo`."""

    def __init__(self, model: nn.Module, info: ModelInfo, device: torch.device) -> None:
        self.model = model
        self.info = info
        self.device = device

    @classmethod
    def load(cls, path: Path, device: str = "cpu") -> Predictor:
        """Load a saved model (see :func:`ringtrain.models.saved.load_model`).

        Raises:
            SavedModelError: The model cannot be loaded.
            ValueError: ``device`` is not a device name, or CUDA is asked for without CUDA.
        """
        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {device!r}: CUDA is not available here; use --device cpu")
        model, info = load_model(path, dev)
        return cls(model, info, dev)

    @property
    def detection(self) -> bool:
        return self.info.task == "detection"

    @property
    def item_shape(self) -> list[int]:
        """One input's shape; ``-1`` where any size goes."""
        return [3, -1, -1] if self.detection else list(self.info.input_shape)

    def output_specs(self) -> list[dict[str, Any]]:
        """The outputs as the Open Inference Protocol describes them (``-1``: any length)."""
        if self.detection:
            return [{"name": "boxes", "datatype": "FP32", "shape": [-1, 4]},
                    {"name": "scores", "datatype": "FP32", "shape": [-1]},
                    {"name": "labels", "datatype": "INT64", "shape": [-1]},
                    {"name": "batch_index", "datatype": "INT64", "shape": [-1]}]
        return [{"name": "probabilities", "datatype": "FP32",
                 "shape": [-1, len(self.info.classes)]}]

    def check_item(self, item: torch.Tensor) -> None:
        """Refuse one input the model cannot take.

        Raises:
            InputError: Its shape differs from :attr:`item_shape`, or it holds NaN or infinity.
        """
        want = self.item_shape
        if item.dim() != len(want) or any(w != -1 and w != s for w, s in zip(want, item.shape)):
            raise InputError(f"each input must have shape {_shape(want)}, got "
                             f"{_shape(list(item.shape))}")
        if self.detection and min(item.shape[1:]) < 1:
            raise InputError(f"an image must be at least 1x1, got {_shape(list(item.shape))}")
        if not torch.isfinite(item).all():
            raise InputError("the input holds NaN or infinity")

    def decode_cost(self, data: bytes) -> int:
        """About the most bytes :meth:`decode_image` allocates for ``data``, read from the image's
        header alone (nothing is decoded).

        Raises:
            InputError: The bytes are not an image Pillow can read, or it is too large.
        """
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(io.BytesIO(data)) as opened:
                w, h = opened.size
                source = len(opened.getbands()) * (4 if opened.mode[:1] in ("I", "F") else 1)
        except UnidentifiedImageError:
            raise InputError("the body is not an image file: send the bytes of a JPEG or PNG "
                             "image") from None
        except (Image.DecompressionBombError, OSError) as e:
            raise InputError(f"the image cannot be decoded: {e}") from None
        if w * h > MAX_IMAGE_PIXELS:
            raise InputError(f"image of {w}x{h} pixels is larger than {MAX_IMAGE_PIXELS:,} pixels")
        if self.detection:
            # The decoded RGB, its bytes twice over (tobytes, bytearray), two float32 tensors.
            return w * h * (source + 3 * (1 + 1 + 1 + 4 + 4))
        c, height, width = self.info.input_shape
        # The decoded image and its conversion at full size; the model's input is small.
        return w * h * (source + c) + height * width * c * 16

    def decode_image(self, data: bytes) -> torch.Tensor:
        """An image file (JPEG, PNG, anything Pillow reads) as one model input.

        Classification: converted to the model's channels, resized to its input size, scaled to
        ``[0, 1]`` and normalised as in training. Detection: RGB in ``[0, 1]`` at its own size.

        Raises:
            InputError: The bytes are not an image Pillow can read, or it is too large.
        """
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(io.BytesIO(data)) as opened:
                w, h = opened.size
                if w * h > MAX_IMAGE_PIXELS:
                    raise InputError(f"image of {w}x{h} pixels is larger than "
                                     f"{MAX_IMAGE_PIXELS:,} pixels")
                if self.detection:
                    image = opened.convert("RGB")
                else:
                    c, height, width = self.info.input_shape
                    image = opened.convert("L" if c == 1 else "RGB").resize((width, height))
                image.load()
        except UnidentifiedImageError:
            raise InputError("the body is not an image file: send the bytes of a JPEG or PNG "
                             "image") from None
        except (Image.DecompressionBombError, OSError) as e:  # truncated or corrupt data
            raise InputError(f"the image cannot be decoded: {e}") from None
        pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
        tensor = pixels.view(image.size[1], image.size[0], -1).permute(2, 0, 1).float() / 255
        if not self.detection:
            mean = torch.tensor(self.info.mean).view(-1, 1, 1)
            std = torch.tensor(self.info.std).view(-1, 1, 1)
            tensor = (tensor - mean) / std
        return tensor

    @torch.inference_mode()
    def predict(self, items: list[torch.Tensor]) -> list[Any]:
        """Run the model on a batch of checked inputs: one result per input, a ``[classes]``
        probability tensor (classification) or a ``{"boxes", "labels", "scores"}`` dict of CPU
        tensors (detection)."""
        if self.detection:
            outputs = self.model([x.to(self.device) for x in items])
            return [{k: v.cpu() for k, v in out.items()} for out in outputs]
        logits = self.model(torch.stack(items).to(self.device))
        return list(torch.softmax(logits.float(), dim=1).cpu())

    def describe(self, result: Any, top_k: int, min_score: float) -> dict[str, Any]:
        """One result as the image route answers it: the best classes, or the boxes."""
        if self.detection:
            keep = result["scores"] >= min_score
            return {"boxes": [
                {"label": self.info.classes[int(label) - 1], "score": round(float(score), 4),
                 "box": [round(float(v), 1) for v in box]}
                for box, label, score in zip(result["boxes"][keep], result["labels"][keep],
                                             result["scores"][keep])]}
        scores, indices = result.topk(min(top_k, result.numel()))
        return {"classes": [{"label": self.info.classes[int(i)], "index": int(i),
                             "score": round(float(s), 4)} for s, i in zip(scores, indices)]}


def _shape(shape: list[int]) -> str:
    return "[" + ", ".join("*" if s == -1 else str(s) for s in shape) + "]"
