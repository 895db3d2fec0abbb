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
    keeps the lag well under a second without inotify.

    Args:
        path: the log file.
        is_done: True once no process will write the file again (the job is in a final state).
        offset: where to start in the file (a client resuming after a lost connection); a file
            that replaced it is read from its start.
        poll_s: sleep between reads that found nothing new.
    """
    f: BinaryIO | None = None
    try:
        while True:
            # Ask first, read after: if the job was over before the read, the read gets all.
            done = is_done()
            if f is not None and _replaced(f, path):
                f.close()
                f, offset = None, 0
            if f is None:
                try:
                    f = open(path, "rb")
                    f.seek(offset)
                except FileNotFoundError:
                    pass
            while f is not None and (chunk := f.read(CHUNK)):
                yield chunk
            if done:
                return
            await asyncio.sleep(poll_s)
    finally:
        if f is not None:
            f.close()


def _replaced(f: BinaryIO, path: Path) -> bool:
    try:
        return os.stat(path).st_ino != os.fstat(f.fileno()).st_ino
    except FileNotFoundError:
        return False
