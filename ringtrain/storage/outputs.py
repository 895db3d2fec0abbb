"""Uploading a job's outputs folder to a URL: as files complete while it runs, all at its end.

A journal (one JSON line per stored file: path, size, modification time) makes every pass
upload only what changed since, so a restarted uploader resumes where the killed one stopped.
While the job runs, a file counts as complete once its size and time stayed the same for
``settle_s`` (a checkpoint being written keeps changing); the final pass takes every file.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ringtrain.storage import transfers
from ringtrain.storage.progress import Progress

Stamp = tuple[int, int]  # size, mtime_ns


def local_files(folder: Path) -> dict[str, Stamp]:
    """Every regular file below ``folder`` (links not followed) by its relative path."""
    found: dict[str, Stamp] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
        for name in filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if os.path.isfile(path) and not os.path.islink(path):
                found[os.path.relpath(path, folder)] = (st.st_size, st.st_mtime_ns)
    return found


class OutputUploader:
    """Uploads ``folder`` to ``prefix`` of the store ``fs``, journaling in ``journal``."""

    def __init__(self, fs: Any, prefix: str, folder: Path, journal: Path,
                 write: Callable[[str], None], concurrency: int = transfers.DEFAULT_CONCURRENCY,
                 stall_s: float = transfers.DEFAULT_STALL_S):
        self.fs = fs
        self.prefix = prefix.rstrip("/")
        self.folder = folder
        self.journal = journal
        self.write = write
        self.concurrency = concurrency
        self.stall_s = stall_s
        self._stored = self._read_journal()
        self._seen: dict[str, Stamp] = {}

    def _read_journal(self) -> dict[str, Stamp]:
        stored: dict[str, Stamp] = {}
        try:
            lines = self.journal.read_text().splitlines()
        except OSError:
            return stored
        for line in lines:
            try:
                record = json.loads(line)
                stored[record["relpath"]] = (int(record["size"]), int(record["mtime_ns"]))
            except (ValueError, KeyError, TypeError):
                continue  # a cut last line
        return stored

    def pending(self, final: bool) -> dict[str, Stamp]:
        """The files to upload now: changed since stored and, unless ``final``, settled."""
        now = self.folder_files()
        todo = {rel: st for rel, st in now.items() if self._stored.get(rel) != st}
        if not final:
            settled = {rel: st for rel, st in todo.items() if self._seen.get(rel) == st}
            self._seen = now
            todo = settled
        return todo

    def folder_files(self) -> dict[str, Stamp]:
        return local_files(self.folder) if self.folder.is_dir() else {}

    def run_pass(self, final: bool) -> int:
        """Upload what :meth:`pending` names; returns how many files went."""
        todo = self.pending(final)
        if not todo:
            return 0
        progress = Progress("outputs", len(todo), sum(s for s, _ in todo.values()), self.write)
        self.journal.parent.mkdir(parents=True, exist_ok=True)
        with open(self.journal, "a", buffering=1) as journal:
            def done(local: Path, _remote: str) -> None:
                rel = os.path.relpath(local, self.folder)
                size, mtime = todo[rel]
                journal.write(json.dumps({"relpath": rel, "size": size, "mtime_ns": mtime}) + "\n")
                self._stored[rel] = (size, mtime)

            pairs = [(self.folder / rel, f"{self.prefix}/{rel}") for rel in sorted(todo)]
            transfers.upload(self.fs, pairs, progress, done, self.concurrency, self.stall_s)
        progress.finish()
        return len(todo)

    def watch(self, stop: Callable[[], bool], settle_s: float = 2.0) -> None:
        """Upload settled files every ``settle_s`` until ``stop()`` is true."""
        while not stop():
            self.run_pass(final=False)
            deadline = time.monotonic() + settle_s
            while not stop() and time.monotonic() < deadline:
                time.sleep(0.1)
