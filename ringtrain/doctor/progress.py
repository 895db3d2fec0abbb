"""The doctor's progress lines: each trial's steps done and an estimate of the time left.

A trial on a CPU can take minutes; without these lines the doctor looked hung.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


class Progress:
    """Writes ``trial NAME: step K/N, ~S s left`` lines to ``out`` (default ``sys.stderr``)
    when ``enabled`` (rank 0 only), at most one per ``every_s`` of a trial besides its first
    and last step."""

    def __init__(self, enabled: bool, every_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic, out: TextIO | None = None):
        self.enabled = enabled
        self.every_s = every_s
        self.clock = clock
        self.out = out
        self._name, self._total, self._started, self._shown = "", 0, 0.0, float("-inf")

    def start(self, name: str, total: int) -> None:
        """A trial of ``total`` steps begins."""
        self._name, self._total = name, total
        self._started = self._shown = self.clock()
        self._write(f"trial {name}: {total} steps")

    def resize(self, total: int) -> None:
        """The current trial now has ``total`` steps (planned after its warm-up)."""
        self._total = total

    def step(self, done: int) -> None:
        """``done`` steps of the current trial are over."""
        now = self.clock()
        if done < self._total and now - self._shown < self.every_s:
            return
        self._shown = now
        left = (now - self._started) / max(done, 1) * (self._total - done)
        self._write(f"trial {self._name}: step {done}/{self._total}, ~{left:.0f} s left"
                    if done < self._total else
                    f"trial {self._name}: done in {now - self._started:.0f} s")

    def _write(self, line: str) -> None:
        if self.enabled:
            print(f"ringtrain doctor: {line}", file=self.out or sys.stderr, flush=True)
