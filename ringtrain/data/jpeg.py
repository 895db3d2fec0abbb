"""Image decoding: libjpeg-turbo on the CPU (through simplejpeg), nvjpeg batched on CUDA.

Why simplejpeg: torchvision's own decoder does not load next to the CPU build of PyTorch (its
compiled image library is built against CUDA), and of Pillow, OpenCV and simplejpeg, simplejpeg
decoded real photos fastest and can scale down by 1/2, 1/4 or 1/8 inside the DCT, which makes a
later downscale almost free (benchmarks/RESULTS.md, "JPEG decoding"). Files that are not JPEG
(PNG) go through Pillow.
"""

from __future__ import annotations

import io

import numpy as np
import torch

_JPEG_MAGIC = b"\xff\xd8"


def is_jpeg(data: bytes | memoryview) -> bool:
    """Whether ``data`` starts like a JPEG file."""
    return bytes(data[:2]) == _JPEG_MAGIC


def image_size(data: bytes | memoryview) -> tuple[int, int]:
    """``(height, width)`` of an encoded image, from its header only."""
    if is_jpeg(data):
        import simplejpeg

        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        return height, width
    from PIL import Image

    width, height = Image.open(io.BytesIO(bytes(data))).size
    return height, width


def decode_rgb(data: bytes | memoryview, *, min_height: int = 0,
               min_width: int = 0) -> np.ndarray:
    """Decode an image to a ``uint8 [H, W, 3]`` RGB array at least ``min_height x min_width``
    (0: full size); a JPEG is scaled down in the decoder as far as that allows (1/2, 1/4 or 1/8:
    it skips detail it would throw away).

    Raises:
        ValueError: ``data`` is not a decodable image.
    """
    if is_jpeg(data):
        import simplejpeg

        try:
            return simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=min_height,
                                          min_width=min_width)
        except ValueError as e:
            raise ValueError(f"cannot decode JPEG ({len(data)} bytes): {e}") from e
    from PIL import Image, UnidentifiedImageError

    try:
        return np.array(Image.open(io.BytesIO(bytes(data))).convert("RGB"))
    except (UnidentifiedImageError, OSError) as e:
        raise ValueError(f"cannot decode image ({len(data)} bytes): {e}") from e


def decode_jpeg_cuda(blobs: list[torch.Tensor], device: torch.device | str) -> list[torch.Tensor]:
    """Decode a batch of JPEGs (1-D ``uint8`` CPU tensors; pinned memory speeds the upload)
    with nvjpeg in one call, to ``uint8 [3, H, W]`` tensors on the CUDA ``device``.

    Raises:
        RuntimeError: torchvision's CUDA image operators are not available.
    """
    from ringtrain.models.vision import load_torchvision

    load_torchvision()
    from torchvision.io import ImageReadMode, decode_jpeg

    return decode_jpeg(blobs, mode=ImageReadMode.RGB, device=device)
