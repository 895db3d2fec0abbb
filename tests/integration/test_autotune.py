"""`ringtrain run --autotune` on 2 Gloo ranks: the ranks change buckets, cycle time and threads
together, write Horovod's log and a best-settings file that `ringtrain run --config-file` takes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "integration" / "scripts" / "autotune_train.py"

pytest.importorskip("bayes_opt")


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RINGTRAIN_", "HOROVOD_"))}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "ringtrain.cli", "run", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=280, check=False)


def _reports(stdout: str) -> list[dict]:
    return [json.loads(line.split(":", 1)[1]) for line in stdout.splitlines()
            if line.startswith("[") and "<stdout>:{" in line]


def test_autotune_tunes_on_every_rank_alike_and_writes_log_and_best(tmp_path):
    log = tmp_path / "tune.csv"
    result = _run(["-np", "2", "--bucket-mb", "1", "--autotune", "--autotune-log-file", str(log),
                   "--autotune-warmup-samples", "1", "--autotune-steps-per-sample", "2",
                   "--autotune-bayes-opt-max-samples", "5", sys.executable, str(SCRIPT),
                   "--steps", "30"], tmp_path)
    assert result.returncode == 0, result.stderr
    reports = _reports(result.stdout)
    assert len(reports) == 2 and all(r["done"] for r in reports)
    # The same buckets and weights on both ranks: every change happened between the same steps.
    assert reports[0]["bucket_bytes"] == reports[1]["bucket_bytes"]
    assert reports[0]["weight0"] == reports[1]["weight0"]
    lines = log.read_text().splitlines()
    assert lines[0].startswith("hierarchical_allreduce,hierarchical_allgather,cache_enabled,"
                               "cycle_time_ms,tensor_fusion_threshold")
    assert len(lines) == 1 + 5
    first = dict(zip(lines[0].split(","), lines[1].split(",")))
    assert first["tensor_fusion_threshold"] == "1" and float(first["score"]) > 0
    best = tmp_path / "tune.csv.best.yaml"
    assert "best of 5 samples" in result.stderr and str(best) in result.stderr
    # The best settings run as a config file: the ranks start with them and tune nothing.
    again = _run(["-np", "2", "--config-file", str(best), sys.executable, str(SCRIPT),
                  "--steps", "2"], tmp_path)
    assert again.returncode == 0, again.stderr
    rerun = _reports(again.stdout)
    assert [r["bucket_bytes"] for r in rerun] == [reports[0]["bucket_bytes"]] * 2
    assert not any(r["done"] for r in rerun)


def test_autotune_options_without_autotune_are_an_error(tmp_path):
    result = _run(["-np", "1", "--autotune-warmup-samples", "2", sys.executable, "-c", "0"],
                  tmp_path)
    assert result.returncode != 0
    assert "--autotune-warmup-samples given without --autotune" in result.stderr
