"""The archive a remote ``job submit`` uploads: its working dir and local inputs as one tar.

Members are regular files (and nothing else) named ``wd/<path>`` (the working dir, less what it
ignores: :mod:`ringtrain.jobs.files.workdir`) and ``inputs/<name>`` or ``inputs/<name>/<path>``
(a local input, a file or a folder). The client writes them sorted, with their real sizes and
mtimes, so the same folders give the same bytes again and a killed upload resumes at any byte
(:func:`pack`, :meth:`Packed.stream`).

The service trusts none of it: :class:`TarChecker` reads each header as the bytes arrive and
refuses a member that is not a regular file or folder, a path that is absolute, holds ``..`` or
lies outside ``wd/`` and ``inputs/``, or file bytes past the limit; :func:`extract` writes a
checked archive into a fresh folder, creating nothing but folders and files.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ringtrain.jobs.errors import InvalidRequestError, brief
from ringtrain.jobs.files.archive import CHUNK, _header
from ringtrain.jobs.files.extract import _padded, _parse_header, _pax_records
from ringtrain.jobs.files.workdir import CopyFilter

_BLOCK = 512
_RECORD = 20 * _BLOCK  # what tar pads an archive to, at most
_FILES = (tarfile.REGTYPE, tarfile.AREGTYPE)
WORKING_DIR = "wd"
INPUTS = "inputs"
#: What a submit's spec names an uploaded working dir or input by: ``upload://wd`` and
#: ``upload://inputs/NAME`` as sent; the service records ``upload://<key>`` as the working dir
#: and each input's path in the job's folder.
UPLOAD_SCHEME = "upload://"


class UploadRejected(InvalidRequestError):
    """The uploaded archive is refused (a link, an unsafe path, too large, malformed)."""


@dataclass(frozen=True)
class _File:
    path: str  # the member's name
    source: str  # the local file
    size: int
    modified_at: float


@dataclass(frozen=True)
class Packed:
    """The archive of a submit, described before it is written."""

    files: tuple[_File, ...]
    #: Changes whenever a member's name, size or mtime does: a resume needs the same one.
    manifest: str
    skipped_links: tuple[str, ...] = ()

    @property
    def file_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def size(self) -> int:
        """The archive's bytes (exact: a file that changes size keeps the announced one)."""
        return sum(len(_header(f)) + _padded(f.size) for f in self.files) + 2 * _BLOCK

    def stream(self, start: int = 0) -> Iterator[bytes]:
        """The archive's bytes from byte ``start`` on, in chunks of about 1 MiB; members wholly
        before ``start`` are not read."""
        pos = 0
        out = bytearray()
        for f in self.files:
            header = _header(f)
            end = pos + len(header) + _padded(f.size)
            if end <= start:
                pos = end
                continue
            member = _member_bytes(f, header)
            skip = max(0, start - pos)
            for piece in member:
                if skip >= len(piece):
                    skip -= len(piece)
                    continue
                if skip:
                    piece, skip = piece[skip:], 0
                if len(piece) >= CHUNK // 2:  # a large file's read: sent as it is, uncopied
                    if out:
                        yield bytes(out)
                        out.clear()
                    yield piece
                    continue
                out += piece
                if len(out) >= CHUNK:
                    yield bytes(out)
                    out.clear()
            pos = end
        tail = bytes(2 * _BLOCK)
        out += tail[max(0, start - pos):]
        if out:
            yield bytes(out)


def _member_bytes(f: _File, header: bytes) -> Iterator[bytes]:
    yield header
    left = f.size
    fd = os.open(f.source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        while left > 0:
            data = os.read(fd, min(CHUNK, left))
            if not data:  # shrank meanwhile: keep the announced size
                data = bytes(min(CHUNK, left))
            left -= len(data)
            yield data
    finally:
        os.close(fd)
    yield bytes(-f.size % _BLOCK)


def pack(working_dir: Path | None, inputs: dict[str, Path]) -> Packed:
    """Describe the archive of ``working_dir`` (its copy, by the ignore rules) and ``inputs``
    (files or folders, whole). Symbolic links are left out (named in ``skipped_links``).

    Raises:
        OSError: a folder cannot be read.
    """
    files: list[_File] = []
    links: list[str] = []
    if working_dir is not None:
        files += _walk(working_dir, WORKING_DIR, CopyFilter(working_dir), links)
    for name in sorted(inputs):
        path = inputs[name]
        prefix = f"{INPUTS}/{name}"
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode):
            files.append(_File(prefix, str(path), st.st_size, int(st.st_mtime)))
        elif stat.S_ISDIR(st.st_mode):
            files += _walk(path, prefix, None, links)
        else:
            links.append(str(path))
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{f.path}\0{f.size}\0{int(f.modified_at)}\n".encode("utf-8",
                                                                          "surrogateescape"))
    return Packed(tuple(files), digest.hexdigest()[:32], tuple(links))


def _walk(root: Path, prefix: str, skip: CopyFilter | None, links: list[str]) -> list[_File]:
    found: list[_File] = []
    for folder, dirs, names in os.walk(root):
        if skip is not None:
            for group in (dirs, names):
                gone = skip(folder, group)
                group[:] = [n for n in group if n not in gone]
        dirs.sort()
        rel_folder = Path(folder).relative_to(root).as_posix()
        for name in sorted(names):
            path = os.path.join(folder, name)
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode):
                links.append(path)
                continue
            rel = name if rel_folder == "." else f"{rel_folder}/{name}"
            found.append(_File(f"{prefix}/{rel}", path, st.st_size, int(st.st_mtime)))
        for d in list(dirs):
            if os.path.islink(os.path.join(folder, d)):
                links.append(os.path.join(folder, d))
    # os.walk visits a folder's files before its sub-folders' ones: sort by member name.
    return sorted(found, key=lambda f: f.path)


def checked_name(name: str) -> str:
    """A member name the service accepts: relative, no ``.``/``..``/empty parts, below ``wd/``
    or ``inputs/<name>``.

    Raises:
        UploadRejected: any other.
    """
    parts = name.rstrip("/").split("/")
    if (name.startswith("/") or "\0" in name or any(p in ("", ".", "..") for p in parts)
            or parts[0] not in (WORKING_DIR, INPUTS) or (parts[0] == INPUTS and len(parts) < 2)):
        raise UploadRejected(f"upload refused: the member {brief(name)} is not a relative path "
                             f"below {WORKING_DIR}/ or {INPUTS}/NAME (no '..', no absolute path)")
    return "/".join(parts)


class TarChecker:
    """Checks a tar stream's headers as its bytes arrive (the data between them is counted, not
    kept).

    Args:
        max_file_bytes: the most bytes its files may hold together.
    """

    def __init__(self, max_file_bytes: int):
        self.max_file_bytes = max_file_bytes
        self.received = 0
        self.file_bytes = 0
        #: The end-of-archive block came: the archive is whole.
        self.complete = False
        self._skip = 0  # data bytes of the current member still to come
        self._pending = b""  # a header (or pax records) not yet whole
        self._need = _BLOCK
        self._pax: dict[str, str] = {}
        self._pax_size: int | None = None
        self._trailer = 0

    def feed(self, data: bytes) -> None:
        """Check the next bytes of the stream.

        Raises:
            UploadRejected: a member the service refuses, or bytes after the end.
        """
        view = memoryview(data)
        while view:
            if self.complete:  # the second zero block, and tar's padding to a record
                self._trailer += len(view)
                if self._trailer > _RECORD or any(view):
                    raise UploadRejected("upload refused: bytes after the end of the archive")
                self.received += len(view)
                return
            if self._skip:
                n = min(self._skip, len(view))
                self._skip -= n
                self.received += n
                view = view[n:]
                continue
            n = min(self._need - len(self._pending), len(view))
            self._pending += bytes(view[:n])
            self.received += n
            view = view[n:]
            if len(self._pending) == self._need:
                block, self._pending = self._pending, b""
                self._take(block)

    def _take(self, block: bytes) -> None:
        if self._pax_size is not None:  # pax records, whole
            self._pax = _pax_records(block, self._pax_size)
            self._pax_size, self._need = None, _BLOCK
            return
        if block == bytes(_BLOCK):
            self.complete = True
            return
        try:
            name, size, kind = _parse_header(block)
        except InvalidRequestError:
            raise UploadRejected("upload refused: not a tar archive (a header's checksum or "
                                 "numbers are wrong)") from None
        size = int(self._pax.get("size", size)) if kind != tarfile.XHDTYPE else size
        if kind == tarfile.XHDTYPE:
            if not 0 < size <= 64 << 10:
                raise UploadRejected("upload refused: a pax header empty or over 64 KiB")
            self._pax_size, self._need = size, _padded(size)
            return
        name = checked_name(self._pax.get("path", name))
        self._pax = {}
        if kind == tarfile.DIRTYPE:
            return
        if kind not in _FILES:
            what = {tarfile.SYMTYPE: "a symbolic link", tarfile.LNKTYPE: "a hard link",
                    tarfile.CHRTYPE: "a device", tarfile.BLKTYPE: "a device",
                    tarfile.FIFOTYPE: "a named pipe"}.get(kind, f"of type {kind!r}")
            raise UploadRejected(f"upload refused: the member {brief(name)} is {what}; only "
                                 "regular files and folders are accepted")
        self.file_bytes += size
        if self.file_bytes > self.max_file_bytes:
            raise UploadRejected(f"upload refused: its files hold more than "
                                 f"{self.max_file_bytes / 1e6:g} MB, the service's limit on a "
                                 "working dir")
        self._skip = _padded(size)


def extract(tar_path: Path, dest: Path, max_file_bytes: int) -> None:
    """Write the files of the checked archive ``tar_path`` below the folder ``dest``, which
    holds no ``wd/`` nor ``inputs/`` yet (``dest/wd`` always exists after).

    Raises:
        UploadRejected: a member is refused (see :class:`TarChecker`), or the archive ends early.
    """
    (dest / WORKING_DIR).mkdir()
    made = {dest, dest / WORKING_DIR}
    pax: dict[str, str] = {}
    total = 0
    with open(tar_path, "rb") as src:
        while True:
            block = src.read(_BLOCK)
            if len(block) < _BLOCK:
                raise UploadRejected("upload refused: the archive ends before its end marker")
            if block == bytes(_BLOCK):
                return
            try:
                name, size, kind = _parse_header(block)
            except InvalidRequestError:
                raise UploadRejected("upload refused: not a tar archive") from None
            if kind == tarfile.XHDTYPE:
                pax = _pax_records(src.read(_padded(size)), size)
                continue
            size = int(pax.get("size", size))
            rel = checked_name(pax.get("path", name))
            pax = {}
            target = dest / rel
            if kind == tarfile.DIRTYPE:
                target.mkdir(parents=True, exist_ok=True)
                continue
            if kind not in _FILES:
                raise UploadRejected(f"upload refused: the member {brief(rel)} is not a file")
            total += size
            if total > max_file_bytes:
                raise UploadRejected("upload refused: larger than the service's limit")
            if target.parent not in made:
                target.parent.mkdir(parents=True, exist_ok=True)
                made.add(target.parent)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o644)
            with open(fd, "wb", closefd=True) as out:
                left = size
                while left:
                    data = src.read(min(CHUNK, left))
                    if not data:
                        raise UploadRejected("upload refused: the archive ends inside a file")
                    out.write(data)
                    left -= len(data)
            src.seek(_padded(size) - size, os.SEEK_CUR)

