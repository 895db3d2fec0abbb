"""The doctor's step profiler under whatever a script wraps around ``optimizer.step``: every
LR scheduler of torch, AMP's GradScaler, gradient clipping; and ``ringtrain doctor`` in script
mode on the repository's examples (which use LR schedulers)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from torch.optim import lr_scheduler

from tests.data.images import make_folder

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RINGTRAIN_", "HOROVOD_"))}
    env["PYTHONPATH"] = str(ROOT)
    # One intra-op thread per process, as `ringtrain run` gives each of 2 ranks on 2 cores: a
    # lone process would start one per core and, beside the other tests, spin them on busy
    # cores (the steps profiled here are checked for their structure, not their speed).
    env["OMP_NUM_THREADS"] = "1"
    return env


def test_every_scheduler_grad_scaler_and_clipping_step_through_the_profiler():
    result = subprocess.run([sys.executable, str(ROOT / "tests/integration/scripts/"
                                                 "wrapped_steps.py")],
                            capture_output=True, text=True, timeout=240, env=_env(), check=False)
    assert result.returncode == 0, result.stderr
    cases = {c["case"]: c for c in map(json.loads, result.stdout.splitlines())}
    schedulers = {name for name, obj in vars(lr_scheduler).items()
                  if isinstance(obj, type) and issubclass(obj, lr_scheduler.LRScheduler)
                  and obj is not lr_scheduler.LRScheduler and not name.startswith("_")
                  and name != "SWALR"}
    assert schedulers <= set(cases), f"not tried: {schedulers - set(cases)}"
    for name, case in cases.items():
        assert case["records"] == case["steps"], case  # every step reached the profiler
        if name in schedulers:
            assert len(set(case["lrs"])) > 1, f"{name} did not change the learning rate"


def _doctor(script_args: list[str], tmp_path: Path, np: int | None) -> dict:
    launch = ["-np", str(np)] if np else []
    result = subprocess.run(
        [sys.executable, "-m", "ringtrain.cli", "doctor", *launch, "--steps", "2", "--warmup",
         "1", "--repeats", "1", "--work-dir", str(tmp_path / "doc"), "-o", "json", "--",
         sys.executable, *script_args], cwd=tmp_path, env=_env(), capture_output=True,
        text=True, timeout=400, check=False)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    # the script's own output passes through: the report is the line with the trials
    return json.loads(next(x for x in result.stdout.splitlines()
                           if x.startswith("{") and '"trials"' in x))


@pytest.mark.slow
def test_doctor_profiles_the_cifar_example_with_its_scheduler_on_two_ranks(tmp_path):
    report = _doctor([str(EXAMPLES / "cifar_cnn.py"), "--epochs", "1", "--limit-train", "256",
                      "--limit-val", "64", "--batch-size", "16", "--output-dir",
                      str(tmp_path / "out")], tmp_path, 2)
    assert report["ranks"] == 2 and all(t["images_per_second"] > 0 for t in report["trials"])


# The suite profiles the main example; the other three (ResNets on folders and synthetic data,
# a process start and two trials each) are in the quality tier with the long training runs.
LONG = pytest.mark.quality


@pytest.mark.slow
@pytest.mark.parametrize("example", ["fashion_mnist", pytest.param("resnet_folder", marks=LONG),
                                     pytest.param("imagenet_resnet", marks=LONG),
                                     pytest.param("pytorch_synthetic_benchmark", marks=LONG)])
def test_doctor_profiles_each_example(example, tmp_path):
    folder = tmp_path / "folder"
    make_folder(folder / "train", classes=2, per_class=8, width=40, height=40)
    make_folder(folder / "val", classes=2, per_class=2, width=40, height=40)
    out = str(tmp_path / "out")
    args = {
        "fashion_mnist": ["--epochs", "1", "--limit-train", "256", "--limit-test", "64",
                          "--batch-size", "16", "--output-dir", out],
        "resnet_folder": ["--data", str(folder), "--epochs", "1", "--image-size", "32",
                          "--batch-size", "4", "--workers", "0", "--output-dir", out],
        "imagenet_resnet": ["--data", str(folder / "train"), "--batch-size", "4", "--size",
                            "32", "--steps", "6", "--output-dir", out],
        "pytorch_synthetic_benchmark": ["--model", "resnet18", "--image-size", "32",
                                        "--num-classes", "10", "--batch-size", "4",
                                        "--num-warmup-batches", "1", "--num-batches-per-iter",
                                        "2", "--num-iters", "3", "--no-cuda"],
    }[example]
    report = _doctor([str(EXAMPLES / f"{example}.py"), *args], tmp_path, None)
    assert report["trials"] and all(t["breakdown_ms"]["step"] > 0 for t in report["trials"])


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("deepforest") is None,
                    reason="the deepforest wheel is not installed")
def test_doctor_profiles_the_retinanet_example(tmp_path):
    from ringtrain.data.cli import main as data_main

    data = tmp_path / "trees"
    assert data_main(["deepforest-coco", str(data), "--format", "jpeg", "--val", "OSBS_029"]) == 0
    # 2 epochs of 2 steps: 2 measured after the warm-up, the fewest a single run needs.
    report = _doctor([str(EXAMPLES / "retinanet_coco.py"), "--data", str(data), "--epochs", "2",
                      "--limit-train", "4", "--image-size", "96", "--output-dir",
                      str(tmp_path / "out")], tmp_path, None)
    assert report["trials"] and all(t["breakdown_ms"]["step"] > 0 for t in report["trials"])


@pytest.mark.slow
def test_doctor_profiles_the_horovod_example_under_its_own_launcher(tmp_path):
    report = _doctor(["-m", "ringtrain.cli", "run", "--horovod-compat", "-np", "1",
                      sys.executable, str(EXAMPLES / "horovod_mnist.py"), "--limit", "512",
                      "--epochs", "1"], tmp_path, None)
    assert report["rate_unit"] == "img/s" and report["trials"][-1]["images_per_second"] > 0
