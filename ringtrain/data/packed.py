"""The packed format: a data set pre-resized once and stored in one memory-mapped file.

For users who can spend disk to save CPU (FFCV's lesson): every image resized so that its short
side is ``size`` (256 for 224 crops) and stored back to back in ``images.bin``, either decoded
(``raw``: ``uint8`` pixels, no decoding at all when training) or re-encoded (``jpeg``: about 10x
smaller, decoded at training time from a file already the right size). ``index.npy`` holds one
row per image: byte offset, byte count, height, width, label; ``meta.json`` the format, the size
and the class names. Built by ``ringtrain data pack``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from ringtrain.data import jpeg
from ringtrain.data.idx import DatasetFileError

PackFormat = Literal["raw", "jpeg"]
FORMAT_VERSION = 1
_IMAGES, _INDEX, _META = "images.bin", "index.npy", "meta.json"


class PackedImages:
    """A packed data set as ``(image, label)`` items: a ``uint8 [H, W, 3]`` array (raw format,
    a view of the memory map) or the JPEG bytes.

    The file is mapped lazily in each process, so loader workers share the page cache instead
    of pickling the data.

    Raises:
        DatasetFileError: A file is missing or the folder is not a packed data set.
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        try:
            meta = json.loads((self.folder / _META).read_text())
            self.index = np.load(self.folder / _INDEX)
        except (OSError, ValueError) as e:
            raise DatasetFileError(f"{self.folder}: not a packed data set ({e}); build one with "
                                   "`ringtrain data pack SRC OUT`") from e
        if meta.get("version") != FORMAT_VERSION:
            raise DatasetFileError(f"{self.folder}: packed format version {meta.get('version')}, "
                                   f"this ringtrain reads {FORMAT_VERSION}: pack it again")
        self.format: PackFormat = meta["format"]
        self.size: int = meta["size"]
        self.classes: list[str] = meta["classes"]
        self.targets = self.index[:, 4].tolist()
        self._map: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.index)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_map": None}  # a worker maps the file itself

    def read(self, index: int) -> tuple[np.ndarray | memoryview, int]:
        """Image ``index`` and its label."""
        if self._map is None:
            # Copy-on-write: writable views (torch.from_numpy wants them) that never touch disk.
            self._map = np.memmap(self.folder / _IMAGES, dtype=np.uint8, mode="c")
        offset, nbytes, height, width, label = (int(v) for v in self.index[index])
        data = self._map[offset:offset + nbytes]
        if self.format == "raw":
            return data.reshape(height, width, 3), label
        return memoryview(data.data), label


def resize_short_side(pixels: np.ndarray, size: int) -> np.ndarray:
    """An ``[H, W, 3]`` image resized (bilinear, antialiased) so its short side is ``size``;
    images already that small are kept as they are (upscaling adds bytes, not detail)."""
    height, width = pixels.shape[:2]
    if min(height, width) <= size:
        return pixels
    scale = size / min(height, width)
    out_hw = (max(size, round(height * scale)), max(size, round(width * scale)))
    image = torch.from_numpy(np.ascontiguousarray(pixels)).permute(2, 0, 1).unsqueeze(0)
    out = F.interpolate(image, size=out_hw, mode="bilinear", antialias=True, align_corners=False)
    return out[0].permute(1, 2, 0).contiguous().numpy()


def write_packed(items: Iterable[tuple[bytes, int]], out: str | Path, *, classes: list[str],
                 size: int = 256, fmt: PackFormat = "raw", quality: int = 90) -> int:
    """Write a packed data set of ``(encoded image, label)`` items (an
    :class:`~ringtrain.data.image_folder.ImageFolder`'s, say, in a progress bar) to the folder
    ``out`` (absent or empty), short side ``size``, as ``raw`` pixels or ``jpeg`` of ``quality``;
    returns the number of images written.

    Raises:
        FileExistsError: ``out`` exists and is not empty.
        ValueError: ``size`` is not positive, ``fmt`` is unknown, or an image cannot be decoded.
    """
    out = Path(out)
    if size < 1 or fmt not in ("raw", "jpeg"):
        raise ValueError(f"size must be positive and fmt 'raw' or 'jpeg', got {size}, {fmt!r}")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty: choose a new folder or empty this one")
    out.mkdir(parents=True, exist_ok=True)
    import simplejpeg

    rows = []
    offset = 0
    with open(out / _IMAGES, "wb") as f:
        for data, label in items:
            pixels = resize_short_side(jpeg.decode_rgb(data, min_height=size, min_width=size),
                                       size)
            blob = (pixels.tobytes() if fmt == "raw" else
                    simplejpeg.encode_jpeg(np.ascontiguousarray(pixels), quality=quality))
            f.write(blob)
            rows.append((offset, len(blob), pixels.shape[0], pixels.shape[1], label))
            offset += len(blob)
    np.save(out / _INDEX, np.array(rows, dtype=np.int64).reshape(-1, 5))
    (out / _META).write_text(json.dumps({"version": FORMAT_VERSION, "format": fmt, "size": size,
                                         "classes": classes, "count": len(rows)}))
    return len(rows)
