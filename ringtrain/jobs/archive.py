"""A folder of a job as one tar stream, written while it is sent and resumable after any file.

``GET /v1/jobs/{id}/archive?path=outputs`` answers the files under ``outputs`` as an
uncompressed POSIX (pax) tar, in path order, each member named by its path relative to the job's
folder. Nothing is staged: each file is opened (without following links, see
:mod:`ringtrain.jobs.safe_open`) and copied as the client reads. A client that lost the
connection asks again with ``after=`` the last member it received whole, and gets the rest.

Only regular files are archived (no links, folders, pipes or devices), so extracting cannot
create anything but files. A file that shrinks while it is sent is padded with zeros to the size
announced in its header, and one that grows is cut at that size: the stream stays a valid tar.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterable, Iterator

from ringtrain.jobs.models import FileInfo

_BLOCK = 512
#: What one yield of the stream holds at least (many small files) or at most (a large file).
CHUNK = 1 << 20


def tar_stream(files: Iterable[tuple[FileInfo, int]]) -> Iterator[bytes]:
    """The tar archive of ``files`` (each with a readable descriptor), in chunks.

    Args:
        files: what to archive, e.g. :meth:`ringtrain.jobs.share.Share.iter_opened`; each
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


def _header(info: FileInfo) -> bytes:
    member = tarfile.TarInfo(info.path)
    member.size = info.size
    member.mtime = int(info.modified_at)
    member.mode = 0o644
    return member.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
