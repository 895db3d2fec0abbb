"""A rank that dies of `ModuleNotFoundError: No module named 'horovod'` gets the fix in the
launcher's root-cause line: `--horovod-compat`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ringtrain.runner.agent import failure_hint

ROOT = Path(__file__).resolve().parents[2]


def test_only_a_missing_horovod_gets_the_hint():
    assert "--horovod-compat" in failure_hint(
        ["Traceback (most recent call last):", "ModuleNotFoundError: No module named 'horovod'"])
    assert "--horovod-compat" in failure_hint(
        ["ModuleNotFoundError: No module named 'horovod.torch'"])
    assert failure_hint(["ModuleNotFoundError: No module named 'numpyx'"]) is None
    assert failure_hint(["print('No module named horovod')"]) is None


def test_the_launcher_suggests_horovod_compat(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import horovod.torch as hvd\nhvd.init()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RINGTRAIN_", "HOROVOD_"))}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run([sys.executable, "-m", "ringtrain.cli", "run", "-np", "1",
                             sys.executable, str(script)], env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert "rank 0 on localhost failed" in last and "ringtrain run --horovod-compat" in last
