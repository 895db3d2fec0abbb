"""Many files at once between a store and a local folder, each verified, none half-visible.

A download lands in a hidden ``.<name>.part-*`` file beside its target and is renamed only once
its size (and MD5, where the store lists one) matched. Work is spread over threads: the store
libraries are asynchronous underneath, but their synchronous calls from several threads overlap
(fsspec runs them on its own event loop), which is what ``aws s3 sync``'s parallel transfers do.
A transfer in which no byte moved for ``stall_s`` fails naming the store, instead of waiting on
a store that stopped answering.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ringtrain.storage.objects import RemoteObject
from ringtrain.storage.progress import Progress

#: Transfers at once unless told otherwise (benchmarks/storage.py measures the choice).
DEFAULT_CONCURRENCY = 16
#: Seconds without a byte moved after which a transfer is given up.
DEFAULT_STALL_S = 120.0
#: Bytes per request of a large upload (what ``aws s3 cp`` sends): a file above it goes in parts,
#: one in flight per file unless fewer files than transfers are left, so an upload holds about
#: ``concurrency x PART_BYTES`` in memory, not whole files (left to themselves s3fs reads a file
#: under 100 MB whole and adlfs sends a blob's blocks up to 128 at once).
PART_BYTES = 8 << 20


class TransferError(RuntimeError):
    """A transfer failed; the message names the object and the store's reason."""


class _Counter:
    """An fsspec callback that reports bytes as they move."""

    def __init__(self, progress: Progress):
        self.progress = progress
        self.moved = 0

    # fsspec's Callback protocol, duck-typed: set_size, relative_update, absolute_update, call
    def set_size(self, size: int) -> None:  # noqa: D102
        pass

    def relative_update(self, inc: int = 1) -> None:  # noqa: D102
        self.moved += inc
        self.progress.add(nbytes=inc)

    def absolute_update(self, value: int) -> None:  # noqa: D102
        self.relative_update(value - self.moved)

    def branched(self, *_args: Any, **_kwargs: Any) -> _Counter:  # noqa: D102
        return self

    def branch_coro(self, fn: Any) -> Any:  # noqa: D102
        return fn

    def call(self, *_args: Any, **_kwargs: Any) -> None:  # noqa: D102
        pass


def file_md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def download(fs: Any, objects: Iterable[RemoteObject], dest: Path, progress: Progress,
             done: Callable[[RemoteObject], None], concurrency: int = DEFAULT_CONCURRENCY,
             stall_s: float = DEFAULT_STALL_S) -> None:
    """Fetch ``objects`` to ``dest/<relpath>``, calling ``done`` after each is in place."""

    def fetch(obj: RemoteObject) -> RemoteObject:
        target = dest / obj.relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(f".{target.name}.part-{os.getpid()}")
        counter = _Counter(progress)
        try:
            fs.get_file(obj.path, str(part), callback=counter)
            size = part.stat().st_size
            if size != obj.size:
                raise TransferError(f"{obj.relpath}: {size} bytes arrived, the store lists "
                                    f"{obj.size}")
            if obj.md5 and file_md5(part) != obj.md5:
                raise TransferError(f"{obj.relpath}: MD5 differs from the store's {obj.md5}")
            os.replace(part, target)
        except BaseException:
            progress.add(nbytes=-counter.moved)
            part.unlink(missing_ok=True)
            raise
        if counter.moved < obj.size:  # a library that reports no progress
            progress.add(nbytes=obj.size - counter.moved)
        progress.add(files=1)
        done(obj)
        return obj

    _run_all(fetch, list(objects), progress, concurrency, stall_s, "download")


def upload(fs: Any, files: Iterable[tuple[Path, str]], progress: Progress,
           done: Callable[[Path, str], None], concurrency: int = DEFAULT_CONCURRENCY,
           stall_s: float = DEFAULT_STALL_S) -> None:
    """Put each local file at its remote path, calling ``done`` after each is stored whole."""
    items = list(files)
    options = part_options(fs, parts_at_once=max(1, concurrency // max(1, len(items))))

    def put(item: tuple[Path, str]) -> tuple[Path, str]:
        local, remote = item
        size = local.stat().st_size
        counter = _Counter(progress)
        try:
            fs.put_file(str(local), remote, callback=counter, **options)
        except BaseException:
            progress.add(nbytes=-counter.moved)
            raise
        progress.add(files=1, nbytes=max(0, size - counter.moved))
        done(local, remote)
        return item

    _run_all(put, items, progress, concurrency, stall_s, "upload")


def part_options(fs: Any, parts_at_once: int) -> dict[str, Any]:
    """``put_file``'s keywords that make ``fs``'s library send a large file in
    :data:`PART_BYTES` parts, ``parts_at_once`` at a time (Azure's part size is set on its client
    by :func:`ringtrain.storage.locations.open_store`; gcsfs sends its parts one by one)."""
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    if "s3" in protocols:
        return {"chunksize": PART_BYTES, "max_concurrency": parts_at_once}
    if "az" in protocols or "abfs" in protocols:
        return {"max_concurrency": parts_at_once}
    if "gs" in protocols:
        return {"chunksize": PART_BYTES}
    return {}


def _run_all(work: Callable[[Any], Any], items: list[Any], progress: Progress, concurrency: int,
             stall_s: float, what: str) -> None:
    if not items:
        return
    pool = cf.ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(items))),
                                 thread_name_prefix=f"storage-{what}")
    try:
        pending = {pool.submit(work, item) for item in items}
        while pending:
            finished, pending = cf.wait(pending, timeout=1.0, return_when=cf.FIRST_EXCEPTION)
            for future in finished:
                error = future.exception()
                if error is not None:
                    raise TransferError(describe(error)) from error
            if pending and time.monotonic() - progress.last_change > stall_s:
                raise TransferError(f"{what} stalled: no byte moved for {stall_s:.0f} s "
                                    "(the store stopped answering?)")
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def bounded(call: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """``call()``'s value, or TransferError once it has not returned within ``timeout_s`` (a
    store library's own retries can outlast any wish; the call is left in a daemon thread)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as e:  # handed to the caller's thread
            outcome["error"] = e

    thread = threading.Thread(target=run, name=f"storage-{what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TransferError(f"{what}: the store did not answer within {timeout_s:.0f} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def describe(error: BaseException) -> str:
    """One line for a store library's exception (its own message, not a traceback)."""
    if isinstance(error, TransferError):
        return str(error)
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else 'no message'}"[:500]
