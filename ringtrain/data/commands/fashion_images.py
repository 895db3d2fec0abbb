"""`ringtrain data fashion-images OUT`: Fashion-MNIST written as an ImageNet-style folder tree.

``OUT/train/<label>_<class>/<index>.png`` and ``OUT/val/...`` (the official test split), so that
folder pipelines and ``torchvision.datasets.ImageFolder`` read it like any folder of photos.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tqdm import tqdm

from ringtrain.data.commands.arg_types import positive_int
from ringtrain.data.fashion_mnist import CLASSES, DEFAULT_DATA_DIR, Split, load_fashion_mnist

_SPLITS: dict[str, Split] = {"train": "train", "val": "test"}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``fashion-images`` subcommand."""
    p = subparsers.add_parser("fashion-images", help="write Fashion-MNIST as image files",
                              description=__doc__)
    p.add_argument("out", type=Path, help="output folder (created; must be empty if it exists)")
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                   help=f"folder of the IDX files (default: {DEFAULT_DATA_DIR})")
    p.add_argument("--format", choices=["png", "jpeg"], default="png",
                   help="png (lossless, default) or jpeg (quality 95)")
    p.add_argument("--limit", type=positive_int, default=None,
                   help="write only the first N images of each split (for quick trials)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the images; refuses a non-empty output folder so that nothing is overwritten."""
    from PIL import Image

    out: Path = args.out
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty: choose a new folder or empty this one")
    suffix = ".png" if args.format == "png" else ".jpg"
    for folder, split in _SPLITS.items():
        images, labels = load_fashion_mnist(split, args.data_dir)
        count = len(labels) if args.limit is None else min(args.limit, len(labels))
        for label in range(len(CLASSES)):
            (out / folder / _folder_name(label)).mkdir(parents=True, exist_ok=True)
        for i in tqdm(range(count), desc=folder, unit="img"):
            path = out / folder / _folder_name(int(labels[i])) / f"{i:05d}{suffix}"
            Image.fromarray(images[i].numpy(), mode="L").save(path, quality=95)
    print(f"wrote {out}/train and {out}/val ({len(CLASSES)} classes)")
    return 0


def _folder_name(label: int) -> str:
    """``3_Dress``: the label first, so that sorted folder names (ImageFolder's class order) keep
    Fashion-MNIST's label order; 'T-shirt/top' holds a slash, which a folder name cannot."""
    return f"{label}_{CLASSES[label]}".replace("/", "-").replace(" ", "_")
