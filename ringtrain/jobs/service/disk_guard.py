"""The service's side of a full disk: new jobs are refused below a floor of free space, the
home's reserve is given up when a write finds its disk full and made again once there is room,
and full-disk failures are logged once a minute with a count (while a disk is full, each write
of each scheduler tick fails, and a line for each would go to that very disk).

The rules and why they are PostgreSQL's: :mod:`ringtrain.jobs.disk_space`; docs/jobs.md,
"A full disk".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ringtrain.jobs.disk_space import (
    MB,
    SpaceReserve,
    disk_full_error,
    disk_usage,
    full_message,
    megabytes,
)
from ringtrain.jobs.models.schemas import DiskSpace

log = logging.getLogger(__name__)

#: The floor of free space under which new jobs are refused, unless ``--min-free-mb`` sets one;
#: a disk smaller than 20 such floors gets a twentieth of its size instead.
DEFAULT_FLOOR_MB = 100.0
DEFAULT_FLOOR_SHARE = 0.05
#: The home's reserve: room for hundreds of job records (SQLite appends 4 KiB pages to its
#: journal), and at most half the floor, so a disk whose reserve was given up stays under it.
RESERVE_BYTES = 4 << 20
#: How often a repeated full-disk failure is logged, at most.
LOG_EVERY_S = 60.0


class ThrottledLog:
    """One kind of repeated failure logged at most once per ``every_s``, each line with how many
    times it happened since the line before.

    Args:
        logger: where the lines go (as warnings).
        clock: monotonic seconds (tests inject one).
    """

    def __init__(self, logger: logging.Logger, every_s: float = LOG_EVERY_S,
                 clock: Callable[[], float] = time.monotonic):
        self._logger = logger
        self._every_s = every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: float | None = None
        self._unlogged = 0

    def warning(self, message: str) -> bool:
        """Count one failure; log ``message`` unless a line went out less than ``every_s``
        ago. Returns whether it was logged."""
        with self._lock:
            now = self._clock()
            if self._last is not None and now - self._last < self._every_s:
                self._unlogged += 1
                return False
            since, self._unlogged, self._last = self._unlogged, 0, now
        more = f" ({since} more since the last such line)" if since else ""
        self._logger.warning("%s%s", message, more)
        return True


class DiskGuard:
    """The free space of the disks the service writes to.

    Args:
        paths: the folders the service writes to, its home first (the reserve lives there);
            each is measured, and the one with least room above its floor is reported.
        floor_mb: free MB under which new jobs are refused (``None``: :data:`DEFAULT_FLOOR_MB`,
            or a twentieth of a smaller disk; 0: never).
        reserve: the home's reserve file (``None``: no reserve).
        measure: ``(free, total)`` bytes of the disk holding a path (tests inject one).
        clock: monotonic seconds, for the pace of the log (tests inject one).
    """

    def __init__(self, paths: Sequence[Path], floor_mb: float | None = None,
                 reserve: Path | None = None,
                 measure: Callable[[Path], tuple[int, int]] = disk_usage,
                 clock: Callable[[], float] = time.monotonic):
        if not paths:
            raise ValueError("a disk guard needs at least one folder to watch")
        self.paths = list(paths)
        self.floor_mb = floor_mb
        self._reserve_path = reserve
        self._reserve: SpaceReserve | None = None  # sized once the home's disk was measured
        self._measure = measure
        self._status: DiskSpace | None = None
        self._full_log = ThrottledLog(log, clock=clock)

    def floor(self, total: int) -> int:
        """The floor, in bytes, of a disk of ``total`` bytes."""
        if self.floor_mb is not None:
            return int(self.floor_mb * MB)
        return int(min(DEFAULT_FLOOR_MB * MB, DEFAULT_FLOOR_SHARE * total))

    def status(self) -> DiskSpace | None:
        """The last measure (no disk is looked at): ``None`` before the first."""
        return self._status

    def refresh(self) -> DiskSpace | None:
        """Measure the disks now (the scheduler loop does at each tick), and make the home's
        reserve again where there is room for it above the floor. A disk that cannot be
        measured is left out; the last measure stays if none can be made."""
        worst = None
        for index, path in enumerate(self.paths):
            try:
                free, total = self._measure(path)
            except OSError:
                continue
            floor = self.floor(total)
            seen = DiskSpace(path=str(path), free_bytes=free, total_bytes=total,
                             floor_bytes=floor, below_floor=free < floor)
            if index == 0:
                self._keep_reserve(free, floor)
            if worst is None or free - floor < worst.free_bytes - worst.floor_bytes:
                worst = seen
        if worst is not None:
            self._status = worst
        return self._status

    def check_room(self) -> None:
        """Refuse new work (a submit) while a disk is under its floor, measured now.

        Raises:
            DiskFullError: naming the disk, its free space and the floor.
        """
        status = self.refresh()
        if status is not None and status.below_floor:
            raise disk_full_error(Path(status.path), status.floor_bytes)

    def on_full(self, path: Path) -> None:
        """A write found the disk holding ``path`` full: give up the home's reserve, so that the
        writes that follow (a job's end) get its room, and log it, at most once a minute."""
        try:  # before the reserve's room is added
            free: int | None = self._measure(path)[0]
        except OSError:
            free = None
        released = self._reserve is not None and self._reserve.release()
        note = (f"; gave up the reserve ({megabytes(self._reserve.size)} MB) for the records "
                "that must be kept" if released and self._reserve is not None else "")
        self._full_log.warning(f"writes refused: {full_message(path, free)}{note}")

    def _keep_reserve(self, free: int, floor: int) -> None:
        if self._reserve_path is None:
            return
        if self._reserve is None:
            size = min(RESERVE_BYTES, floor // 2)
            if size <= 0:  # no floor: nothing to keep a reserve under
                self._reserve_path = None
                return
            self._reserve = SpaceReserve(self._reserve_path, size)
        if not self._reserve.held and free >= floor + self._reserve.size:
            self._reserve.make()
