"""Streaming a log file while a job writes it, ending once the job is over and the file drained."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import BinaryIO

CHUNK = 64 * 1024


async def follow_file(path: Path, is_done: Callable[[], bool], offset: int = 0,
                      poll_s: float = 0.1) -> AsyncIterator[bytes]:
    """Yield what is written to ``path`` until ``is_done()`` and nothing is left to read.

    The file may not exist yet (the job is queued) and may be replaced (a retry archives the
    previous attempt's logs): both are handled by reopening by name. Polling every ``poll_s``
    keeps the lag well under a second without inotify. Reads and ``is_done`` (a database query)
    run in worker threads, so a slow disk or a busy database never stalls the event loop.

    Args:
        path: the log file.
        is_done: True once no process will write the file again (the job is in a final state).
        offset: where to start in the file (a client resuming after a lost connection); a file
            that replaced it is read from its start.
        poll_s: sleep between reads that found nothing new.
    """
    reader = _Reader(path, offset)
    try:
        while True:
            # Ask first, read after: if the job was over before the read, the read gets all.
            done = await asyncio.to_thread(is_done)
            while chunk := await asyncio.to_thread(reader.read):
                yield chunk
            if done:
                return
            await asyncio.sleep(poll_s)
    finally:
        reader.close()


class _Reader:
    """Reads a log file by name, reopening it once it appears or after it was replaced.

    The first file opened is read from ``offset``; a file that replaced it, from its start.
    """

    def __init__(self, path: Path, offset: int = 0):
        self.path = path
        self._offset = offset
        self._f: BinaryIO | None = None

    def read(self) -> bytes:
        """The next chunk written, or ``b""`` when nothing new is there."""
        if self._f is not None and _replaced(self._f, self.path):
            self.close()
            self._offset = 0
        if self._f is None:
            try:
                self._f = open(self.path, "rb")
            except FileNotFoundError:
                return b""
            self._f.seek(self._offset)
        return self._f.read(CHUNK)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def _replaced(f: BinaryIO, path: Path) -> bool:
    try:
        return os.stat(path).st_ino != os.fstat(f.fileno()).st_ino
    except FileNotFoundError:
        return False
