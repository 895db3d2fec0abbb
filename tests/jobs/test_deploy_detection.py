"""The README's path from job to endpoint, on a tiny model: submit the detection job (the COCO set
built by its preparation step, one epoch on two tiles at 96 pixels), wait for it, `ringtrain job
deploy` it, send a validation photo tile to the deployed server over loopback, get boxes."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import httpx
import pytest
import yaml

from ringtrain.jobs.home import Home
from ringtrain.models.vision import load_torchvision

from .conftest import CLI

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "retinanet_coco.py"


@pytest.mark.skipif(importlib.util.find_spec("deepforest") is None,
                    reason="needs the deepforest wheel's files")
@pytest.mark.skipif(load_torchvision() is None, reason="needs torchvision")
@pytest.mark.timeout(600)  # three processes import torch and torchvision: minutes on a busy host
def test_train_detection_as_a_job_deploy_it_and_get_boxes(home: Home, cli: CLI,
                                                          tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(EXAMPLE, work)
    shutil.copy(EXAMPLE.with_name("training_curves.py"), work)  # the example's own helper
    spec = tmp_path / "trees.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "trees", "node_count": 1, "working_dir": str(work), "outputs": ["model"],
        "job_preparation": "python -m ringtrain.cli data deepforest-coco data/trees "
                           "--format jpeg --val OSBS_029",
        "command": "python retinanet_coco.py --data data/trees --epochs 1 --limit-train 2 "
                   "--image-size 96 --score-thresh 0.001",
        # One intra-op thread, not one per core: the other tests keep the cores busy.
        "environment": {"OMP_NUM_THREADS": "1"}}))
    assert cli("cluster", "create", "local", "--nodes", "1", "--slots", "1")[0] == 0
    rc, out, err = cli("job", "submit", str(spec), "--cluster", "local", "--follow")
    job_id = out.splitlines()[0]
    assert rc == 0, f"{out}\n{err}"

    rc, out, err = cli("job", "deploy", job_id, "--wait", "300", "-o", "json")
    assert rc == 0, err
    (url,) = json.loads(out)["urls"]
    val = home.share_root / "jobs" / job_id / "wd" / "data" / "trees" / "val"
    tile = next((val / "images").iterdir())
    r = httpx.post(f"{url}/v2/models/model/image", params={"min_score": 0},
                   content=tile.read_bytes(), headers={"Content-Type": "image/jpeg"}, timeout=60)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["width"] == answer["height"] == 400
    assert answer["boxes"], "the detector found no box at all"
    box = answer["boxes"][0]
    assert box["label"] == "Tree" and 0 <= box["score"] <= 1 and len(box["box"]) == 4
