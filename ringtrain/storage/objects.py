"""What a URL holds: its objects with their sizes, versions and checksums, as the store lists them.

The version (ETag, generation) keys the node cache, so that a changed object is a new entry and
an unchanged data set is never fetched twice; the checksum, where the store reports one, is
verified after each download.
"""

from __future__ import annotations

import base64
import binascii
import posixpath
from dataclasses import dataclass
from typing import Any

#: A listing larger than this is refused: the cache's manifest and the job's environment are
#: built from it in memory.
MAX_OBJECTS = 2_000_000


@dataclass(frozen=True)
class RemoteObject:
    """One object below a URL."""

    path: str  #: its path in the store's filesystem
    relpath: str  #: below the URL (a single object's: its base name)
    size: int
    version: str  #: ETag or generation; "" where the store reports neither
    md5: str | None = None  #: hex digest, where the store reports the object's MD5


def list_objects(fs: Any, path: str) -> tuple[bool, list[RemoteObject]]:
    """``(is_folder, objects)`` below ``path``, sorted by relpath.

    Raises:
        FileNotFoundError: nothing is at ``path``.
        ValueError: more than :data:`MAX_OBJECTS` objects.
    """
    root = path.rstrip("/")
    info = fs.info(root)
    if info.get("type") != "directory":
        return False, [_object(root, posixpath.basename(root) or "data", info)]
    found = fs.find(root, detail=True, withdirs=False)
    if len(found) > MAX_OBJECTS:
        raise ValueError(f"{len(found)} objects; at most {MAX_OBJECTS} can be staged")
    objects = []
    for name, entry in found.items():
        rel = posixpath.relpath(name, root)
        if entry.get("type") == "directory" or rel.startswith("..") or rel == ".":
            continue
        objects.append(_object(name, rel, entry))
    if not objects:
        raise FileNotFoundError(f"{path}: no objects")
    return True, sorted(objects, key=lambda o: o.relpath)


def _object(path: str, relpath: str, info: dict[str, Any]) -> RemoteObject:
    etag = str(info.get("ETag") or info.get("etag") or "").strip('"')
    version = str(info.get("generation") or info.get("VersionId") or etag
                  or info.get("LastModified") or info.get("last_modified") or "")
    return RemoteObject(path=path, relpath=relpath, size=int(info.get("size") or 0),
                        version=version, md5=_md5(info, etag))


def _md5(info: dict[str, Any], etag: str) -> str | None:
    settings = info.get("content_settings") or {}
    raw = settings.get("content_md5") if isinstance(settings, dict) else None
    if raw:  # Azure: the bytes of the digest
        return bytes(raw).hex()
    if info.get("md5Hash"):  # Google: base64
        try:
            return base64.b64decode(info["md5Hash"]).hex()
        except (binascii.Error, ValueError):
            return None
    # S3: a single-part upload's ETag is its MD5; a multipart one's has a "-N" suffix
    if "ETag" in info and len(etag) == 32 and all(c in "0123456789abcdef" for c in etag):
        return etag
    return None
