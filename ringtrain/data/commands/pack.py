"""`ringtrain data pack SRC OUT`: pre-resize an image folder into one memory-mapped file.

Training then reads each image as a slice of the page cache, already at ``--size`` short side:
``raw`` (default) stores decoded pixels, so training decodes nothing; ``jpeg`` stores re-encoded
files about 10x smaller, for data sets that would not fit the page cache raw. Read it with
``ringtrain.data.packed.PackedImages(OUT)``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tqdm import tqdm

from ringtrain.data.commands.arg_types import positive_int


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``pack`` subcommand."""
    p = subparsers.add_parser("pack", help="pre-resize an image folder into one packed file",
                              description=__doc__)
    p.add_argument("src", type=Path, help="image folder in ImageNet's layout (SRC/<class>/...)")
    p.add_argument("out", type=Path, help="output folder (created; must be empty if it exists)")
    p.add_argument("--size", type=positive_int, default=256,
                   help="short side of the stored images, in pixels (default 256)")
    p.add_argument("--format", choices=["raw", "jpeg"], default="raw",
                   help="raw pixels (no decoding when training; default) or jpeg (smaller)")
    p.add_argument("--quality", type=positive_int, default=90, help="JPEG quality (90)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Pack the folder, with a progress bar."""
    from ringtrain.data.image_folder import ImageFolder
    from ringtrain.data.packed import write_packed

    folder = ImageFolder(args.src)
    items = (folder.read(i) for i in tqdm(range(len(folder)), desc="pack", unit="img"))
    count = write_packed(items, args.out, classes=folder.classes, size=args.size,
                         fmt=args.format, quality=args.quality)
    size_mb = (args.out / "images.bin").stat().st_size / 1e6
    print(f"wrote {count} images ({len(folder.classes)} classes, {args.format}, short side "
          f"{args.size}) to {args.out}: {size_mb:.1f} MB")
    return 0
