"""Writing the files of a job's archive (see :mod:`ringtrain.jobs.files.archive`) as they arrive.

The archive comes from the server, which a job may have made send anything: only regular files
are written, each at its member path made relative to the downloaded folder's parent (``cp -r``:
``outputs/model/w.pt`` of ``outputs/model`` lands in ``DEST/model/w.pt``), and a member outside
that folder, absolute, or of another type (link, device) stops the download with an error.
"""

from __future__ import annotations

import os
import posixpath
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from ringtrain.jobs.errors import InvalidRequestError, JobsError, brief

_BLOCK = 512
_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE)


class TruncatedArchive(JobsError):
    """The stream ended before the archive's end marker (a lost connection)."""


class Extractor:
    """Writes the members of archives of one download, remembering the last one written whole.

    Args:
        dest: the local folder to copy into.
        path: the job's file or folder being downloaded (as the user named it).
    """

    def __init__(self, dest: Path, path: str):
        self.dest = dest
        self.base = posixpath.dirname(posixpath.normpath(path)) or "."
        self.path = path
        #: The member path of the last file written whole (where a retry resumes after).
        self.last: str | None = None
        self._made: set[Path] = set()

    def members(self, chunks: Iterable[bytes]) -> Iterator[Path]:
        """Write each file of the archive in ``chunks``; yield its local path once written.

        Raises:
            TruncatedArchive: the chunks end before the end of the archive.
            InvalidRequestError: a member is not a regular file, or lies outside the folder.
        """
        stream = _Bytes(iter(chunks))
        pax: dict[str, str] = {}
        while True:
            block = stream.take(_BLOCK)
            if block == bytes(_BLOCK):
                return  # the end marker: everything came
            name, size, kind = _parse_header(block)
            size = int(pax.get("size", size))
            if kind == tarfile.XHDTYPE:
                pax = _pax_records(stream.take(_padded(size)), size)
                continue
            if kind not in _REGULAR:
                raise InvalidRequestError(f"the server sent {brief(name)}, which is not a "
                                          "regular file")
            name = pax.get("path", name)
            pax = {}
            target = self._target(name)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            with open(fd, "wb", closefd=True) as out:
                stream.copy(out, size)
            stream.take(_padded(size) - size)
            self.last = name
            yield target

    def _target(self, name: str) -> Path:
        rel = posixpath.relpath(posixpath.normpath(name), self.base)
        if posixpath.isabs(name) or rel == ".." or rel.startswith("../") or rel == ".":
            raise InvalidRequestError(f"the server sent {brief(name)}, outside {brief(self.path)}")
        target = self.dest / rel
        if target.parent not in self._made:
            target.parent.mkdir(parents=True, exist_ok=True)
            self._made.add(target.parent)
        return target


def _parse_header(block: bytes) -> tuple[str, int, bytes]:
    """A ustar header's name, size and type (what the archives of
    :mod:`ringtrain.jobs.files.archive` use; ``tarfile`` parses them ten times slower, which a
    million files feel).

    Raises:
        InvalidRequestError: the checksum or a number is wrong.
    """
    try:
        checksum = int(block[148:156].strip(b"\0 ") or b"0", 8)
        size = int(block[124:136].strip(b"\0 ") or b"0", 8)
    except ValueError:
        raise InvalidRequestError("the server sent a malformed archive (header numbers)") from None
    if checksum != sum(block[:148]) + 256 + sum(block[156:]):
        raise InvalidRequestError("the server sent a malformed archive (header checksum)")
    name = block[:100].split(b"\0", 1)[0]
    if block[257:262] == b"ustar" and block[345] != 0:
        name = block[345:500].split(b"\0", 1)[0] + b"/" + name
    return name.decode("utf-8", "surrogateescape"), size, block[156:157]


def _padded(size: int) -> int:
    return -(-size // _BLOCK) * _BLOCK


def _pax_records(data: bytes, size: int) -> dict[str, str]:
    """The ``key=value`` records of a pax extended header (``"%d %s=%s\\n"`` each)."""
    records: dict[str, str] = {}
    data = data[:size]
    pos = 0
    while pos < len(data):
        length_text, _, _ = data[pos:pos + 20].partition(b" ")
        try:
            length = int(length_text)
        except ValueError:
            length = 0
        if length <= 0:
            raise InvalidRequestError("the server sent a malformed archive (pax header)")
        record = data[pos + len(length_text) + 1:pos + length - 1]
        key, _, value = record.partition(b"=")
        records[key.decode(errors="replace")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


class _Bytes:
    """Exact-size reads over an iterator of chunks."""

    def __init__(self, chunks: Iterator[bytes]):
        self._chunks = chunks
        self._buf = b""
        self._pos = 0

    def _more(self) -> None:
        for chunk in self._chunks:
            if chunk:
                self._buf = self._buf[self._pos:] + chunk
                self._pos = 0
                return
        raise TruncatedArchive("the archive stopped before its end (a lost connection?)")

    def take(self, n: int) -> bytes:
        while len(self._buf) - self._pos < n:
            self._more()
        out = self._buf[self._pos:self._pos + n]
        self._pos += n
        return out

    def copy(self, out: BinaryIO, n: int) -> None:
        write = out.write
        while n > 0:
            if self._pos >= len(self._buf):
                self._more()
            piece = self._buf[self._pos:self._pos + n]
            self._pos += len(piece)
            n -= len(piece)
            write(piece)
