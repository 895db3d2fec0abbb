"""Waiting for an event in a test: poll a condition, with a bound that only stops a hang.

The bound is no speed goal (those live in ``benchmarks/``): it is generous, and reaching it fails
the test naming what never happened. Importable from worker processes and scripts that tests
start with the repository on ``sys.path``.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], what: str, timeout_s: float = 60.0,
               every_s: float = 0.02) -> T:
    """Poll ``condition`` until it returns something truthy, and return that.

    Raises:
        AssertionError: it did not within ``timeout_s`` (the message names ``what``).
    """
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s:g} s"
        time.sleep(every_s)
    return value


def stop_process(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """SIGTERM ``proc`` (a server's clean stop), SIGKILL it if it is still there after
    ``timeout_s``, and reap it."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout_s)
