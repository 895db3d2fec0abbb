"""`ringtrain doctor --forecast` end to end: 1-process measurements, the allreduce probe on 2
ranks, the forecast, and the 2-process check, on a small script that names nothing of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "integration" / "scripts" / "loader_train.py"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RINGTRAIN_", "HOROVOD_"))}
    env["PYTHONPATH"] = str(ROOT)
    return env


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the check runs 2 processes")
def test_forecast_measures_forecasts_and_checks_two_processes(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "ringtrain.cli", "doctor", "--forecast", "2,4", "--per-host",
         "2", "--steps", "4", "--warmup", "1", "--work-dir", str(tmp_path), "-o", "json", "--",
         sys.executable, str(SCRIPT), "--item-ms", "3", "--epochs", "50"],
        env=_env(), capture_output=True, text=True, timeout=560, check=False, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(next(x for x in result.stdout.splitlines() if x.startswith("{")))
    assert report["device"] == "cpu" and report["per_host"] == 2
    # The MLP's gradients: Linear(16, 64) and Linear(64, 3), float32, in one bucket.
    assert sum(b["nbytes"] for b in report["buckets"]) == (16 * 64 + 64 + 64 * 3 + 3) * 4
    # One process on the whole host, and on the share of one of its 2 workers.
    assert set(report["measured"]) == {str(report["cores"]), str(report["cores"] // 2)}
    assert [(p["workers"], p["strategy"]) for p in report["forecast"]] == [
        (n, s) for n in (2, 4) for s in ("ring", "hierarchical", "ps (k=hosts)")]
    # Batches of 8 items made in the training process, 3 ms each: the input pipeline is what
    # the step waits on beside compute, at every size.
    assert all(p["limit"] == "input pipeline" for p in report["forecast"])
    assert len(report["allreduce_samples"]) >= 2
    (check,) = report["checks"]
    assert check["workers"] == 2 and check["measured"] > 0 and check["forecast"] > 0
    assert (tmp_path / "forecast.png").read_bytes()[:4] == b"\x89PNG"


def test_forecast_without_a_command_is_refused(tmp_path):
    result = subprocess.run([sys.executable, "-m", "ringtrain.cli", "doctor", "--forecast", "2",
                             str(tmp_path)], env=_env(), capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 2 and "needs your training command" in result.stderr
