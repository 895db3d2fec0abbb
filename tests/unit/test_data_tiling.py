"""Tiling rules and the COCO builder, as pure functions."""

from __future__ import annotations

import pytest

from ringtrain.data.coco_builder import CocoBuilder
from ringtrain.data.tiling import boxes_in_tile, tile_starts
from ringtrain.data.voc import Box


def test_tiles_cover_the_side_and_the_last_one_ends_at_the_edge() -> None:
    assert tile_starts(1035, 400, 50) == [0, 350, 635]
    assert tile_starts(800, 400, 0) == [0, 400]
    assert tile_starts(400, 400, 50) == [0]
    assert tile_starts(300, 400, 50) == [0]


def test_tile_starts_refuses_an_overlap_as_large_as_the_tile() -> None:
    with pytest.raises(ValueError, match="overlap"):
        tile_starts(1000, 400, 400)


def test_a_box_inside_is_shifted_one_mostly_inside_is_clipped_one_mostly_outside_dropped() -> None:
    inside = Box("Tree", 110, 120, 130, 150)
    mostly_in = Box("Tree", 180, 10, 220, 20)  # 20 of 40 px wide inside x < 200: half
    mostly_out = Box("Tree", 190, 30, 230, 40)  # 10 of 40 px inside
    kept = boxes_in_tile([inside, mostly_in, mostly_out], left=100, top=0, width=100,
                         height=200, min_visible=0.5)
    assert kept == [Box("Tree", 10, 120, 30, 150), Box("Tree", 80, 10, 100, 20)]
    assert boxes_in_tile([mostly_in], 100, 0, 100, 200, min_visible=1.0) == []


def test_coco_builder_writes_xywh_boxes_areas_and_one_based_ids() -> None:
    coco = CocoBuilder(["Alive", "Dead"])
    image_id = coco.add_image("a.png", 10, 10, [Box("Dead", 1, 2, 4, 6)], source="p.png")
    data = coco.to_dict()
    assert image_id == 1 and data["images"][0]["source"] == "p.png"
    assert data["annotations"] == [{"id": 1, "image_id": 1, "category_id": 2,
                                    "bbox": [1, 2, 3, 4], "area": 12, "iscrowd": 0}]
    assert [c["name"] for c in data["categories"]] == ["Alive", "Dead"]
    with pytest.raises(ValueError, match="'Live' is not one of the categories"):
        coco.add_image("b.png", 10, 10, [Box("Live", 1, 1, 2, 2)])
