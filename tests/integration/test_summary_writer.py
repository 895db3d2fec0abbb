"""ringtrain's TensorBoard writer never imports TensorFlow, even where one is installed: a
``tensorflow`` package on the path that records its own import is left alone, and the event file
is written all the same (by tensorboard's stub)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")

ROOT = Path(__file__).resolve().parents[2]
WRITE = """
import sys
from ringtrain.torch.summary_writer import summary_writer
w = summary_writer(sys.argv[1])
w.add_scalar("train/loss", 0.5, 1)
w.close()
print("tensorflow imported" if "tensorflow" in sys.modules else "no tensorflow")
"""


def test_a_writer_leaves_an_installed_tensorflow_alone(tmp_path: Path) -> None:
    fake = tmp_path / "site" / "tensorflow"
    fake.mkdir(parents=True)
    marker = tmp_path / "imported"
    (fake / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                      "raise ImportError('a stand-in, not TensorFlow')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(ROOT)])}
    result = subprocess.run([sys.executable, "-c", WRITE, str(tmp_path / "tb")], env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "no tensorflow" and not marker.exists(), result.stderr
    (events,) = (tmp_path / "tb").glob("*tfevents*")
    assert events.stat().st_size > 0
