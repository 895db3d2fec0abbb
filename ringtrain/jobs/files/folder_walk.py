"""Walking a job's folder in path order, from any file on, in bounded memory.

A job may leave a million files in one folder. Listing them all before answering took 12.9 s and
1 GB (issue 22); the walk here yields files one at a time, in the order of their paths compared
component by component (``a/b`` before ``a.txt``), and resumes after any path, so a page of a
listing or the rest of an interrupted archive costs what it returns, not what the folder holds.

A folder's names are never held all at once: each pass over the folder keeps only the smallest
names after the last one yielded (a heap of at most :data:`MAX_BATCH`), so a flat folder of N
names costs about N / MAX_BATCH passes and a few MiB, whatever N is.
"""

from __future__ import annotations

import heapq
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from ringtrain.jobs.errors import JobsError
from ringtrain.jobs.files.safe_open import open_below

#: The most names of one folder held at once (about 100 bytes each).
MAX_BATCH = 65_536


@dataclass(frozen=True)
class Entry:
    """A name in a folder that may be a regular file: what the caller opens or stats.

    ``dir_fd`` is valid only until the walk goes on; ``path`` is relative to the job's folder.
    """

    dir_fd: int
    name: str
    path: str


def walk(dir_fd: int, prefix: str, after: list[str] | None = None,
         first_batch: int = 1024) -> Iterator[Entry]:
    """Every non-folder entry below ``dir_fd``, in path order, after the path ``after``.

    Folders are entered through :func:`~ringtrain.jobs.files.safe_open.open_below`, so a link or a
    folder swapped for one is skipped, never followed. Entries that are not folders are yielded
    unchecked (the caller opens or stats them without following links and keeps regular files).

    Args:
        dir_fd: the folder to walk (not closed here).
        prefix: its path relative to the job's folder ("" for the folder itself).
        after: components below ``dir_fd`` of the path to resume after (``None``: from the start).
        first_batch: how many names the first pass over a folder keeps (the page size, say).
    """
    start = after[0] if after else None
    for name, is_dir in _sorted_names(dir_fd, start, first_batch):
        rest = after[1:] if after and name == start else None
        if name == start and not rest and not is_dir:
            continue  # the file resumed after
        path = f"{prefix}/{name}" if prefix else name
        if not is_dir:
            yield Entry(dir_fd, name, path)
            continue
        try:
            child = open_below(dir_fd, name, path)
        except JobsError:  # a link, or gone: neither followed nor listed
            continue
        try:
            if stat.S_ISDIR(os.fstat(child).st_mode):
                yield from walk(child, path, rest, first_batch)
            elif name != start:  # was a folder when listed, a file now
                yield Entry(dir_fd, name, path)
        finally:
            os.close(child)


def _sorted_names(dir_fd: int, after: str | None, batch: int) -> Iterator[tuple[str, bool]]:
    """The names of a folder from ``after`` (included) on, sorted, with whether each is a folder.

    Each pass reads the whole folder and keeps the ``batch`` smallest names not yet yielded;
    ``batch`` doubles up to :data:`MAX_BATCH` so that long folders take few passes.
    """
    inclusive = after is not None
    while True:
        with os.scandir(dir_fd) as it:
            if after is None:
                names = (e for e in it)
            elif inclusive:
                names = (e for e in it if e.name >= after)
            else:
                names = (e for e in it if e.name > after)
            chunk = heapq.nsmallest(batch, ((e.name, _is_dir(e)) for e in names))
        yield from chunk
        if len(chunk) < batch:
            return
        after, inclusive = chunk[-1][0], False
        batch = min(2 * batch, MAX_BATCH)


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:  # removed while listed
        return False
