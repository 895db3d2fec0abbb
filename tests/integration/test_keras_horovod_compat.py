"""Horovod's Keras scripts under ``ringtrain run --horovod-compat``: keras imported before
``horovod.keras`` gets the torch backend, and the ImageNet example's resume (rank 0 loads the
checkpoint, the resume epoch is broadcast) runs on two ranks; without the flag, a rank that dies
for want of TensorFlow gets a hint naming KERAS_BACKEND."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ringtrain.keras")  # keras on torch, or skip
from ringtrain.runner.plan import horovod_compat_environ

SCRIPT = Path(__file__).resolve().parent / "horovod_scripts" / "keras_resume.py"
ROOT = Path(__file__).resolve().parents[2]
RINGTRAIN = str(Path(sys.executable).with_name("ringtrain"))
_LAUNCHER_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                   "MASTER_PORT", "PYTHONPATH"}


def _env(tmp_path: Path) -> dict[str, str]:
    """No KERAS_BACKEND (importing ringtrain.keras set it in this process) and a Keras home
    without a keras.json: Keras' own default backend, TensorFlow, is what a script meets."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HOROVOD_", "RINGTRAIN_", "KERAS_")) and k not in _LAUNCHER_NAMES}
    return env | {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
                  "KERAS_HOME": str(tmp_path / "keras_home"), "PYTHONPATH": str(ROOT)}


def _run(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([RINGTRAIN, "run", *argv], capture_output=True, text=True,
                          timeout=300, env=_env(tmp_path), check=False)


def _reports(result: subprocess.CompletedProcess) -> list[dict]:
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    lines = [line.partition("]<stdout>:")[2] for line in result.stdout.splitlines()]
    return sorted((json.loads(line) for line in lines if line.startswith("{")),
                  key=lambda r: r["rank"])


def test_horovod_keras_example_resumes_from_rank_0s_checkpoint(tmp_path):
    def train(epochs: int) -> list[dict]:
        return _reports(_run(tmp_path, "--horovod-compat", "-np", "2", sys.executable,
                             str(SCRIPT), "--checkpoint-dir", str(tmp_path), "--epochs",
                             str(epochs)))

    first = train(1)
    assert [r["backend"] for r in first] == ["torch", "torch"]  # set by --horovod-compat
    assert (tmp_path / "checkpoint-1.keras").is_file()
    resumed = train(2)
    for report in resumed:
        # a scalar broadcast comes back a scalar, usable as fit's initial_epoch
        assert (report["resume_from_epoch"], report["resume_shape"]) == (1, [])
        assert report["epochs"] == [1]
        assert report["iterations"] == 8  # 4 steps saved, 4 more from rank 0's state
    # rank 0's loaded model and rank 1's fresh one were paired and made equal
    assert resumed[0]["weights"] == resumed[1]["weights"] != first[0]["weights"]


def test_compat_sets_keras_backend_only_when_unset():
    assert horovod_compat_environ({})["KERAS_BACKEND"] == "torch"
    assert "KERAS_BACKEND" not in horovod_compat_environ({"KERAS_BACKEND": "jax"})


def test_a_rank_without_tensorflow_gets_the_keras_backend_hint(tmp_path):
    try:
        import tensorflow  # noqa: F401
        pytest.skip("tensorflow is installed: Keras' default backend imports")
    except ImportError:
        pass
    script = tmp_path / "train.py"
    script.write_text("import keras\nimport ringtrain.keras as hvd\n")
    result = _run(tmp_path, "-np", "1", sys.executable, str(script))
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert "rank 0 on localhost failed" in last and "KERAS_BACKEND=torch" in last, last
