"""Cutting a large annotated image into tiles: where the tiles go and which boxes each keeps.

Pure functions over numbers, so the rules are tested apart from any file. A box that crosses a
tile's edge is kept, clipped to the tile, when at least ``min_visible`` of its area lies inside;
otherwise it is dropped from that tile (a neighbouring tile, thanks to the overlap, usually holds
it whole).
"""

from __future__ import annotations

from ringtrain.data.voc import Box


def tile_starts(length: int, tile: int, overlap: int) -> list[int]:
    """The increasing offsets of the tiles along one side, covering ``[0, length)`` with no gap.

    Tiles step by ``tile - overlap`` (pixels shared by neighbours); the last one is moved back to
    end at ``length`` rather than hang off the image, so it may overlap its neighbour by more. A
    side no longer than a tile is one tile (of the side's length).

    Raises:
        ValueError: ``tile`` is not positive or ``overlap`` is outside ``[0, tile)``.
    """
    if tile <= 0 or not 0 <= overlap < tile:
        raise ValueError(f"need tile > 0 and 0 <= overlap < tile, got tile {tile}, "
                         f"overlap {overlap}")
    if length <= tile:
        return [0]
    starts = list(range(0, length - tile, tile - overlap))
    return starts + [length - tile]


def boxes_in_tile(boxes: tuple[Box, ...] | list[Box], left: int, top: int, width: int,
                  height: int, min_visible: float) -> list[Box]:
    """The image's ``boxes`` a tile (its edges in the image) keeps, clipped to ``[0, width] x
    [0, height]`` in the tile's coordinates: those with at least ``min_visible`` of their area
    inside (1.0 keeps only boxes wholly inside).

    Raises:
        ValueError: ``min_visible`` is not in ``(0, 1]``.
    """
    if not 0 < min_visible <= 1:
        raise ValueError(f"min_visible must be in (0, 1], got {min_visible}")
    kept = []
    for box in boxes:
        x1, y1 = max(box.x1 - left, 0), max(box.y1 - top, 0)
        x2, y2 = min(box.x2 - left, width), min(box.y2 - top, height)
        if x2 <= x1 or y2 <= y1:
            continue
        clipped = Box(box.label, x1, y1, x2, y2)
        # A small tolerance so that a box wholly inside (fraction exactly 1) is never lost to
        # rounding of the subtraction above.
        if clipped.area >= min_visible * box.area - 1e-9:
            kept.append(clipped)
    return kept
