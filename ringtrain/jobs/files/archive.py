"""A folder of a job as one tar stream, written while it is sent and resumable after any file.

``GET /v1/jobs/{id}/archive?path=outputs`` answers the files under ``outputs`` as an
uncompressed POSIX (pax) tar, in path order, each member named by its path relative to the job's
folder. Nothing is staged: each file is opened (without following links, see
:mod:`ringtrain.jobs.files.safe_open`) and copied as the client reads. A client that lost the
connection asks again with ``after=`` the last member it received whole, and gets the rest.

Only regular files are archived (no links, folders, pipes or devices), so extracting cannot
create anything but files. A file that shrinks while it is sent is padded with zeros to the size
announced in its header, and one that grows is cut at that size: the stream stays a valid tar.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterable, Iterator
from typing import Protocol

_BLOCK = 512
#: What one yield of the stream holds at least (many small files) or at most (a large file).
CHUNK = 1 << 20


class Member(Protocol):
    """A file to archive, as a listing gives it (:class:`~ringtrain.jobs.models.FileInfo`)."""

    @property
    def path(self) -> str: ...  # relative to the job's folder, "/"-separated
    @property
    def size(self) -> int: ...
    @property
    def modified_at(self) -> float: ...


def tar_stream(files: Iterable[tuple[Member, int]]) -> Iterator[bytes]:
    """The tar archive of ``files`` (each with a readable descriptor), in chunks.

    Args:
        files: what to archive, e.g. :meth:`ringtrain.jobs.service.share.Share.iter_opened`; each
            descriptor is read before the next item is asked for.
    """
    out = bytearray()
    for info, fd in files:
        out += _header(info)
        left = info.size
        while left > 0:
            data = os.read(fd, min(CHUNK, left))
            if not data:  # shrank while sent: keep the announced size
                data = bytes(min(CHUNK, left))
            left -= len(data)
            out += data
            if len(out) >= CHUNK:
                yield bytes(out)
                out.clear()
        out += bytes(-info.size % _BLOCK)
        if len(out) >= CHUNK:
            yield bytes(out)
            out.clear()
    out += bytes(2 * _BLOCK)  # the end-of-archive marker: a client knows it got everything
    yield bytes(out)


def _header(info: Member) -> bytes:
    """The member's header: plain ustar when the name and size fit (a million small files spend
    most of their time here, and ``tarfile`` takes ten times as long), else pax."""
    name = info.path.encode("utf-8", "surrogateescape")
    mtime = int(info.modified_at)
    if len(name) > 100 or info.size >= 8**11 or not 0 <= mtime < 8**11:
        member = tarfile.TarInfo(info.path)
        member.size, member.mtime, member.mode = info.size, mtime, 0o644
        return member.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    size_field, mtime_field = b"%011o\0" % info.size, b"%011o\0" % mtime
    header = bytearray(_USTAR)
    header[0:len(name)] = name
    header[124:136] = size_field
    header[136:148] = mtime_field
    # The checksum is the sum of the header's bytes, its own field counted as spaces.
    checksum = _USTAR_SUM + sum(name) + sum(size_field) + sum(mtime_field)
    header[148:156] = b"%06o\0 " % checksum
    return bytes(header)


def _template() -> bytes:
    """A ustar header of a regular file, mode 0644, without name, size, mtime or checksum."""
    header = bytearray(_BLOCK)
    header[100:108] = b"0000644\0"
    header[108:116] = header[116:124] = b"0000000\0"
    header[148:156] = b" " * 8
    header[156:157] = tarfile.REGTYPE
    header[257:265] = tarfile.POSIX_MAGIC
    return bytes(header)


_USTAR = _template()
_USTAR_SUM = sum(_USTAR)
