"""The examples, run as one process each (``hvd.init()`` without a launcher), on tiny settings."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

import ringtrain.torch as hvd
from ringtrain.data.fashion_mnist import DEFAULT_DATA_DIR

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

_NEEDED = ("init", "size", "rank", "local_rank", "local_size", "allreduce", "DistributedOptimizer",
           "broadcast_parameters", "broadcast_optimizer_state", "Compression", "shutdown")
_missing = [name for name in _NEEDED if not hasattr(hvd, name)]
pytestmark = pytest.mark.skipif(
    bool(_missing), reason=f"ringtrain.torch does not provide {', '.join(_missing)} yet"
)
needs_data = pytest.mark.skipif(
    not (DEFAULT_DATA_DIR / "train-images-idx3-ubyte.gz").exists(),
    reason="Fashion-MNIST not installed: apt-get install dataset-fashion-mnist",
)


#: For an example run as one process: one intra-op thread, as `ringtrain run` gives each of 2
#: ranks on 2 cores (one per core would spin on cores the other tests keep busy).
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def _run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RINGTRAIN_", "HOROVOD_"))}
    result = subprocess.run(
        [sys.executable, *args], check=False, capture_output=True, text=True, timeout=240,
        env={**base, **(env or {})},
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def _json_line(stdout: str) -> dict[str, object]:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, stdout
    return json.loads(lines[0])


def _load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # as when run as a script: the examples' own helpers (training_curves) sit beside them
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    spec.loader.exec_module(module)
    return module


@needs_data
def test_fashion_mnist_trains_checkpoints_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "model-out"
    # The job service passes the output directory as RINGTRAIN_OUTPUT_MODEL.
    result = _run(
        [str(EXAMPLES / "fashion_mnist.py"), "--epochs", "1", "--limit-train", "1024",
         "--limit-test", "500", "--batch-size", "64"],
        env={"RINGTRAIN_OUTPUT_MODEL": str(out), **ONE_THREAD},
    )
    metrics = _json_line(result.stdout)
    assert metrics["world_size"] == 1 and metrics["epochs"] == 1
    assert 0.1 < float(metrics["test_accuracy"]) <= 1.0  # better than chance after 16 steps
    assert "test accuracy" in result.stdout
    checkpoint = torch.load(out / "checkpoint-1.pt")
    assert checkpoint["epoch"] == 1 and "optimizer" in checkpoint
    state = torch.load(out / "model.pt")
    assert set(state) == set(checkpoint["model"])
    assert metrics["model_path"] == str(out / "model.pt")
    from ringtrain.models.saved import load_model

    model, info = load_model(out)  # as `ringtrain serve` loads it
    assert info.arch == "fashion_cnn" and info.classes[9] == "Ankle boot"
    assert model(torch.zeros(2, *info.input_shape)).shape == (2, 10)

    # Its training curves, as the job service's dashboard reads them.
    from ringtrain.jobs.service.monitor.tfevents import EventFileReader

    (events,) = (out / "tb").glob("*tfevents*")
    tags = {s.tag: s for s in EventFileReader(events).read()}
    assert {"train/loss", "train/lr", "train/images_per_s"} <= set(tags)
    assert tags["epoch/test_accuracy"].value == pytest.approx(float(metrics["test_accuracy"]),
                                                              abs=1e-4)


def _two_workers(tmp_path: Path, limit_train: int, limit_test: int) -> dict[str, object]:
    """The example's metrics after 4 epochs on 2 processes of the launcher: each runs
    ceil(4 / 2) = 2 epochs on half the data at twice the rate."""
    result = _run(
        ["-m", "ringtrain.cli", "run", "-np", "2", sys.executable,
         str(EXAMPLES / "fashion_mnist.py"), "--epochs", "4", "--limit-train", str(limit_train),
         "--limit-test", str(limit_test), "--output-dir", str(tmp_path)]
    )
    # The launcher prefixes each line with the rank and stream: keep what follows.
    metrics = _json_line(
        "\n".join(line[line.index("{"):] for line in result.stdout.splitlines() if "{" in line)
    )
    assert metrics["world_size"] == 2 and metrics["epochs"] == 2
    assert metrics["global_batch_size"] == 128 and metrics["lr"] == 2e-3
    assert (tmp_path / "model.pt").exists() and (tmp_path / "checkpoint-2.pt").exists()
    return metrics


@needs_data
def test_fashion_mnist_two_workers_under_the_launcher_scale_epochs_batch_and_rate(
        tmp_path: Path) -> None:
    _two_workers(tmp_path, limit_train=512, limit_test=128)


@needs_data
@pytest.mark.quality
def test_fashion_mnist_two_workers_under_the_launcher_learn(tmp_path: Path) -> None:
    metrics = _two_workers(tmp_path, limit_train=8192, limit_test=2000)
    # 0.745-0.748 measured over two seeds (benchmarks/RESULTS.md, "Quality floors"); chance is 0.1.
    assert float(metrics["test_accuracy"]) >= 0.65, metrics


def test_fashion_mnist_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    example = _load_example("fashion_mnist")
    monkeypatch.delenv("RINGTRAIN_OUTPUT_MODEL", raising=False)
    monkeypatch.delenv("RINGTRAIN_DATA_DIR", raising=False)
    args = example.parse_args([])
    assert args.output_dir == Path("checkpoints") and args.data_dir == DEFAULT_DATA_DIR
    assert not args.no_augment
    monkeypatch.setenv("RINGTRAIN_OUTPUT_MODEL", "/jobs/7/outputs/model")
    monkeypatch.setenv("RINGTRAIN_DATA_DIR", "/data/fm")
    args = example.parse_args([])
    assert args.output_dir == Path("/jobs/7/outputs/model") and args.data_dir == Path("/data/fm")
    args = example.parse_args(["--output-dir", "here", "--data-dir", "there"])
    assert args.output_dir == Path("here") and args.data_dir == Path("there")
    with pytest.raises(SystemExit):
        example.parse_args(["--epochs", "0"])


def test_fashion_mnist_missing_data_fails_with_the_fix(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "fashion_mnist.py"), "--data-dir", str(tmp_path),
         "--output-dir", str(tmp_path / "out")],
        check=False, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode != 0
    assert "apt-get install dataset-fashion-mnist" in result.stderr


def test_synthetic_benchmark_reports_throughput() -> None:
    result = _run(
        [str(EXAMPLES / "pytorch_synthetic_benchmark.py"), "--model", "resnet18",
         "--image-size", "32", "--num-classes", "10", "--batch-size", "4",
         "--num-warmup-batches", "1", "--num-batches-per-iter", "1", "--num-iters", "2",
         "--fp16-allreduce", "--no-cuda"], env=ONE_THREAD
    )
    assert "Img/sec per CPU: " in result.stdout
    assert "Total img/sec on 1 CPU(s): " in result.stdout
    figures = _json_line(result.stdout)
    assert figures["model"] == "resnet18" and figures["world_size"] == 1
    assert float(figures["img_sec_per_device"]) > 0
    assert figures["img_sec_total"] == figures["img_sec_per_device"]
