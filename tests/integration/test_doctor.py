"""`ringtrain doctor` end to end on 2 Gloo ranks, `ringtrain data photos`, and the ImageNet
example on tiny data."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.data.images import make_folder

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], cwd: Path, timeout: float = 280) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RINGTRAIN_", "HOROVOD_"))}
    env["PYTHONPATH"] = str(ROOT)
    # One intra-op thread for a script or example run as one process, as `ringtrain run` gives
    # each of 2 ranks on 2 cores: one per core would spin on cores the other tests keep busy.
    # (A FOLDER's trials set their own threads: training_threads.)
    env["OMP_NUM_THREADS"] = "1"
    result = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=timeout, check=False)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


@pytest.mark.slow
def test_doctor_on_two_ranks_measures_advises_and_draws(tmp_path):
    folder = make_folder(tmp_path / "train", classes=2, per_class=16, width=160, height=128)
    out = _run(["-m", "ringtrain.cli", "doctor", "-np", "2", str(folder), "--model",
                "small-cnn", "--size", "32", "--batch-size", "4", "--steps", "3", "--warmup",
                "1", "--work-dir", str(tmp_path / "doc"), "-o", "json"], tmp_path)
    line = next(x for x in out.stdout.splitlines() if "{" in x)
    report = json.loads(line[line.index("{"):])
    names = [t["name"] for t in report["trials"]]
    assert names[:2] == ["synthetic", "torchvision"] and report["ranks"] == 2
    for trial in report["trials"]:
        assert trial["images_per_second"] > 0 and len(trial["step_ms_per_rank"]) == 2
        phases = sum(v for k, v in trial["breakdown_ms"].items() if k != "step")
        assert abs(phases - trial["breakdown_ms"]["step"]) < 0.01 * trial["breakdown_ms"]["step"]
    assert report["advice"] and all(a["message"] for a in report["advice"])
    tried = {a["tried"] for a in report["advice"]} - {None}
    assert tried <= set(names)
    assert (tmp_path / "doc" / "breakdown.png").read_bytes()[:4] == b"\x89PNG"


def test_doctor_runs_the_quick_check_by_default_and_prints_the_full_one(tmp_path):
    """The default: a sample of the images (what one trial reads: 12 steps of 4), at most 10
    measured steps per trial, and the command of the full check, on stdout and stderr."""
    folder = make_folder(tmp_path / "train", classes=2, per_class=40, width=64, height=64)
    out = _run(["-m", "ringtrain.cli", "doctor", str(folder), "--size", "32", "--batch-size",
                "4", "--work-dir", str(tmp_path / "doc")], tmp_path)
    full = f"ringtrain doctor --full {folder} --size 32 --batch-size 4 --work-dir"
    assert "quick check: 48 of 80 images, at most 10 measured steps per trial" in out.stderr
    assert full in out.stderr
    lines = out.stdout.splitlines()
    summary = next(x for x in lines if x.startswith("quick check (bounded to 90 s): "))
    assert "48 of 80 images (a random sample)" in summary
    trials = [x.rsplit(" ", 1) for x in summary.split("(at most 10): ")[1].split(";")[0]
              .split(", ")]
    assert [name for name, _ in trials[:3]] == ["synthetic", "torchvision", "synthetic (again)"]
    assert all(3 <= int(steps) <= 10 for _, steps in trials)
    assert any(full in x for x in lines if x.startswith("for the full check"))


def test_a_spent_budget_measures_the_fewest_steps_and_tries_no_fix(tmp_path):
    """A budget shorter than the report's reserve is spent before the first trial: the three
    trials of the verdict keep 3 measured steps each, and every fix is advised untried."""
    folder = make_folder(tmp_path / "train", classes=2, per_class=40, width=64, height=64)
    out = _run(["-m", "ringtrain.cli", "doctor", str(folder), "--size", "32", "--batch-size",
                "4", "--budget", "1", "--work-dir", str(tmp_path / "doc"), "-o", "json"],
               tmp_path)
    report = json.loads(next(x for x in out.stdout.splitlines() if x.startswith("{")))
    assert [t["name"] for t in report["trials"]] == ["synthetic", "torchvision",
                                                     "synthetic (again)"]
    assert [t["measured_steps"] for t in report["trials"]] == [3, 3, 3]
    fixes = [a for a in report["advice"] if "ringtrain data pack" in a["message"]
             or "decode with ringtrain.data" in a["message"]]
    assert all(a["tried"] is None for a in report["advice"])
    assert len(report["check"]["not_tried"]) == len(fixes)
    assert set(report["check"]["not_tried"]) <= {"packed", "ringtrain folder"}
    assert report["check"]["budget_s"] == 1 and report["check"]["images"] == 48


def test_doctor_refuses_a_missing_folder(tmp_path):
    result = subprocess.run([sys.executable, "-m", "ringtrain.cli", "doctor",
                             str(tmp_path / "nope")], capture_output=True, text=True, check=False,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert result.returncode == 2 and "not a folder" in result.stderr


@pytest.mark.skipif(importlib.util.find_spec("deepforest") is None,
                    reason="the deepforest wheel is not installed")
def test_photos_command_writes_jpeg_crops_of_real_photographs(tmp_path):
    _run(["-m", "ringtrain.cli", "data", "photos", str(tmp_path / "p"), "--count", "12",
          "--size", "64x48"], tmp_path)
    files = sorted((tmp_path / "p" / "train").rglob("*.jpg"))
    assert len(files) == 12 and len({f.parent for f in files}) >= 2
    from PIL import Image

    assert Image.open(files[0]).size == (64, 48)
    assert len(list((tmp_path / "p" / "val").rglob("*.jpg"))) == 1


def test_imagenet_example_trains_on_image_files(tmp_path):
    folder = make_folder(tmp_path / "train", classes=2, per_class=4)
    out = _run([str(ROOT / "examples" / "imagenet_resnet.py"), "--data", str(folder),
                "--batch-size", "4", "--size", "32", "--steps", "3", "--output-dir",
                str(tmp_path / "model")], tmp_path)
    epoch = json.loads(out.stdout.strip().splitlines()[-1])
    assert epoch["img_per_s"] > 0 and epoch["step_breakdown_ms"]["forward_backward_ms"] > 0
    from ringtrain.models.saved import load_model

    model, info = load_model(tmp_path / "model")  # servable: model.pt + model.json
    assert len(info.classes) == 2 and model(torch.zeros(1, *info.input_shape)).shape == (1, 2)


@pytest.mark.slow
def test_doctor_profiles_an_unchanged_script_on_two_ranks(tmp_path):
    """The script only uses DataLoader + DistributedOptimizer; the doctor stops it after
    warm-up + steps, and its synthetic run feeds the first batch again (no data wait)."""
    script = ROOT / "tests" / "integration" / "scripts" / "loader_train.py"
    # One run a trial (its noise from windows of its steps), and a loader slow enough that its
    # wait stands out of any noise a loaded machine adds.
    out = _run(["-m", "ringtrain.cli", "doctor", "-np", "2", "--steps", "4", "--warmup", "1",
                "--repeats", "1", "--work-dir", str(tmp_path / "doc"), "-o", "json", "--",
                sys.executable, str(script), "--item-ms", "20", "--workers", "1", "--epochs",
                "50"], tmp_path)
    assert '"steps":' not in out.stdout  # stopped by the doctor, long before its 50 epochs
    report = json.loads(next(x for x in out.stdout.splitlines() if x.startswith("{")))
    synthetic, real = report["trials"]
    assert (synthetic["name"], real["name"], report["ranks"]) == ("synthetic", "real", 2)
    assert report["rate_unit"] == "img/s" and real["workers"] == 1
    for trial in (synthetic, real):
        assert trial["images_per_second"] > 0 and len(trial["step_ms_per_rank"]) == 2
        phases = sum(v for k, v in trial["breakdown_ms"].items() if k != "step")
        assert abs(phases - trial["breakdown_ms"]["step"]) < 0.01 * trial["breakdown_ms"]["step"]
        assert trial["breakdown_ms"]["forward_backward"] > 0
        assert trial["breakdown_ms"]["communication"] > 0
    # A batch of 8 items of 20 ms each from one worker: ~160 ms per batch to wait for.
    assert real["breakdown_ms"]["data"] > 10 > synthetic["breakdown_ms"]["data"]
    assert real["images_per_second"] < synthetic["images_per_second"]
    assert "data wait" in report["advice"][0]["message"]
    for trial in ("synthetic", "real"):
        for rank in (0, 1):
            lines = (tmp_path / "doc" / trial / "run1" / f"steps.rank{rank}.jsonl"
                     ).read_text().splitlines()
            assert len(lines) == 5 and json.loads(lines[-1])["samples"] == 8
    assert (tmp_path / "doc" / "breakdown.png").read_bytes()[:4] == b"\x89PNG"


def test_doctor_says_when_a_script_trains_no_visible_step(tmp_path):
    script = tmp_path / "no_optimizer.py"
    script.write_text("print('trained nothing')\n")
    result = subprocess.run([sys.executable, "-m", "ringtrain.cli", "doctor", "--work-dir",
                             str(tmp_path / "doc"), "--", sys.executable, str(script)],
                            capture_output=True, text=True, check=False, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 1 and "DistributedOptimizer" in result.stderr


def test_doctor_sees_batches_iterated_through_profiled_batches(tmp_path):
    """One process, batches from a generator (no DataLoader) through ``profiled_batches``: the
    synthetic run reuses the first batch, the real one waits for each."""
    script = ROOT / "tests" / "integration" / "scripts" / "loader_train.py"
    out = _run(["-m", "ringtrain.cli", "doctor", "--steps", "3", "--warmup", "1", "--repeats",
                "1", "--work-dir", str(tmp_path / "doc"), "-o", "json", "--", sys.executable,
                str(script), "--item-ms", "3", "--generator", "--epochs", "50"], tmp_path)
    report = json.loads(next(x for x in out.stdout.splitlines() if x.startswith("{")))
    synthetic, real = report["trials"]
    assert synthetic["workers"] is None and report["ranks"] == 1
    assert real["breakdown_ms"]["data"] > 20 and synthetic["breakdown_ms"]["data"] < 5


@pytest.mark.slow
def test_doctor_breaks_down_the_steps_of_an_unmodified_horovod_script(tmp_path):
    """`import horovod.torch as hvd`, DistributedOptimizer, batches made inline: no edits, the
    doctor launches it through the user's own `ringtrain run` and still gets the phases."""
    script = ROOT / "tests" / "integration" / "horovod_scripts" / "train_horovod.py"
    out = _run(["-m", "ringtrain.cli", "doctor", "--steps", "3", "--warmup", "1", "--repeats",
                "1", "--work-dir", str(tmp_path / "doc"), "-o", "json", "--", sys.executable,
                "-m", "ringtrain.cli",
                "run", "-np", "2", "--horovod-compat", sys.executable, str(script)], tmp_path)
    report = json.loads(next(x for x in out.stdout.splitlines() if x.startswith("{")))
    # batches made inline: the samples come from the model's input, so images/s all the same
    assert report["ranks"] == 2 and report["rate_unit"] == "img/s"
    (real,) = report["trials"]  # no batch seen: nothing synthetic to compare
    assert real["breakdown_ms"]["forward_backward"] > 0
    assert real["breakdown_ms"]["communication"] > 0 and real["breakdown_ms"]["optimizer"] > 0
    assert "profiled_batches" in report["advice"][0]["message"]


def test_doctor_stops_a_script_that_runs_past_its_timeout(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text("import time\ntime.sleep(600)\n")
    result = subprocess.run([sys.executable, "-m", "ringtrain.cli", "doctor", "--timeout", "2",
                             "--work-dir", str(tmp_path / "doc"), "--", sys.executable,
                             str(script)], capture_output=True, text=True, check=False,
                            timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 1 and "--timeout 2 s" in result.stderr
