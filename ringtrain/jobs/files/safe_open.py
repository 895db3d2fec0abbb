"""The one way to open what a job left in its folder.

A job controls its folder: any entry may be a symbolic link to a secret, a named pipe that blocks
whoever opens it, a socket or a device. Every route and command that reads there (logs, file
listings, downloads, archives, outputs, metrics) opens through :func:`open_path`:

* one component at a time from the parent folder's descriptor, with ``O_NOFOLLOW`` on each, so a
  link anywhere on the path is refused, even one swapped in while the path is walked;
* with ``O_NONBLOCK``, so opening a named pipe returns at once instead of waiting for a writer
  (the wait that froze every job's logs in issue 22);
* then checked through the descriptor itself: only folders and regular files are kept.

What is served is the descriptor that was checked, never the name again.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ringtrain.jobs.errors import InvalidRequestError, NotFoundError, brief

#: Linux's PATH_MAX and NAME_MAX: no path or component of a real file is longer, so a longer one
#: is refused at once (here, and in a spec's paths).
MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255

_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_KINDS = {stat.S_IFIFO: "a named pipe", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a device",
          stat.S_IFBLK: "a device", stat.S_IFLNK: "a symbolic link"}


def split_path(relpath: str) -> list[str]:
    """The components of a path relative to a job's folder, ``.`` and ``..`` applied. Raises
    InvalidRequestError if it has a NUL byte, is not UTF-8, is too long, is absolute or leads
    outside."""
    if "\0" in relpath:
        raise InvalidRequestError(f"path {brief(relpath)} contains a NUL byte; paths are relative "
                                  "to the job's folder (e.g. outputs/model)")
    try:
        size = len(os.fsencode(relpath))
    except UnicodeEncodeError:
        raise InvalidRequestError(f"path {brief(relpath)} is not valid UTF-8") from None
    if size > MAX_PATH_BYTES:
        raise InvalidRequestError(f"path {brief(relpath)} is longer than {MAX_PATH_BYTES} bytes")
    if relpath.startswith("/"):
        raise InvalidRequestError(f"path {brief(relpath)} must be relative to the job's folder")
    parts: list[str] = []
    for name in relpath.split("/"):
        if name in ("", "."):
            continue
        if name == "..":
            if not parts:
                raise InvalidRequestError(f"path {brief(relpath)} leads outside the job's folder; "
                                          "paths are relative to it (e.g. outputs/model)")
            parts.pop()
        elif len(os.fsencode(name)) > MAX_NAME_BYTES:
            raise InvalidRequestError(f"path {brief(relpath)} has a component longer than "
                                      f"{MAX_NAME_BYTES} bytes; no file has such a name")
        else:
            parts.append(name)
    return parts


@contextmanager
def open_path(folder: Path, relpath: str) -> Iterator[int]:
    """A descriptor of the folder or regular file at ``relpath`` below ``folder``; closed on exit.

    ``folder`` (a job's) itself is trusted (the service made it); every component of ``relpath``
    (as a client names it: ``outputs/model/m.pt``) is opened without following links and must be
    a folder or, for the last one, a regular file.

    Raises:
        InvalidRequestError: the path is malformed or leads outside (see :func:`split_path`),
            goes through a symbolic link, or names a named pipe, socket or device.
        NotFoundError: nothing exists at the path, or the folder itself is missing.
    """
    parts = split_path(relpath)
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise NotFoundError(f"no folder {brief(str(folder))}") from None
    try:
        for name in parts:
            child = open_below(fd, name, relpath)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def open_regular(folder: Path, relpath: str) -> int:
    """A new descriptor of the regular file at ``relpath`` below ``folder``; raises as
    :func:`open_path`, and InvalidRequestError for a folder."""
    with open_path(folder, relpath) as fd:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise InvalidRequestError(f"{brief(relpath)} is a folder, not a file")
        return os.dup(fd)


def open_below(dir_fd: int, name: str, relpath: str) -> int:
    """Open the entry ``name`` (one path component) of the folder ``dir_fd``: a folder or
    regular file, never a link. ``relpath`` is the whole path, for messages.

    Raises:
        InvalidRequestError: the entry is a link, named pipe, socket or device.
        NotFoundError: there is no such entry, or the parent is not a folder.
    """
    try:
        fd = os.open(name, _FLAGS, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        raise NotFoundError(f"no file or folder {brief(relpath)} in the job's folder") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InvalidRequestError(f"path {brief(relpath)} goes through the symbolic link "
                                      f"{brief(name)}; links in a job's folder are not "
                                      "followed") from None
        if e.errno == errno.ENXIO:  # a socket, or a device without its driver
            raise _not_regular(relpath, "a socket or device") from None
        raise InvalidRequestError(f"cannot open {brief(relpath)}: {e.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        os.close(fd)
        raise _not_regular(relpath, _KINDS.get(stat.S_IFMT(mode), "not a file"))
    return fd


def _not_regular(relpath: str, kind: str) -> InvalidRequestError:
    return InvalidRequestError(f"path {brief(relpath)} is {kind}, not a regular file or folder; "
                               "only regular files are served")
