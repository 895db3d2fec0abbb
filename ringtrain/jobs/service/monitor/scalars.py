"""A job's training scalars, gathered from the files its processes write, as they grow.

Two sources, both under the job's folder:

- TensorBoard event files (``*tfevents*``) anywhere below ``outputs/``: one *run* per folder
  holding them (``outputs/tb``, ``outputs/tb/rank1``), one series per run and tag.
- The step profiler's ``metrics/steps.rank<N>.jsonl``: run ``rank N``, one series per phase
  (``step_ms``, ``data_ms``, ``forward_backward_ms``, ``communication_ms``, ...).

Points are kept in one append-only list, so a client asks for what came after the count it
has (its cursor) and never receives a point twice.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from ringtrain.errors import RingtrainError
from ringtrain.jobs.files.safe_open import open_regular
from ringtrain.jobs.job_folder import JobFolder
from ringtrain.jobs.service.monitor.tfevents import EventFileReader

#: Files looked at per scan, so that a job writing millions of outputs cannot stall a request.
MAX_SCAN_ENTRIES = 20_000
#: Points kept per job; past it, new points are dropped (and the response says so).
MAX_POINTS = 500_000
#: Seconds between scans for new files (reads of the files known happen on every refresh).
SCAN_EVERY_S = 1.0
#: A step profiler's file in the job's ``metrics/`` folder; the group is the rank.
STEPS_FILE = re.compile(r"steps\.rank(\d+)\.jsonl")
PHASE_KEYS = ("step_ms", "data_ms", "h2d_ms", "forward_backward_ms", "communication_ms",
              "optimizer_ms", "other_ms")


def scalar_files(job_dir: Path, max_entries: int = MAX_SCAN_ENTRIES
                 ) -> Iterator[tuple[str, int | None]]:
    """The files a job's curves come from, relative to its folder: the TensorBoard event files
    under its outputs (rank ``None``), walked in path order without following links, at most
    ``max_entries`` entries; then the step profiler's files, with their rank."""
    seen = 0
    for top, dirs, files in os.walk(JobFolder(job_dir).outputs):  # never follows links
        dirs.sort()
        for name in sorted(files):
            seen += 1
            if seen > max_entries:
                break
            if "tfevents" in name:
                yield (Path(top) / name).relative_to(job_dir).as_posix(), None
        if seen > max_entries:
            break
    try:
        names = sorted(os.listdir(job_dir / "metrics"))
    except OSError:
        return
    for name in names[:1024]:
        if match := STEPS_FILE.fullmatch(name):
            yield f"metrics/{name}", int(match.group(1))


class StepsFileReader:
    """Reads one ``steps.rank<N>.jsonl`` (``relpath`` in ``job_dir``, written by ``rank``)
    incrementally, whole lines only; ``keys`` are the record's fields returned as series."""

    def __init__(self, job_dir: Path, relpath: str, rank: int,
                 keys: tuple[str, ...] = PHASE_KEYS):
        self.job_dir = job_dir
        self.relpath = relpath
        self.run = f"rank {rank}"
        self.keys = keys
        self.offset = 0

    def read(self) -> list[tuple[str, int, float, float]]:
        """``(key, step, wall_time, value)`` of each wanted field of the lines written since
        the last call (a file not there yet, or no regular file, yields nothing)."""
        try:
            fd = open_regular(self.job_dir, self.relpath)
        except (OSError, RingtrainError):  # not there yet, or made a link, pipe or device
            return []
        try:
            data = os.pread(fd, 4 * 1024 * 1024, self.offset)
        finally:
            os.close(fd)
        end = data.rfind(b"\n") + 1
        self.offset += end
        out = []
        for line in data[:end].splitlines():
            try:
                record = json.loads(line)
                step, wall = int(record["step"]), float(record.get("time", 0.0))
            except (ValueError, KeyError, TypeError):
                continue
            for key in self.keys:
                value = record.get(key)
                if isinstance(value, (int, float)):
                    out.append((key, step, wall, float(value)))
        return out


class JobScalars:
    """The scalars of one job's folder."""

    def __init__(self, job_dir: Path):
        self.job_dir = job_dir
        self.series: list[dict[str, str]] = []  # {"run", "tag"}, indexed by the points
        self.points: list[tuple[int, int, float, float]] = []  # (series, step, wall, value)
        self.truncated = False
        self._index: dict[tuple[str, str], int] = {}
        self._events: dict[str, EventFileReader] = {}  # by path relative to the folder
        self._steps: dict[str, StepsFileReader] = {}
        self._scanned_at = 0.0
        self._lock = threading.Lock()

    def since(self, cursor: int) -> dict[str, Any]:
        """Read what was written, then return the points after ``cursor``: ``{"cursor",
        "series", "points", "truncated"}``, the new cursor, every series (``run``, ``tag``),
        and the new points as ``[series, step, wall_time, value]``."""
        with self._lock:
            self._refresh()
            cursor = max(0, min(cursor, len(self.points)))
            return {"cursor": len(self.points), "series": list(self.series),
                    "points": [list(p) for p in self.points[cursor:]],
                    "truncated": self.truncated}

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._scanned_at >= SCAN_EVERY_S:
            self._scanned_at = now
            self._scan()
        for relpath, reader in self._events.items():
            run = str(Path(relpath).parent)
            for s in reader.read():
                self._add(run, s.tag, s.step, s.wall_time, s.value)
        for steps in self._steps.values():
            for tag, step, wall, value in steps.read():
                self._add(steps.run, tag, step, wall, value)

    def _scan(self) -> None:
        for relpath, rank in scalar_files(self.job_dir):
            if rank is None and relpath not in self._events:
                self._events[relpath] = EventFileReader(
                    self.job_dir / relpath, partial(open_regular, self.job_dir, relpath))
            elif rank is not None and relpath not in self._steps:
                self._steps[relpath] = StepsFileReader(self.job_dir, relpath, rank)

    def _add(self, run: str, tag: str, step: int, wall: float, value: float) -> None:
        if len(self.points) >= MAX_POINTS:
            self.truncated = True
            return
        key = (run, tag)
        index = self._index.get(key)
        if index is None:
            index = self._index[key] = len(self.series)
            self.series.append({"run": run, "tag": tag})
        self.points.append((index, step, wall, value))


class ScalarCache:
    """The :class:`JobScalars` of the ``size`` jobs looked at last."""

    def __init__(self, size: int = 16):
        self.size = size
        self._jobs: OrderedDict[str, JobScalars] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, job_id: str, job_dir: Path) -> JobScalars:
        """The scalars of one job, made on first use."""
        with self._lock:
            found = self._jobs.get(job_id)
            if found is None or found.job_dir != job_dir:
                found = self._jobs[job_id] = JobScalars(job_dir)
            self._jobs.move_to_end(job_id)
            while len(self._jobs) > self.size:
                self._jobs.popitem(last=False)
            return found

    def forget(self, job_id: str) -> None:
        """Drop a job's scalars (it was deleted)."""
        with self._lock:
            self._jobs.pop(job_id, None)
