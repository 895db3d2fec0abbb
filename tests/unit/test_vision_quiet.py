"""torchvision's compiled operators failing to load is handled (a pure-PyTorch NMS): it is said
once, at debug level, never at the info level a server logs at."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent("""
    import logging, sys
    logging.basicConfig(level=getattr(logging, sys.argv[1]), format="%(levelname)s %(message)s")
    from ringtrain.models.vision import load_torchvision
    load_torchvision()
    load_torchvision()
""")


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None,
                    reason="torchvision is not installed")
def test_the_fallback_is_silent_at_info_and_said_once_at_debug():
    def run(level: str) -> str:
        out = subprocess.run([sys.executable, "-c", _SCRIPT, level], capture_output=True,
                             text=True, timeout=120, check=False)
        assert out.returncode == 0, out.stderr
        return out.stderr

    assert "torchvision" not in run("INFO")
    assert run("DEBUG").count("compiled operators do not load") <= 1
