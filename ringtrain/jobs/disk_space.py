"""Free space on the disks the job service and its job runners write to, in the words their
errors use, and a reserve of space kept for the writes that must not be lost when a disk fills.

What the service does about a full disk follows PostgreSQL (docs/jobs.md, "A full disk"): reads
go on; a write that cannot be made is refused with an error naming the disk and its free space,
nothing of it is kept, and the same write succeeds once space is freed, without a restart.
PostgreSQL writes its WAL into segments allocated beforehand, so that commits still go through
when data files can no longer grow; here a :class:`SpaceReserve` plays that part: a file made
while there is room and removed the moment a write finds the disk full, so that the records
that must be kept (an attempt's end) still fit.

Standard library only: the job runner uses it too.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

from ringtrain.jobs.errors import DiskFullError

MB = 1_000_000
#: Less free space than this, and a disk counts as full when a job's failure is explained.
FULL_BELOW_BYTES = 1 * MB
#: The errnos of "no room": the disk is full, or the user's quota is.
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT)
_SQLITE_FULL_TEXT = "database or disk is full"  # SQLite's own words for SQLITE_FULL


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` says a write found no room: ``ENOSPC`` or ``EDQUOT``, or SQLite's
    ``SQLITE_FULL``."""
    if isinstance(error, OSError):
        return error.errno in _NO_ROOM
    # Looked up, not imported: the job runner never loads sqlite3 (and meets none of its errors).
    sqlite3 = sys.modules.get("sqlite3")
    if sqlite3 is None or not isinstance(error, sqlite3.OperationalError):
        return False
    code = getattr(error, "sqlite_errorcode", None)  # Python 3.11 and later
    return code == sqlite3.SQLITE_FULL if code is not None else _SQLITE_FULL_TEXT in str(error)


def disk_usage(path: Path) -> tuple[int, int]:
    """``(free, total)`` bytes of the filesystem holding ``path``; free is what a user other than
    root may still write (root's reserved blocks left out, as ``df`` shows it).

    Raises:
        OSError: ``path`` cannot be looked at.
    """
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def megabytes(size: int) -> str:
    """``size`` in MB as the messages write it: ``0.4``, ``37``, ``1,024``."""
    mb = size / MB
    return f"{mb:.1f}" if mb < 10 else f"{mb:,.0f}"


def full_message(path: Path, free: int | None) -> str:
    """``the disk holding PATH is full: N MB free`` (``free`` ``None``: not measurable)."""
    if free is None:
        return f"the disk holding {path} is full"
    return f"the disk holding {path} is full: {megabytes(free)} MB free"


def disk_full_error(path: Path, floor: int | None = None) -> DiskFullError:
    """The error of a write that found the disk holding ``path`` full, or (``floor``: bytes) of
    new work refused below that much free space; its free space measured now (on the nearest
    folder above ``path`` that exists: a folder that could not be made has none)."""
    free: int | None = None
    for folder in (path, *path.parents):
        try:
            free = disk_usage(folder)[0]
            break
        except OSError:
            continue
    text = full_message(path, free)
    if floor is not None:
        text += f"; new jobs need {megabytes(floor)} MB (`ringtrain server --min-free-mb`)"
    return DiskFullError(f"{text}; free space on it (delete files there), then try again")


def full_note(path: Path) -> str | None:
    """:func:`full_message` for ``path`` if its disk has less than :data:`FULL_BELOW_BYTES`
    free now, else ``None``."""
    try:
        free = disk_usage(path)[0]
    except OSError:
        return None
    return full_message(path, free) if free < FULL_BELOW_BYTES else None


class SpaceReserve:
    """A file holding ``size`` bytes of a disk for later: made while there is room, removed to
    give that room to the writes that must be made once the disk is full.

    Args:
        path: the file; its folder must exist.
        size: the bytes it holds.
    """

    def __init__(self, path: Path, size: int):
        self.path = path
        self.size = size

    @property
    def held(self) -> bool:
        """Whether the file holds its space now."""
        return self.path.exists()

    def make(self) -> bool:
        """Allocate the file, unless it is there; False (and nothing left behind) when the disk
        has no room for it or it cannot be written: a reserve is a help, never a failure."""
        if self.held:
            return True
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                _allocate(fd, self.size)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)  # never a reserve that holds less than it says
        except OSError:
            tmp.unlink(missing_ok=True)
            return False
        return True

    def release(self) -> bool:
        """Remove the file; whether it was there (and its space is free now)."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        return True


def _allocate(fd: int, size: int) -> None:
    """Give the file ``size`` bytes of the disk's blocks (a sparse file would hold none)."""
    try:
        os.posix_fallocate(fd, 0, size)
        return
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
    chunk = bytes(min(size, 1 << 20))  # a filesystem without fallocate: write the zeros
    written = 0
    while written < size:
        written += os.write(fd, chunk[:size - written])
