"""`ringtrain data photos OUT`: a folder of real photographs, as JPEG crops of aerial images.

The ``deepforest`` wheel ships a handful of real aerial photographs (PNG, up to 2,300 x 2,500
px). Random crops of them, resized to about ImageNet's average picture (448 x 368 by default)
and saved as JPEG, give a folder tree of real photos whose decode cost is that of real data,
which Fashion-MNIST's tiny grey images are not. Each source photograph is one class:
``OUT/train/<source>/<index>.jpg`` and ``OUT/val/...``.

The wheel is read as files (its Python code is never imported: it pulls in heavy dependencies);
install it with ``pip install --no-deps deepforest``.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from tqdm import tqdm

from ringtrain.data.commands.arg_types import positive_int
from ringtrain.data.commands.deepforest_coco import deepforest_data_dir
from ringtrain.errors import RingtrainError

_SOURCE_SUFFIXES = (".png", ".jpg")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``photos`` subcommand."""
    p = subparsers.add_parser("photos", help="write JPEG crops of real aerial photographs",
                              description=__doc__)
    p.add_argument("out", type=Path, help="output folder (created; must be empty if it exists)")
    p.add_argument("--count", type=positive_int, default=1000,
                   help="photos in train (default 1000); val gets a tenth as many")
    p.add_argument("--size", default="448x368", help="WIDTHxHEIGHT of each photo (448x368)")
    p.add_argument("--quality", type=positive_int, default=90, help="JPEG quality (90)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the crops; refuses a non-empty output folder so that nothing is overwritten."""
    from PIL import Image

    out: Path = args.out
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty: choose a new folder or empty this one")
    width, height = _parse_size(args.size)
    sources = [(p.stem.replace(" ", "_"), Image.open(p).convert("RGB"))
               for p in deepforest_photos()]
    rng = random.Random(args.seed)
    for split, count in (("train", args.count), ("val", max(1, args.count // 10))):
        for name, _ in sources:
            (out / split / name).mkdir(parents=True, exist_ok=True)
        for i in tqdm(range(count), desc=split, unit="img"):
            name, image = sources[i % len(sources)]
            crop = _random_crop(image, width / height, rng).resize((width, height),
                                                                   Image.Resampling.BILINEAR)
            if rng.random() < 0.5:
                crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            crop.save(out / split / name / f"{i:06d}.jpg", quality=args.quality)
    print(f"wrote {out}/train and {out}/val ({len(sources)} classes, {width}x{height})")
    return 0


def deepforest_photos() -> list[Path]:
    """The photographs in the ``deepforest`` wheel's data folder (found, never imported).

    Raises:
        ConfigError: deepforest is not installed.
    """
    folder = deepforest_data_dir()
    # OSBS_029.tif is the same picture as OSBS_029.png: keep the PNGs and JPEGs only.
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in _SOURCE_SUFFIXES)


def _random_crop(image, aspect: float, rng: random.Random):
    """A crop of 30-100 % of the picture's largest ``aspect`` box, at a random place."""
    w, h = image.size
    full_w = min(w, int(h * aspect))
    scale = rng.uniform(0.3, 1.0)
    cw, ch = max(16, int(full_w * scale)), max(16, int(full_w * scale / aspect))
    x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
    return image.crop((x, y, x + cw, y + ch))


def _parse_size(text: str) -> tuple[int, int]:
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise RingtrainError(f"--size must be WIDTHxHEIGHT like 448x368, got {text!r}") from None
    if width < 16 or height < 16:
        raise RingtrainError(f"--size must be at least 16x16, got {text!r}")
    return width, height
