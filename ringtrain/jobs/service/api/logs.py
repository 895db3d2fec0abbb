"""Streaming a log file while a job writes it, ending once the job is over and the file drained.

The job owns its log files: each is opened through :mod:`ringtrain.jobs.files.safe_open`, so a log
made a symbolic link, a named pipe, a socket or a device is refused, never followed or waited on.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from ringtrain.jobs.errors import InvalidRequestError, JobsError, NotFoundError, brief
from ringtrain.jobs.files.safe_open import open_regular
from ringtrain.jobs.models.paging import MAX_OFFSET, check_range

log = logging.getLogger(__name__)

CHUNK = 64 * 1024


def check_log(folder: Path, relpath: str, offset: int, follow: bool = False) -> int:
    """Refuse, before streaming, a log that is no regular file or an offset past its end.

    A log that does not exist yet (a queued job) takes any offset within the platform's range.
    A followed log shorter than the offset was replaced since the client read it (a retry
    started): it is read from its start, as a log replaced while followed is. Returns the offset
    to start at.

    Raises:
        InvalidRequestError: the offset is negative or past ``MAX_OFFSET`` or the log's size, or
            the log is a link, named pipe, socket or device.
    """
    check_range("offset", offset, 0, MAX_OFFSET, "it is a byte position in the log")
    try:
        fd = open_regular(folder, relpath)
    except NotFoundError:
        return offset
    try:
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if offset <= size:
        return offset
    if follow:
        return 0
    raise InvalidRequestError(f"offset {offset} is past the end of {brief(relpath)}, which "
                                  f"holds {size} bytes; resume from at most {size}")


async def follow_file(folder: Path, relpath: str, is_done: Callable[[], bool], offset: int = 0,
                      poll_s: float = 0.1) -> AsyncIterator[bytes]:
    """Yield what is written to a job's log until ``is_done()`` and nothing is left to read.

    The file may not exist yet (the job is queued) and may be replaced (a retry archives the
    previous attempt's logs): both are handled by reopening by name. Polling every ``poll_s``
    keeps the lag well under a second without inotify. Reads and ``is_done`` (a database query)
    run in worker threads, so a slow disk or a busy database never stalls the event loop.

    A log that turns into a link, pipe or the like while followed ends the stream (the
    client's next request is answered 400 saying why).

    Args:
        is_done: True once no process will write the file again (the job is in a final state).
        offset: where to start in the file (a client resuming after a lost connection); a file
            that replaced it is read from its start.
    """
    reader = _Reader(folder, relpath, offset)
    try:
        while True:
            # Ask first, read after: if the job was over before the read, the read gets all.
            done = await asyncio.to_thread(is_done)
            while chunk := await asyncio.to_thread(reader.read):
                yield chunk
            if done:
                return
            await asyncio.sleep(poll_s)
    except JobsError as e:
        log.warning("stopped streaming %s: %s", relpath, e)
    finally:
        reader.close()


class _Reader:
    """Reads a log file by name, reopening it once it appears or after it was replaced.

    The first file opened is read from ``offset``; a file that replaced it, from its start.
    """

    def __init__(self, folder: Path, relpath: str, offset: int = 0):
        self.folder = folder
        self.relpath = relpath
        self._offset = offset
        self._fd = -1

    def read(self) -> bytes:
        """The next chunk written, or ``b""`` when nothing new is there. Raises
        InvalidRequestError if the log is (now) a link, named pipe, socket or device."""
        if self._fd < 0:
            try:
                self._fd = open_regular(self.folder, self.relpath)
            except NotFoundError:
                return b""
            os.lseek(self._fd, min(self._offset, MAX_OFFSET), os.SEEK_SET)
        chunk = os.read(self._fd, CHUNK)
        if not chunk and self._replaced():
            self.close()
            self._offset = 0
            return self.read()
        return chunk

    def _replaced(self) -> bool:
        """Whether another file (a retry's) now has the log's name; checked once drained."""
        try:
            fd = open_regular(self.folder, self.relpath)
        except NotFoundError:
            return False
        try:
            return os.fstat(fd).st_ino != os.fstat(self._fd).st_ino
        finally:
            os.close(fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
