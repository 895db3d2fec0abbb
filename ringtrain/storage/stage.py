"""Staging one input: list the URL, reuse or fetch its cache entry, hand back the local path.

A folder URL becomes the entry's ``data`` folder; a single object the file in it; an ``https``
archive (``.tar``, ``.tar.gz``, ``.tgz``, ``.zip``) the folder it unpacks to.
"""

from __future__ import annotations

import tarfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ringtrain.storage import transfers
from ringtrain.storage.locations import open_store, scheme_of
from ringtrain.storage.node_cache import NodeCache, entry_key
from ringtrain.storage.objects import list_objects
from ringtrain.storage.progress import Progress

ARCHIVES = (".tar", ".tar.gz", ".tgz", ".zip")
#: How long a stager waits for another process staging the same data before giving up.
DEFAULT_WAIT_S = 6 * 3600.0


def stage_input(name: str, url: str, options: Mapping[str, Any], cache: NodeCache, holder: str,
                holder_pid: int, write: Callable[[str], None],
                concurrency: int = transfers.DEFAULT_CONCURRENCY,
                stall_s: float = transfers.DEFAULT_STALL_S,
                wait_s: float = DEFAULT_WAIT_S) -> Path:
    """The local path of input ``name`` at ``url`` on this node, fetched if the cache lacks it.

    Raises:
        Exception: the store's own errors (the caller redacts and reports them).
    """
    fs, path = open_store(url, options)
    is_folder, objects = transfers.bounded(lambda: list_objects(fs, path), stall_s, "listing")
    archive = (not is_folder and scheme_of(url) in ("http", "https")
               and objects[0].relpath.lower().endswith(ARCHIVES))
    key = entry_key(url, objects)
    entry = cache.hold(key, holder, holder_pid)
    if entry is None:
        total = sum(o.size for o in objects)
        busy = f"{name}: another job or node stages {url} here; waiting for it"
        with cache.staging(key, wait_s, lambda: write(busy)) as partial:
            if partial is not None:
                cache.make_room(total * (2 if archive else 1), keep=key)
                done = NodeCache.journaled(partial, objects)
                todo = [o for o in objects if o.relpath not in done]
                if done:
                    write(f"{name}: resuming: {len(done):,} of {len(objects):,} files already "
                          "staged")
                progress = Progress(name, len(objects), total, write)
                progress.add(files=len(done), nbytes=sum(o.size for o in objects
                                                         if o.relpath in done))
                transfers.download(fs, todo, partial / "data", progress,
                                   NodeCache.journal_writer(partial), concurrency, stall_s)
                progress.finish()
                if archive:
                    _unpack(partial / "data" / objects[0].relpath, partial / "data")
                cache.publish(key, partial, url, objects)
        entry = cache.hold(key, holder, holder_pid)
        if entry is None:
            raise RuntimeError(f"the cache entry of {url} vanished right after staging")
    else:
        write(f"{name}: {url} is in this node's cache ({len(objects):,} files)")
    if is_folder or archive:
        return entry.data
    return entry.data / objects[0].relpath


def _unpack(archive: Path, into: Path) -> None:
    """Unpack ``archive`` into ``into`` (no member may leave it) and delete the archive."""
    name = archive.name.lower()
    if name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            root = into.resolve()
            for member in z.namelist():
                if not (into / member).resolve().is_relative_to(root):
                    raise ValueError(f"{archive.name}: member {member!r} leaves the folder")
            z.extractall(into)
    else:
        with tarfile.open(archive) as t:
            t.extractall(into, filter="data")  # refuses links out, devices, absolute paths
    archive.unlink()
