"""The timeline: a Chrome-trace JSON of every tensor's phases (chrome://tracing, Perfetto).

Each tensor name is one row (a trace "thread"); its phases are complete events: negotiation (from
submission until every rank had it), then the operation with its fusion-buffer copies and the
collective nested inside. Round markers are instant events on a row of their own (named
``cycles``, and the events ``CYCLE_START``, as in Horovod, which calls rounds cycles).
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import IO

ROUNDS_ROW = "cycles"


class Timeline:
    """Writes trace events to a file; safe to start and stop from any thread."""

    def __init__(self, rank: int):
        self._rank = rank
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        self._rows: dict[str, int] = {}
        self._mark_rounds = False
        self._first = True
        #: Whether it records (an attribute, not a property: read several times per operation).
        self.active = False

    @property
    def mark_rounds(self) -> bool:
        return self._mark_rounds and self._file is not None

    def start(self, path: str, mark_rounds: bool = False) -> None:
        """Open ``path`` and record from now on (replacing a recording in progress)."""
        self.stop()
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        with self._lock:
            self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in stop()
            self._file.write("[\n")
            self._first = True
            self._rows = {}
            self._mark_rounds = mark_rounds
            self._emit({"name": "process_name", "ph": "M", "pid": self._rank,
                        "args": {"name": f"rank {self._rank}"}})
            self.active = True

    def stop(self) -> None:
        """Finish the JSON document and close the file."""
        with self._lock:
            if self._file is None:
                return
            self.active = False
            self._file.write("\n]\n")
            self._file.close()
            self._file = None

    def span(self, row: str, phase: str, start: float, end: float, **args) -> None:
        """Record ``phase`` of ``row`` between two ``time.monotonic()`` readings."""
        with self._lock:
            if self._file is None:
                return
            event = {"name": phase, "ph": "X", "pid": self._rank, "tid": self._row(row),
                     "ts": _us(start), "dur": max(_us(end) - _us(start), 0)}
            if args:
                event["args"] = args
            self._emit(event)

    def instant(self, row: str, name: str) -> None:
        """Record event ``name`` on ``row`` now."""
        with self._lock:
            if self._file is None:
                return
            self._emit({"name": name, "ph": "i", "s": "t", "pid": self._rank,
                        "tid": self._row(row), "ts": _us(time.monotonic())})

    def _row(self, name: str) -> int:
        tid = self._rows.get(name)
        if tid is None:
            tid = self._rows[name] = len(self._rows) + 1
            self._emit({"name": "thread_name", "ph": "M", "pid": self._rank, "tid": tid,
                        "args": {"name": name}})
        return tid

    def _emit(self, event: dict) -> None:
        assert self._file is not None
        self._file.write(("" if self._first else ",\n") + json.dumps(event))
        self._first = False


def _us(t: float) -> int:
    return int(t * 1e6)
