"""A node's cache of staged inputs: each data set version fetched once, whoever asks for it.

Layout under the cache root::

    entries/<key>/manifest.json   written last: its presence marks the entry complete
    entries/<key>/data/...        the objects, read-only
    partial/<key>/                an entry being staged: data/ and journal.jsonl of the
                                  files already complete (a restarted stager keeps them)
    locks/<key>.lock              flock'ed by the one process staging that entry
    holds/<key>/<holder>          a job using the entry (its process id and start time)

The key hashes the URL with every object's path, size and version, so a changed object makes a
new entry while an unchanged data set maps to the one already here. A complete entry appears by
renaming its partial folder, so a job never sees part of one. Entries no live holder uses are
evicted, least recently used first, when the cache would exceed its size bound.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import stat
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ringtrain.storage.objects import RemoteObject

MANIFEST = "manifest.json"
JOURNAL = "journal.jsonl"
#: How often a process waiting for another's staging looks again.
_LOCK_POLL_S = 0.2


class CacheError(RuntimeError):
    """The cache cannot hold or find an entry; the message says what to change."""


def entry_key(url: str, objects: list[RemoteObject]) -> str:
    """The entry of ``url`` as listed: equal for equal data, different when any object changed."""
    digest = hashlib.sha256(url.encode())
    for obj in objects:
        digest.update(f"\0{obj.relpath}\0{obj.size}\0{obj.version}".encode())
    return digest.hexdigest()[:32]


@dataclass(frozen=True)
class Entry:
    """A complete entry."""

    key: str
    folder: Path
    bytes: int

    @property
    def data(self) -> Path:
        return self.folder / "data"


def _process_start(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[19].decode()  # starttime: tells a live process from a reused pid
    except (OSError, IndexError):
        return None


class NodeCache:
    """The cache at ``root``, bounded to ``max_bytes``."""

    def __init__(self, root: Path, max_bytes: int):
        self.root = root
        self.max_bytes = max_bytes

    def _dir(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def complete(self, key: str) -> Entry | None:
        """The complete entry ``key``, or None."""
        folder = self.root / "entries" / key
        try:
            manifest = json.loads((folder / MANIFEST).read_text())
        except (OSError, ValueError):
            return None
        return Entry(key, folder, int(manifest.get("bytes", 0)))

    @contextmanager
    def staging(self, key: str, timeout_s: float,
                waiting: Callable[[], None] = lambda: None) -> Iterator[Path | None]:
        """Hold the right to stage ``key``: yields its partial folder, or None when another
        process completed the entry while this one waited (bounded by ``timeout_s``)."""
        lock_path = self._dir("locks") / f"{key}.lock"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + timeout_s
            told = False
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise CacheError(f"another process has been staging this data for "
                                         f"over {timeout_s:.0f} s (lock {lock_path})") from None
                    if not told:
                        waiting()
                        told = True
                    time.sleep(_LOCK_POLL_S)
            if self.complete(key):
                yield None
                return
            partial = self._dir("partial") / key
            (partial / "data").mkdir(parents=True, exist_ok=True)
            yield partial
        finally:
            os.close(fd)  # releases the flock; a killed process's is released by the kernel

    @staticmethod
    def journaled(partial: Path, objects: list[RemoteObject]) -> set[str]:
        """The relpaths a previous staging of this entry completed (present at their size)."""
        done: set[str] = set()
        try:
            lines = (partial / JOURNAL).read_text().splitlines()
        except OSError:
            return done
        sizes = {o.relpath: o.size for o in objects}
        for line in lines:
            try:
                rel = json.loads(line)["relpath"]
            except (ValueError, KeyError, TypeError):
                continue  # the last line of a killed stager may be cut
            target = partial / "data" / rel
            if rel in sizes and target.is_file() and target.stat().st_size == sizes[rel]:
                done.add(rel)
        return done

    @staticmethod
    def journal_writer(partial: Path) -> Callable[[RemoteObject], None]:
        """A callback that records one completed object in the partial entry's journal."""
        f = open(partial / JOURNAL, "a", buffering=1)  # noqa: SIM115 - lives as the callback

        def record(obj: RemoteObject) -> None:
            f.write(json.dumps({"relpath": obj.relpath}) + "\n")

        return record

    def publish(self, key: str, partial: Path, url: str, objects: list[RemoteObject]) -> Entry:
        """Make the staged ``partial`` folder the complete, read-only entry ``key``."""
        total = sum(o.size for o in objects)
        for dirpath, _dirnames, filenames in os.walk(partial / "data"):
            for name in filenames:
                path = os.path.join(dirpath, name)
                if name.startswith(".") and ".part-" in name:
                    os.unlink(path)  # a transfer the killed stager left
                else:
                    os.chmod(path, 0o444)
            os.chmod(dirpath, 0o555)
        (partial / JOURNAL).unlink(missing_ok=True)
        manifest = {"url": url, "files": len(objects), "bytes": total, "created": time.time()}
        (partial / MANIFEST).write_text(json.dumps(manifest))
        folder = self._dir("entries") / key
        os.replace(partial, folder)
        return Entry(key, folder, total)

    @contextmanager
    def _cache_lock(self, timeout_s: float = 60.0) -> Iterator[None]:
        """The cache-wide lock under which entries are held and evicted, so that an entry is
        never evicted between a job finding it and holding it. Held for file operations only."""
        fd = os.open(self._dir("locks") / "cache.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise CacheError(f"the node cache's lock ({self.root}/locks/cache.lock) "
                                         f"was busy for {timeout_s:.0f} s") from None
                    time.sleep(_LOCK_POLL_S / 4)
            yield
        finally:
            os.close(fd)

    def hold(self, key: str, holder: str, pid: int) -> Entry | None:
        """The complete entry ``key``, marked used by ``holder`` (a job attempt) for as long as
        process ``pid`` lives and as recently used; None if there is no such entry."""
        with self._cache_lock():
            entry = self.complete(key)
            if entry is None:
                return None
            path = self._dir("holds") / key
            path.mkdir(exist_ok=True)
            (path / holder).write_text(json.dumps({"pid": pid, "start": _process_start(pid)}))
            os.utime(entry.folder / MANIFEST)
        return entry

    def release(self, holder: str) -> None:
        """Drop every hold of ``holder``."""
        for path in (self.root / "holds").glob(f"*/{holder}"):
            path.unlink(missing_ok=True)

    def _held(self, key: str) -> bool:
        for path in (self.root / "holds" / key).glob("*"):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            start = record.get("start")
            if start is not None and _process_start(int(record.get("pid", 0))) == start:
                return True
            path.unlink(missing_ok=True)  # its process ended without releasing
        return False

    def entries(self) -> list[tuple[float, Entry]]:
        """Every complete entry with when it was last used, least recent first."""
        found = []
        for folder in (self.root / "entries").glob("*"):
            entry = self.complete(folder.name)
            if entry:
                found.append(((folder / MANIFEST).stat().st_mtime, entry))
        return sorted(found, key=lambda item: item[0])

    def make_room(self, needed: int, keep: str) -> list[str]:
        """Evict unheld entries, least recently used first, until ``needed`` more bytes fit.

        Returns:
            the keys evicted.

        Raises:
            CacheError: ``needed`` alone exceeds the bound.
        """
        if needed > self.max_bytes:
            raise CacheError(f"the data is {needed:,} bytes but the node cache holds at most "
                             f"{self.max_bytes:,}; raise the server's --cache-max-gb")
        evicted = []
        with self._cache_lock():
            entries = self.entries()
            used = sum(e.bytes for _, e in entries)
            for _, entry in entries:
                if used + needed <= self.max_bytes:
                    break
                if entry.key == keep or self._held(entry.key):
                    continue
                evicted.append(self._trash(entry.key))
                used -= entry.bytes
        for trash in evicted:
            self._delete(trash)
        return [t.name.rsplit("-", 1)[0] for t in evicted]

    def _trash(self, key: str) -> Path:
        """Take entry ``key`` out of view at once (a rename); its files are deleted later."""
        trash = self._dir("trash") / f"{key}-{uuid.uuid4().hex[:8]}"
        os.replace(self.root / "entries" / key, trash)
        return trash

    @staticmethod
    def _delete(trash: Path) -> None:
        for dirpath, _, _ in os.walk(trash):
            os.chmod(dirpath, stat.S_IRWXU)
        shutil.rmtree(trash, ignore_errors=True)
