"""How far a running job has got: its latest step, its step rate and, when it says how many
steps it will take, when it should end (the jobs list's *Progress* column).

Read from the files its curves come from (:mod:`ringtrain.jobs.service.monitor.scalars`):

- the step profiler's ``metrics/steps.rank<N>.jsonl`` (each record's ``step`` and ``time``);
- TensorBoard event files under ``outputs/`` (each scalar's step and wall time).

The job's *step* is the largest step seen in any of them; its *rate* is that file's steps per
second of the points' own wall times over the last :data:`RATE_WINDOW_S` (so it does not depend
on how often anyone looks). A job says its total in either format, and only then gets an ETA:

- a scalar tagged :data:`TOTAL_TAG` (``writer.add_scalar("total_steps", 10_000, 0)``), or
- a ``total_steps`` field in a step profiler record (``profiler.note(total_steps=10_000)``).

The jobs list asks for every running job every few seconds, so a look must stay cheap however
much a job wrote: each file is read only when its size or modification time changed since the
last look, and then only from where the last read stopped (never again from the start); new
files are looked for every :data:`SCAN_EVERY_S` (on every look until one is found) among at most
:data:`MAX_SCAN_ENTRIES` entries; one look reads at most :data:`MAX_READS_PER_LOOK` files; and
only running jobs are followed (:class:`ProgressCache` forgets the others).
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from ringtrain.jobs.files.safe_open import open_regular
from ringtrain.jobs.service.monitor.scalars import StepsFileReader, scalar_files
from ringtrain.jobs.service.monitor.tfevents import EventFileReader

#: The scalar tag (or step profiler field) by which a job says how many steps it will take.
TOTAL_TAG = "total_steps"
#: Seconds of the newest points the step rate is measured over.
RATE_WINDOW_S = 60.0
#: Seconds between looks for new files (known files are looked at on every call).
SCAN_EVERY_S = 10.0
#: Entries of ``outputs/`` looked at per scan, and files followed per job.
MAX_SCAN_ENTRIES = 2_000
MAX_FILES = 256
#: Files read per look at most (each read takes at most 8 MiB): the others wait their turn.
MAX_READS_PER_LOOK = 32

Point = tuple[str, int, float, float]  # (tag, step, wall_time, value)


@dataclass
class _Source:
    """One file, its incremental reader and what it said so far."""

    relpath: str
    reader: EventFileReader | StepsFileReader
    seen: tuple[int, int] | None = None  # (size, mtime_ns) at the last read
    step: int = -1
    total: float | None = None
    history: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=10_000))

    def read(self) -> None:
        """Take in the points written since the last read."""
        points: list[Point]
        if isinstance(self.reader, StepsFileReader):
            points = self.reader.read()
        else:
            points = [(s.tag, s.step, s.wall_time, s.value) for s in self.reader.read()]
        for tag, step, wall, value in points:
            if tag == TOTAL_TAG:
                self.total = value
            elif step > self.step:
                self.step = step
                self.history.append((wall, step))
        while self.history and self.history[-1][0] - self.history[0][0] > RATE_WINDOW_S:
            self.history.popleft()

    def rate(self) -> float | None:
        if len(self.history) < 2:
            return None
        (w0, s0), (w1, s1) = self.history[0], self.history[-1]
        return (s1 - s0) / (w1 - w0) if w1 > w0 and s1 > s0 else None


class JobProgress:
    """The progress of one job's folder, read as it grows (``clock``: seconds, for spacing the
    scans for new files)."""

    def __init__(self, job_dir: Path, clock: Callable[[], float] = time.monotonic):
        self.job_dir = job_dir
        self.clock = clock
        #: files read since made (a file unchanged since its last read is not read again)
        self.reads = 0
        self._sources: dict[str, _Source] = {}
        self._scanned_at: float | None = None
        self._next = 0  # the file the next call reads first
        self._lock = threading.Lock()

    def read(self) -> dict[str, Any] | None:
        """Read what changed, then the job's progress: ``None`` before any step was logged,
        else ``{"step", "steps_per_s", "total_steps", "eta_s", "source"}``: the largest step,
        its file's rate (``None`` until two steps have different times), the total the job
        declared and the seconds left at that rate (both ``None`` without a total), and the file
        (relative to the job's folder)."""
        with self._lock:
            now = self.clock()
            # A job that has written nothing yet is looked at on every call: its first point
            # should not wait for the next scan.
            if (not self._sources or self._scanned_at is None
                    or now - self._scanned_at >= SCAN_EVERY_S):
                self._scanned_at = now
                self._scan()
            # At most MAX_READS_PER_LOOK files are read per call, taking turns: a job with many
            # long files seen for the first time catches up over several calls, not one.
            sources = list(self._sources.values())
            order = sources[self._next:] + sources[:self._next]
            read = 0
            for i, source in enumerate(order):
                if read >= MAX_READS_PER_LOOK:
                    self._next = (self._next + i) % len(sources)
                    break
                read += self._refresh(source)
            return self._summary()

    def _refresh(self, source: _Source) -> bool:
        """Read ``source`` if it changed since its last read; whether it was read."""
        try:
            st = os.stat(self.job_dir / source.relpath, follow_symlinks=False)
        except OSError:
            return False
        if not stat.S_ISREG(st.st_mode) or source.seen == (st.st_size, st.st_mtime_ns):
            return False
        self.reads += 1
        source.read()
        # Only whole records are taken: a file read mid-record (or past what one read takes) is
        # read again next time even if it has not changed meanwhile.
        source.seen = (st.st_size, st.st_mtime_ns) if source.reader.offset >= st.st_size else None
        return True

    def _summary(self) -> dict[str, Any] | None:
        stepped = [s for s in self._sources.values() if s.step >= 0]
        if not stepped:
            return None
        lead = max(stepped, key=lambda s: (s.step, s.rate() or 0.0))
        totals = [s.total for s in self._sources.values() if s.total is not None and s.total > 0]
        total = int(max(totals)) if totals else None
        rate = lead.rate()
        eta = None
        if total is not None and rate:
            eta = round(max(0, total - lead.step) / rate, 1)
        return {"step": lead.step, "steps_per_s": None if rate is None else round(rate, 3),
                "total_steps": total, "eta_s": eta, "source": lead.relpath}

    def _scan(self) -> None:
        for relpath, rank in scalar_files(self.job_dir, MAX_SCAN_ENTRIES):
            self._follow(relpath, rank)

    def _follow(self, relpath: str, rank: int | None) -> None:
        if relpath in self._sources or len(self._sources) >= MAX_FILES:
            return
        reader: EventFileReader | StepsFileReader
        if rank is not None:
            reader = StepsFileReader(self.job_dir, relpath, rank, keys=("step_ms", TOTAL_TAG))
        else:
            reader = EventFileReader(self.job_dir / relpath,
                                     partial(open_regular, self.job_dir, relpath))
        self._sources[relpath] = _Source(relpath, reader)


class ProgressCache:
    """The progress of the running jobs, each followed from its first look until it stops
    running; one answer is served for ``max_age_s`` however many pages ask."""

    def __init__(self, max_age_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self.max_age_s = max_age_s
        self.clock = clock
        self._jobs: dict[str, JobProgress] = {}
        self._last: dict[str, dict[str, Any]] = {}
        self._taken: float | None = None
        self._lock = threading.Lock()

    def sample(self, running: Mapping[str, Path]) -> dict[str, dict[str, Any]]:
        """``{job id: progress}`` (see :meth:`JobProgress.read`) of the jobs in ``running``
        (id to folder) that logged a step; jobs no longer given are forgotten."""
        with self._lock:
            now = self.clock()
            if (self._taken is not None and now - self._taken < self.max_age_s
                    and set(self._jobs) == set(running)):
                return self._last
            for job_id in set(self._jobs) - set(running):
                del self._jobs[job_id]
            out = {}
            for job_id, job_dir in running.items():
                job = self._jobs.get(job_id)
                if job is None or job.job_dir != job_dir:
                    job = self._jobs[job_id] = JobProgress(job_dir, self.clock)
                progress = job.read()
                if progress is not None:
                    out[job_id] = progress
            self._last, self._taken = out, now
            return out
