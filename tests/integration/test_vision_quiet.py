"""torchvision's compiled operators failing to load is handled (a pure-PyTorch NMS): it is said
once, at debug level, never at the info level a server logs at, in a fresh interpreter that
loads torchvision as a server does. (The fast tier checks the same in-process, on a library
that fails to load: tests/unit/test_models_vision.py.)"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import pytest

# One interpreter (it is said once per process; two took ~5 s more of the fast tier) writes
# every log record with its level on stdout, each after a separator (a message may span lines),
# so that what a server logging at INFO would show is told apart from the debug records; stderr
# keeps what no logging level hides (warnings, prints).
_SCRIPT = textwrap.dedent("""
    import logging, sys
    logging.basicConfig(level=logging.DEBUG, stream=sys.stdout,
                        format="\\x1e%(levelname)s %(message)s")
    from ringtrain.models.vision import load_torchvision
    load_torchvision()
    load_torchvision()
""")


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None,
                    reason="torchvision is not installed")
def test_the_fallback_is_silent_at_info_and_said_once_at_debug():
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    records = [record.split(" ", 1) for record in out.stdout.split("\x1e")[1:]]
    at_info = [message for level, message in records if level != "DEBUG"]
    assert "torchvision" not in out.stderr + "\n".join(at_info)
    assert sum("compiled operators do not load" in m for level, m in records
               if level == "DEBUG") <= 1
