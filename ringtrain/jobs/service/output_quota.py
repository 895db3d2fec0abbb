"""The cap on what a job may leave under ``outputs/``: so many files and bytes, then it fails.

A job that writes without end would fill the share's disk, and every other job's with it. Each
running job's outputs are measured now and then by a thread of the service (never by the
scheduler's tick, which holds the service lock: a walk of a million files takes seconds); past
its cap (the spec's ``max_output_files`` and ``max_output_bytes``, else the service's defaults)
the job is stopped and fails with a message naming the cap.

The walk stops as soon as a cap is passed, never follows a link, and counts regular files by
their size (a sparse file counts at its apparent size: that is what a download would send).
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ringtrain.jobs.job_folder import JobFolder
from ringtrain.jobs.models import JobInfo

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OutputLimits:
    """The service's default caps on one job's outputs (a spec may set its own)."""

    max_files: int = 1_000_000
    max_bytes: int = 100 << 30

    def for_job(self, job: JobInfo) -> tuple[int, int]:
        """The job's caps: its spec's, else these."""
        return (job.spec.max_output_files or self.max_files,
                job.spec.max_output_bytes or self.max_bytes)


DEFAULT_LIMITS = OutputLimits()


def over_cap(outputs: Path, max_files: int, max_bytes: int) -> str | None:
    """Why the files under ``outputs`` pass a cap (a message naming it), or ``None``.

    Stops walking as soon as a cap is passed, so the cost is bounded by the cap.
    """
    files = size = 0
    folders = [str(outputs)]
    while folders:
        try:
            it = os.scandir(folders.pop())
        except OSError:  # removed meanwhile, or not readable: nothing to count there
            continue
        with it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    folders.append(entry.path)
                elif stat.S_ISREG(st.st_mode):
                    files += 1
                    size += st.st_size
                    if files > max_files:
                        return (f"left more than max_output_files={max_files:,} files under "
                                "outputs/; stopped (raise max_output_files in the spec, or "
                                "write fewer, larger files)")
                    if size > max_bytes:
                        return (f"left more than max_output_bytes={max_bytes:,} bytes under "
                                "outputs/; stopped (raise max_output_bytes in the spec)")
    return None


class OutputWatcher:
    """Checks the outputs of running jobs every ``interval_s`` (longer if a check takes long).

    Args:
        running: the jobs to check (those preparing or running).
        fail: stops a job and fails it with the given message.
        interval_s: the pause between checks, at least; a check that took ``t`` seconds is
            followed by a pause of at least ``10 t``, so checking costs at most a tenth of a core.
    """

    def __init__(self, running: Callable[[], list[JobInfo]], fail: Callable[[str, str], None],
                 limits: OutputLimits, interval_s: float = 5.0):
        self.running = running
        self.fail = fail
        self.limits = limits
        self.interval_s = interval_s

    def check(self) -> None:
        """Check every running job once; fail those past a cap."""
        for job in self.running():
            problem = over_cap(JobFolder(Path(job.job_dir)).outputs, *self.limits.for_job(job))
            if problem is not None:
                log.warning("job %s %s", job.id, problem)
                self.fail(job.id, problem)

    def run(self, stop: threading.Event) -> None:
        """Check until ``stop`` is set."""
        while True:
            started = time.monotonic()
            try:
                self.check()
            except Exception:  # one bad check must not end the watching
                log.exception("checking the outputs of running jobs failed")
            took = time.monotonic() - started
            if stop.wait(max(self.interval_s, 10 * took)):
                return
