"""Transfer progress as a log line: files and bytes done, rate, time left."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover - the loop returns at GB


class Progress:
    """Counts one transfer's files and bytes and writes a line at most every ``interval_s``.

    Thread-safe: the transfer's workers report into one instance. :attr:`last_change` is when
    a byte last moved, which the caller's stall check reads.
    """

    def __init__(self, label: str, files: int, total_bytes: int, write: Callable[[str], None],
                 interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self.label = label
        self.files_total = files
        self.bytes_total = total_bytes
        self.files = 0
        self.bytes = 0
        self._write = write
        self._interval = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._started = clock()
        self._printed = float("-inf")
        self.last_change = self._started

    def add(self, files: int = 0, nbytes: int = 0) -> None:
        with self._lock:
            self.files += files
            self.bytes += nbytes
            now = self._clock()
            if nbytes or files:
                self.last_change = now
            if now - self._printed < self._interval:
                return
            self._printed = now
            line = self.line(now)
        self._write(line)

    def line(self, now: float | None = None) -> str:
        now = self._clock() if now is None else now
        took = max(now - self._started, 1e-6)
        rate = self.bytes / took
        left = (self.bytes_total - self.bytes) / rate if rate > 0 else float("inf")
        eta = f"{left:.0f} s left" if left != float("inf") else "time left unknown"
        if self.files == self.files_total and self.bytes >= self.bytes_total:
            eta = f"done in {took:.1f} s"
        return (f"{self.label}: {self.files:,}/{self.files_total:,} files, "
                f"{human_bytes(self.bytes)}/{human_bytes(self.bytes_total)}, "
                f"{human_bytes(rate)}/s, {eta}")

    def finish(self) -> None:
        """Write the final line."""
        self._write(self.line())
