"""Decode + random-resized-crop cost per JPEG for each CPU decoder ringtrain could use.

    ringtrain data photos /tmp/photos --count 600
    python benchmarks/jpeg_decode.py /tmp/photos/train --size 224

Needs the ``bench`` extra (OpenCV): ``pip install -e ".[bench]"``. One process, one thread.
Prints one JSON line: milliseconds per image (median of 3 passes) for
decode alone and for decode + crop + resize to ``--size``, with and without the decoder's DCT
downscaling (Pillow's draft mode, simplejpeg's min_width/min_height, OpenCV's IMREAD_REDUCED).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("folder", type=Path)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--limit", type=int, default=300)
    args = p.parse_args()
    import cv2

    cv2.setNumThreads(1)
    files = sorted(args.folder.rglob("*.jpg"))[: args.limit]
    blobs = [f.read_bytes() for f in files]
    out = {"images": len(blobs), "kb_per_image": round(sum(map(len, blobs)) / len(blobs) / 1e3, 1)}
    for name, fn in _candidates(args.size).items():
        passes = []
        for _ in range(3):
            t0 = time.perf_counter()
            for b in blobs:
                fn(b)
            passes.append((time.perf_counter() - t0) / len(blobs) * 1e3)
        out[name] = round(statistics.median(passes), 3)
    print(json.dumps(out))


def _candidates(size: int) -> dict:
    import io

    import cv2
    import simplejpeg
    from PIL import Image

    def resize(a: np.ndarray) -> np.ndarray:
        h, w = a.shape[:2]  # a fixed central 80 % crop stands for RandomResizedCrop
        a = a[h // 10 : h - h // 10, w // 10 : w - w // 10]
        return cv2.resize(a, (size, size), interpolation=cv2.INTER_LINEAR)

    def pil(b: bytes, draft: bool) -> np.ndarray:
        im = Image.open(io.BytesIO(b))
        if draft:
            im.draft("RGB", (size, size))
        return np.asarray(im.convert("RGB"))

    def pil_crop(b: bytes, draft: bool) -> Image.Image:
        im = Image.open(io.BytesIO(b))
        if draft:
            im.draft("RGB", (size, size))
        w, h = im.size
        return im.convert("RGB").resize((size, size), Image.Resampling.BILINEAR,
                                        box=(w // 10, h // 10, w - w // 10, h - h // 10))

    def cv(b: bytes, reduced: bool) -> np.ndarray:
        flag = cv2.IMREAD_REDUCED_COLOR_2 if reduced else cv2.IMREAD_COLOR
        return cv2.cvtColor(cv2.imdecode(np.frombuffer(b, np.uint8), flag), cv2.COLOR_BGR2RGB)

    def sj(b: bytes, scaled: bool) -> np.ndarray:
        if scaled:
            return simplejpeg.decode_jpeg(b, colorspace="RGB", min_width=size, min_height=size)
        return simplejpeg.decode_jpeg(b, colorspace="RGB")

    return {
        "pil_decode": lambda b: pil(b, False),
        "pil_decode_crop": lambda b: pil_crop(b, False),
        "pil_draft_decode_crop": lambda b: pil_crop(b, True),
        "opencv_decode": lambda b: cv(b, False),
        "opencv_decode_crop": lambda b: resize(cv(b, False)),
        "opencv_reduced2_decode_crop": lambda b: resize(cv(b, True)),
        "simplejpeg_decode": lambda b: sj(b, False),
        "simplejpeg_decode_crop": lambda b: resize(sj(b, False)),
        "simplejpeg_scaled_decode_crop": lambda b: resize(sj(b, True)),
    }


if __name__ == "__main__":
    main()
