"""Files of a job carried through Ray, for nodes that do not see the service's share.

Such a node works in a private copy of the job's folder. Everything crosses Ray in pieces of at
most :data:`ANSWER_BYTES` per message, so no file is too big to carry and no Ray message holds a
whole big file:

* **In**: the service packs the working dir, with the spec's inputs the node does not see at
  their paths, as one tar into a temporary file, in a thread (:class:`PrivateCopy`); the node
  reports how much of it it holds and is sent the next piece of what is written
  (:class:`TarReceiver`), then unpacks it once the tar is complete.
* **Out**: the node's logs, and once it exited its outputs, go back as chunks read from the
  sizes the share already holds (:func:`new_chunks`, :func:`write_chunks`): a chunk sent twice
  lands at the same place, so nothing is lost or doubled when an answer is lost, and a restarted
  service resumes from what the share holds.

Imported by the node actor's worker: standard library only.
"""

from __future__ import annotations

import os
import stat
import tarfile
import tempfile
import threading
from pathlib import Path

from ringtrain.jobs.job_folder import LOGS, OUTPUTS, PREP, WORKING_DIR

#: The most file bytes one Ray message carries, in either direction.
ANSWER_BYTES = 8 << 20
#: The most bytes of one log file in one answer, so one busy log does not hold back the others.
LOG_CHUNK = 1 << 20
#: The job folder's subfolders holding logs, as the share lays them out.
LOG_FOLDERS = (LOGS, PREP)
#: The job folder's subfolder holding outputs.
OUTPUT_FOLDERS = (OUTPUTS,)

#: A chunk of a file: its path in the job folder, the offset it starts at, its bytes.
Chunk = tuple[str, int, bytes]
#: A piece of a private copy's tar: its offset, its bytes, and the tar's whole size (-1 while
#: the service still writes it).
Piece = tuple[int, bytes, int]


def input_arcname(name: str, path: str) -> str:
    """Where the input ``name`` at ``path`` goes in a private copy: ``inputs/<name>/<its name>``
    (the file or folder keeps its own name, extension included)."""
    return f"inputs/{name}/{os.path.basename(path.rstrip('/')) or name}"


class PrivateCopy:
    """What a node without the share needs, as a tar in a temporary file, sent in pieces.

    The tar is written by a thread of its own, so that a big working dir or input does not hold
    up the caller (the scheduler's tick): pieces of what is written are sent while it grows.

    Args:
        parts: what to pack (a file, or a folder with everything below it), by its path in
            the tar.
        what: what it is, for the message when a file cannot be read.
    """

    def __init__(self, parts: dict[str, Path], what: str, piece_bytes: int = ANSWER_BYTES):
        self.piece_bytes = piece_bytes
        # Held open until close(): pieces are read from it while the nodes ask. Unbuffered, so
        # that every byte counted in `written` is in the file.
        self._file = tempfile.TemporaryFile(prefix="ringtrain-ray-copy.",  # noqa: SIM115
                                            buffering=0)
        self.written = 0
        self.size: int | None = None  # once complete
        self.problem: str | None = None
        self._what = what
        self._packer = threading.Thread(target=self._pack, args=(parts,), daemon=True,
                                        name="ray-private-copy")
        self._packer.start()

    def piece(self, offset: int) -> Piece | str:
        """The piece of the tar starting at ``offset`` (empty past what is written so far, its
        size -1 while it is written), or why there is none."""
        size = self.size  # before `written`: once complete, everything is written
        if self.problem is not None:
            return self.problem
        data = os.pread(self._file.fileno(), max(min(self.piece_bytes, self.written - offset), 0),
                        offset)
        return offset, data, -1 if size is None else size

    def close(self) -> None:
        """Remove the temporary file (a tar still being written stops)."""
        self._file.close()

    def write(self, data: bytes) -> int:
        """Append to the tar (its file object, for :mod:`tarfile`)."""
        view = memoryview(data)
        while view:
            view = view[self._file.write(view):]
            self.written = self._file.tell()
        return len(data)

    def tell(self) -> int:
        """The tar's size so far (its file object, for :mod:`tarfile`)."""
        return self.written

    def _pack(self, parts: dict[str, Path]) -> None:
        try:
            with tarfile.open(fileobj=self, mode="w") as tar:  # type: ignore[call-overload]
                for arcname, path in parts.items():
                    tar.add(path, arcname=arcname)
            self.size = self.written
        except (OSError, ValueError) as e:  # ValueError: closed while it was written
            self.problem = f"the service cannot read {self._what}: {e}"


def private_copy(job_dir: Path, inputs: dict[str, str],
                 piece_bytes: int = ANSWER_BYTES) -> PrivateCopy | str:
    """The working dir of the job's folder ``job_dir`` and ``inputs`` (the paths, as the
    service sees them, of the inputs a node does not see, by name) as a :class:`PrivateCopy`,
    or why there is none."""
    wd = job_dir / WORKING_DIR
    if not wd.is_dir():
        return f"the service has no working dir at {wd}"
    parts = {WORKING_DIR: wd}
    for name, path in inputs.items():
        if "://" in path or not os.path.exists(path):
            return f"the service has no input {name} at {path!r}"
        parts[input_arcname(name, path)] = Path(path)
    what = "the working dir" + (f" and inputs {', '.join(inputs)}" if inputs else "")
    try:
        return PrivateCopy(parts, what, piece_bytes)
    except OSError as e:
        return f"the service cannot write a copy of {what} in its temporary folder: {e}"


class TarReceiver:
    """The node's end of a :class:`PrivateCopy`: pieces written in order into ``path``
    (created empty here; OSError if it cannot be)."""

    def __init__(self, path: Path):
        self.path = path
        self.received = 0
        self._total: int | None = None
        path.write_bytes(b"")

    def take(self, piece: Piece) -> bool:
        """Write a piece if it is the next one (a repeated or early one is dropped); whether the
        whole tar has arrived. Raises OSError if the file cannot be written.

        A piece of a complete tar of another size than one before (the service restarted and
        packed files that changed meanwhile) starts the transfer over.
        """
        offset, data, total = piece
        if total >= 0 and self._total is not None and self._total != total:
            self.received = 0
            self.path.write_bytes(b"")
        if total >= 0:
            self._total = total
        if offset == self.received and data:
            with open(self.path, "r+b") as f:
                f.seek(offset)
                f.write(data)
            self.received += len(data)
        return self._total is not None and self.received >= self._total


def unpack(tar_path: Path, folder: Path) -> None:
    """Extract a tar into ``folder`` (no links out, no absolute paths).

    Raises:
        tarfile.TarError: the tar is malformed or names a path outside ``folder``.
        OSError: a file cannot be written.
    """
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar_path, mode="r") as tar:
        tar.extractall(folder, filter="data")


def file_sizes(job_dir: Path, folders: tuple[str, ...]) -> dict[str, int]:
    """The size of every regular file below ``folders`` of a job folder, by its path in the
    folder (links are left out: they are not carried)."""
    sizes = {}
    for sub in folders:
        for top, _, names in os.walk(job_dir / sub):
            for name in names:
                path = os.path.join(top, name)
                try:
                    info = os.lstat(path)
                except FileNotFoundError:  # removed since it was listed
                    continue
                if stat.S_ISREG(info.st_mode):
                    sizes[os.path.relpath(path, job_dir)] = info.st_size
    return sizes


def new_chunks(job_dir: Path, offsets: dict[str, int], folders: tuple[str, ...],
               budget: int = ANSWER_BYTES,
               per_file: int | None = None) -> tuple[list[Chunk], list[str]]:
    """What the files below ``folders`` of ``job_dir`` hold past ``offsets`` (how much of each
    file the receiver holds; a file not in it starts at 0, and an empty one is sent as an empty
    chunk, so that it is created): the chunks, at most ``budget`` bytes in all and ``per_file``
    of one file, and the files that still have bytes past them."""
    chunks, pending = [], []
    for rel, size in file_sizes(job_dir, folders).items():
        start = offsets.get(rel, 0)
        if size < start or (size == start and rel in offsets):
            continue
        take = min(size - start, budget, per_file if per_file is not None else budget)
        data = b""
        if take:
            with open(job_dir / rel, "rb") as f:
                f.seek(start)
                data = f.read(take)
        if data or size == 0:
            chunks.append((rel, start, data))
        budget -= len(data)
        if start + len(data) < size:
            pending.append(rel)
    return chunks, pending


def write_chunks(job_dir: Path, chunks: list[Chunk], folders: tuple[str, ...]) -> None:
    """Write chunks from :func:`new_chunks` into the job folder on the share, at their offsets.

    Raises:
        ValueError: a chunk names a path outside ``folders`` of the job folder, or one through
            a symbolic link.
        OSError: a file cannot be written.
    """
    for rel, start, data in chunks:
        parts = Path(rel).parts
        if not parts or parts[0] not in folders or ".." in parts or Path(rel).is_absolute() \
                or len(parts) < 2:
            raise ValueError(f"a Ray node sent a chunk for {rel!r}, outside the job's "
                             f"{' and '.join(folders)}")
        folder = job_dir
        for part in parts[:-1]:
            folder = folder / part
            if folder.is_symlink():
                raise ValueError(f"a Ray node sent a chunk for {rel!r}, through the link "
                                 f"{folder}")
            folder.mkdir(exist_ok=True)
        if (job_dir / rel).is_symlink():
            raise ValueError(f"a Ray node sent a chunk for {rel!r}, a link on the share")
        fd = os.open(job_dir / rel, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        with open(fd, "wb") as f:
            f.seek(start)
            f.write(data)
