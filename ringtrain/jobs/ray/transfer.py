"""Files of a job carried through Ray, for nodes that do not see the service's share.

Such a node works in a private copy of the job's folder: the working dir comes to it as a tar,
with the spec's inputs that the node does not see at their paths, its logs go back as chunks read from offsets the service already holds (a chunk sent twice lands
at the same place, so nothing is lost or doubled when an answer is lost or the service
restarts), and its outputs go back as a tar once it exited. Both tars are bounded: a bigger one
is refused with a message naming the limit.

Imported by the node actor's worker: standard library only.
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

#: The most bytes of working dir and inputs, and of one node's outputs, carried through Ray.
TRANSFER_LIMIT = 64 << 20
#: The most bytes of one log file sent in one answer; a longer backlog goes in later answers.
LOG_CHUNK = 1 << 20
#: The job folder's subfolders holding logs, as the share lays them out.
LOG_FOLDERS = ("stdouterr", "prep")

#: A log chunk: the file's path in the job folder, the offset it starts at, its bytes.
Chunk = tuple[str, int, bytes]


class TooLargeError(ValueError):
    """A folder too big to carry through Ray; the message says which and how big."""


def pack(folder: Path, what: str, limit: int = TRANSFER_LIMIT) -> bytes:
    """The files below ``folder`` as an uncompressed tar (see :func:`pack_tree`)."""
    return pack_tree({".": folder}, what, limit)


def pack_tree(parts: dict[str, Path], what: str, limit: int = TRANSFER_LIMIT) -> bytes:
    """Files and folders as one uncompressed tar, each at its own path in it.

    Args:
        parts: what to pack (a file, or a folder with everything below it), by its path in
            the tar.
        what: what it is, for the error message (e.g. ``"the working dir"``).
        limit: the most bytes its files may add up to.

    Raises:
        TooLargeError: the files add up to more than ``limit``.
        OSError: a file cannot be read.
    """
    size = sum(_size(path) for path in parts.values())
    if size > limit:
        raise TooLargeError(f"{what} holds {size / 2**20:.1f} MiB, over the "
                            f"{limit / 2**20:g} MiB a Ray node without the service's "
                            "share can exchange with it; mount the share (and the inputs) on "
                            "every Ray node at the service's paths (docs/jobs.md, Ray clusters)")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for arcname, path in parts.items():
            tar.add(path, arcname=arcname)
    return buffer.getvalue()


def input_arcname(name: str, path: str) -> str:
    """Where the input ``name`` at ``path`` goes in a private copy: ``inputs/<name>/<its name>``
    (the file or folder keeps its own name, extension included)."""
    return f"inputs/{name}/{os.path.basename(path.rstrip('/')) or name}"


def private_copy(job_dir: Path, inputs: dict[str, str]) -> bytes | str:
    """What a node without the share needs: the job's working dir and ``inputs`` (its inputs
    the node does not see, by name), as a tar from :func:`pack_tree`, or why there is none.

    Args:
        job_dir: the job's folder on the share.
        inputs: the paths of the inputs to send, as the service sees them, by name.
    """
    wd = job_dir / "wd"
    if not wd.is_dir():
        return f"the service has no working dir at {wd}"
    parts = {"wd": wd}
    for name, path in inputs.items():
        if "://" in path or not os.path.exists(path):
            return f"the service has no input {name} at {path!r}"
        parts[input_arcname(name, path)] = Path(path)
    what = "the working dir" + (f" and inputs {', '.join(inputs)}" if inputs else "")
    try:
        return pack_tree(parts, what)
    except TooLargeError as e:
        return str(e)
    except OSError as e:
        return f"the service cannot read {what}: {e}"


def _size(path: Path) -> int:
    if not path.is_dir():
        return os.lstat(path).st_size
    return sum(os.lstat(os.path.join(top, name)).st_size
               for top, _, names in os.walk(path) for name in names)


def unpack(data: bytes, folder: Path) -> None:
    """Extract a tar from :func:`pack` into ``folder`` (no links out, no absolute paths).

    Raises:
        tarfile.TarError: the tar is malformed or names a path outside ``folder``.
        OSError: a file cannot be written.
    """
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        tar.extractall(folder, filter="data")


def log_sizes(job_dir: Path) -> dict[str, int]:
    """The size of every log file of a job folder, by its path in the folder."""
    sizes = {}
    for sub in LOG_FOLDERS:
        for top, _, names in os.walk(job_dir / sub):
            for name in names:
                path = os.path.join(top, name)
                sizes[os.path.relpath(path, job_dir)] = os.path.getsize(path)
    return sizes


def new_log_chunks(job_dir: Path, offsets: dict[str, int]) -> tuple[list[Chunk], bool]:
    """What the log files of ``job_dir`` hold past ``offsets`` (0 for a file not there).

    Returns:
        The chunks, at most :data:`LOG_CHUNK` bytes of each file, and whether any file had more.
    """
    chunks, more = [], False
    for rel, size in log_sizes(job_dir).items():
        start = offsets.get(rel, 0)
        if size <= start:
            continue
        with open(job_dir / rel, "rb") as f:
            f.seek(start)
            data = f.read(LOG_CHUNK)
        more = more or start + len(data) < size
        chunks.append((rel, start, data))
    return chunks, more


def write_log_chunks(job_dir: Path, chunks: list[Chunk]) -> None:
    """Write chunks from :func:`new_log_chunks` into the job folder on the share.

    Raises:
        ValueError: a chunk names a path outside the job's log folders.
        OSError: a file cannot be written.
    """
    for rel, start, data in chunks:
        parts = Path(rel).parts
        if not parts or parts[0] not in LOG_FOLDERS or ".." in parts or Path(rel).is_absolute():
            raise ValueError(f"a Ray node sent a log chunk for {rel!r}, outside the job's logs")
        path = job_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "r+b" if path.exists() else "wb") as f:
            f.seek(start)
            f.write(data)
