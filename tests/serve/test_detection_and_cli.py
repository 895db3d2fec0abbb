"""A detector behind the server (boxes from an uploaded image), and `ringtrain serve` as a
process: it prints its URL, answers, and exits 0 on SIGTERM."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from ringtrain.models.saved import ModelInfo, load_model, save_model
from ringtrain.models.vision import load_torchvision
from ringtrain.serve.config import ServeConfig
from ringtrain.serve.predictor import Predictor
from tests.serve.conftest import running

needs_torchvision = pytest.mark.skipif(load_torchvision() is None, reason="needs torchvision")
# Random weights, every anchor kept: boxes come out whatever the image shows.
TINY_DETECTOR = {"num_classes": 2, "image_size": 64, "fpn_channels": 16, "score_thresh": 0.0,
                 "detections_per_img": 5}


@pytest.fixture(scope="module")
def tiny_detector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ringtrain.models.detection import retinanet_mobilenet_v2

    out = tmp_path_factory.mktemp("detector")
    save_model(out, retinanet_mobilenet_v2(**TINY_DETECTOR),
               ModelInfo(arch="retinanet_mobilenet_v2", task="detection",
                         classes=["Alive", "Dead"], kwargs=TINY_DETECTOR))
    return out


def _jpeg(width: int, height: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height), (40, 120, 40)).save(buf, format="JPEG")
    return buf.getvalue()


@needs_torchvision
def test_the_saved_detector_loads_weights_only_and_answers_boxes(tiny_detector: Path) -> None:
    model, info = load_model(tiny_detector)  # torch.load(weights_only=True) inside
    assert info.task == "detection" and not model.training
    with running(Predictor.load(tiny_detector), ServeConfig()) as c:
        r = c.post("/v2/models/model/image?min_score=0", content=_jpeg(90, 70),
                   headers={"content-type": "image/jpeg"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert (body["width"], body["height"]) == (90, 70) and 0 < len(body["boxes"]) <= 5
        for b in body["boxes"]:
            x1, y1, x2, y2 = b["box"]
            assert b["label"] in ("Alive", "Dead") and 0 <= b["score"] <= 1
            assert 0 <= x1 <= x2 <= 90 and 0 <= y1 <= y2 <= 70
        r = c.post("/v2/models/model/infer", json={"inputs": [{
            "name": "input", "shape": [2, 3, 40, 30], "datatype": "FP32",
            "data": [0.3] * (2 * 3 * 40 * 30)}]})
        assert r.status_code == 200, r.text
        outputs = {o["name"]: o for o in r.json()["outputs"]}
        assert outputs["boxes"]["shape"][1] == 4
        assert set(outputs["batch_index"]["data"]) == {0, 1}


def test_the_command_serves_until_sigterm(tiny_classifier: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("RINGTRAIN_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "ringtrain.cli", "serve", str(tiny_classifier),
                             "--port", "0", "--name", "tiny"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()  # bounded: the process exits on failure, closing stdout
        assert "serving" in line, proc.stderr.read() if proc.poll() is not None else line
        url = line.split(" at ")[1].split()[0]
        assert httpx.get(f"{url}/v2/models/tiny/ready", timeout=10).json() == {"ready": True}
        proc.send_signal(signal.SIGTERM)
        # uvicorn drains, then re-raises the signal so that the status tells how it ended.
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_the_command_says_what_is_wrong_with_a_model(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "ringtrain.cli", "serve", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 2 and "model.pt does not exist" in r.stderr
    started = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "ringtrain.cli", "serve", str(tmp_path),
                        "--max-batch-size", "0"],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 2 and "max batch size 0" in r.stderr
    assert time.monotonic() - started < 120


class _RunsCode:
    """Pickled, it asks whoever loads it to run a shell command (os.system)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple:
        return os.system, (self.command,)


def test_weights_that_run_code_or_ask_for_two_billion_classes_are_refused_in_one_line(
        tiny_classifier: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(tiny_classifier / "model.json", code / "model.json")
    torch.save({"weight": _RunsCode(f"touch {marker}")}, code / "model.pt")
    huge = tmp_path / "huge"
    shutil.copytree(tiny_classifier, huge)
    info = json.loads((huge / "model.json").read_text())
    info["kwargs"]["num_classes"] = 2_000_000_000  # 4 TB of weights, were it built
    (huge / "model.json").write_text(json.dumps(info))
    for folder, says in ((code, "asks to run code when loaded"),
                         (huge, "[3, 512] in the weights, [2000000000, 512] in the model")):
        r = subprocess.run([sys.executable, "-m", "ringtrain.cli", "serve", str(folder),
                            "--port", "0"], capture_output=True, text=True, timeout=120,
                           check=False)
        assert r.returncode == 2 and says in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert not marker.exists()

