"""`ringtrain data deepforest-coco OUT`: a COCO detection set from DeepForest's aerial photos.

The ``deepforest`` wheel ships real RGB aerial photographs of forest with every tree crown boxed
(Pascal VOC XML beside the PNG). Large photos are cut into overlapping tiles; each tile keeps the
boxes mostly inside it, clipped. Train and validation are split by SOURCE PHOTO, never by tile:
overlapping tiles of one photo share trees, so a split by tile would score the model on trees it
trained on.

Writes ``OUT/{train,val}/images/<photo>_x<left>_y<top>.{png,jpg}`` and
``OUT/{train,val}/annotations.json`` (COCO; each image record also names its ``source`` photo).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
from pathlib import Path

from tqdm import tqdm

from ringtrain.data.coco_builder import CocoBuilder
from ringtrain.data.commands.arg_types import non_negative_int, positive_int
from ringtrain.data.tiling import boxes_in_tile, tile_starts
from ringtrain.data.voc import AnnotationFileError, VocAnnotation, read_voc
from ringtrain.errors import ConfigError

# Held out by default: the same site, flight and sensor as the largest training photo (so the
# score measures generalisation to new trees, not a new sensor), with 279 trees in 9 tiles.
DEFAULT_VAL = ("2019_YELL_2_541000_4977000_image_crop",)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``deepforest-coco`` subcommand."""
    p = subparsers.add_parser("deepforest-coco", help="COCO detection set of tree crowns from "
                              "the deepforest wheel's aerial photos", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="output folder (created; must be empty if it exists)")
    p.add_argument("--source", type=Path, default=None,
                   help="folder of PNG + VOC XML pairs (default: the installed deepforest "
                        "wheel's data folder)")
    p.add_argument("--tile", type=positive_int, default=400,
                   help="tile side in pixels (default 400); smaller photos stay whole")
    p.add_argument("--overlap", type=non_negative_int, default=50,
                   help="pixels shared by neighbouring tiles (default 50)")
    p.add_argument("--min-visible", type=float, default=0.5,
                   help="keep a box crossing a tile's edge, clipped, when at least this fraction "
                        "of its area is inside (default 0.5; 1.0 keeps only whole boxes)")
    p.add_argument("--val", action="append", metavar="PHOTO",
                   help="a photo (file name without extension) for the validation split; "
                        f"repeatable (default: {', '.join(DEFAULT_VAL)})")
    p.add_argument("--labels", choices=["tree", "keep"], default="tree",
                   help="tree: every object is one class 'Tree' (default; one photo labels its "
                        "trees Alive/Dead); keep: the class names of the XML files")
    p.add_argument("--drop-empty", action="store_true", help="leave out tiles with no box")
    p.add_argument("--format", choices=["png", "jpeg"], default="png",
                   help="png (lossless, default) or jpeg (quality 95)")
    p.set_defaults(func=run)


def deepforest_data_dir() -> Path:
    """The installed deepforest wheel's data folder, found without importing deepforest (its
    import pulls in a training stack that is not installed).

    Raises:
        ConfigError: deepforest is not installed.
    """
    spec = importlib.util.find_spec("deepforest")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the deepforest wheel is not installed: "
                          "pip install --no-deps deepforest==2.1.0 (scripts/setup.sh does)")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def annotated_photos(source: Path) -> list[Path]:
    """The PNG photos of ``source`` that have a VOC ``.xml`` beside them, sorted by name."""
    return sorted(p for p in source.glob("*.png") if p.with_suffix(".xml").exists())


def run(args: argparse.Namespace) -> int:
    """Build the data set; refuses a non-empty output folder so that nothing is overwritten."""
    from PIL import Image

    out: Path = args.out
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty: choose a new folder or empty this one")
    if not 0 < args.min_visible <= 1:
        raise ConfigError(f"--min-visible must be in (0, 1], got {args.min_visible}")
    if args.overlap >= args.tile:
        raise ConfigError(f"--overlap ({args.overlap}) must be smaller than --tile ({args.tile})")
    source = args.source or deepforest_data_dir()
    photos = annotated_photos(source)
    if not photos:
        raise ConfigError(f"{source} holds no PNG photo with a VOC .xml beside it")
    val = set(args.val or DEFAULT_VAL)
    unknown = val - {p.stem for p in photos}
    if unknown:
        raise ConfigError(f"--val {', '.join(sorted(unknown))}: no such annotated photo in "
                          f"{source}; choose from {', '.join(p.stem for p in photos)}")
    if all(p.stem in val for p in photos):
        raise ConfigError("every photo is in --val: leave at least one for training")

    annotations = {p: read_voc(p.with_suffix(".xml")) for p in photos}
    names = sorted({b.label for a in annotations.values() for b in a.boxes})
    categories = ["Tree"] if args.labels == "tree" else names
    builders = {split: CocoBuilder(categories) for split in ("train", "val")}
    suffix = ".png" if args.format == "png" else ".jpg"
    for split in builders:
        (out / split / "images").mkdir(parents=True)

    for photo in tqdm(photos, desc="photos", unit="photo"):
        split = "val" if photo.stem in val else "train"
        ann = annotations[photo]
        if args.labels == "tree":
            ann = VocAnnotation(ann.width, ann.height,
                                tuple(dataclasses.replace(b, label="Tree") for b in ann.boxes))
        with Image.open(photo) as opened:
            image = opened.convert("RGB")
        if image.size != (ann.width, ann.height):
            raise AnnotationFileError(f"{photo} is {image.size[0]}x{image.size[1]} but its XML "
                                      f"says {ann.width}x{ann.height}")
        for top in tile_starts(ann.height, args.tile, args.overlap):
            for left in tile_starts(ann.width, args.tile, args.overlap):
                w, h = min(args.tile, ann.width), min(args.tile, ann.height)
                boxes = boxes_in_tile(ann.boxes, left, top, w, h, args.min_visible)
                if args.drop_empty and not boxes:
                    continue
                name = f"{photo.stem}_x{left}_y{top}{suffix}"
                image.crop((left, top, left + w, top + h)).save(
                    out / split / "images" / name, quality=95)
                builders[split].add_image(name, w, h, boxes, source=photo.name,
                                          tile_origin=[left, top])
    for split, builder in builders.items():
        builder.write(out / split / "annotations.json")
        print(f"{split}: {len(builder.images)} tiles, {len(builder.annotations)} boxes "
              f"-> {out / split}")
    return 0
