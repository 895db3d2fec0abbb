"""The share: one folder per job, holding its working dir, logs, preparation output and outputs.

Layout under the share root::

    jobs/<id>/wd/                       the working_dir copied at submit time (the ranks' cwd),
                                        less what it ignores (see ringtrain.jobs.workdir)
    jobs/<id>/stdouterr/rank.N/stdout   each rank's output, written by `ringtrain run`
    jobs/<id>/prep/node.K.{stdout,stderr}
    jobs/<id>/outputs/<name>/           one folder per spec output
    jobs/<id>/launcher/                 the job runner's launch file, status file and log
    jobs/<id>/attempts/<n>/             logs of earlier attempts of a retried job

A path a client names is opened once, one component at a time from the job folder's descriptor,
never following a symbolic link (``O_NOFOLLOW`` on every component), and what is served is that
descriptor: a job cannot swap a checked file for a link between the check and the read.

Hard links are served like any file. Making one needs read access to its target
(``fs.protected_hardlinks``), and every job runs as the service's user, so a hard link exposes
nothing the job could not copy into its folder; refusing files with several links would refuse
legitimate outputs (hard-linked checkpoints) and protect nothing.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from ringtrain.jobs import envvars
from ringtrain.jobs.errors import InvalidRequestError, NotFoundError, brief
from ringtrain.jobs.models import FileInfo, JobInfo, JobSpec
from ringtrain.jobs.models.spec import MAX_NAME_BYTES, MAX_PATH_BYTES, expand_path
from ringtrain.jobs.workdir import CopyFilter


class Share:
    """The job folders under one share root (a local directory).

    Args:
        root: the share root; created if missing.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()

    def job_dir(self, job_id: str) -> Path:
        """The folder of one job."""
        return self.root / "jobs" / job_id

    def create_job_dir(self, job_id: str, spec: JobSpec) -> Path:
        """Create a job's folder: copy its working dir and make its output folders.

        Raises:
            InvalidRequestError: the working dir is not a folder, holds a named pipe, socket or
                device, or cannot be copied; the message names the file.
        """
        job_dir = self.job_dir(job_id)
        wd = job_dir / "wd"
        job_dir.parent.mkdir(parents=True, exist_ok=True)
        job_dir.mkdir()
        try:
            if spec.working_dir:
                self._copy_working_dir(spec.working_dir, wd)
            else:
                wd.mkdir()
            for name in spec.outputs:
                (job_dir / "outputs" / name).mkdir(parents=True)
            for sub in ("stdouterr", "prep", "launcher"):
                (job_dir / sub).mkdir(exist_ok=True)
        except BaseException:
            shutil.rmtree(job_dir, ignore_errors=True)
            raise
        return job_dir

    def _copy_working_dir(self, working_dir: str, wd: Path) -> None:
        try:
            src = expand_path(working_dir)
        except ValueError as e:
            raise InvalidRequestError(f"working_dir: {e}") from None
        if not src.is_dir():
            raise InvalidRequestError(f"working_dir: {brief(str(src))} is not a folder")
        root = os.stat(self.root)
        # .gitignore, .ringtrainignore, environments and caches, any ringtrain home.
        patterns = CopyFilter(src)

        def ignore(folder: str, names: list[str]) -> set[str]:
            skipped = patterns(folder, names)
            for name in names:
                if name in skipped:
                    continue
                st = os.lstat(os.path.join(folder, name))
                # The share may live inside the working dir (RINGTRAIN_HOME=./.ringtrain).
                if (st.st_dev, st.st_ino) == (root.st_dev, root.st_ino):
                    skipped.add(name)
                elif special := _SPECIAL.get(stat.S_IFMT(st.st_mode)):
                    # Copying a named pipe would block on it; a device would read the device.
                    raise InvalidRequestError(
                        f"working_dir: {brief(os.path.join(folder, name), 200)} is a {special}; "
                        "only files, folders and symbolic links are copied: move it out of the "
                        "working dir")
            return skipped

        try:
            shutil.copytree(src, wd, symlinks=True, ignore=ignore)
        except shutil.Error as e:
            failed = e.args[0]
            first_src, _, why = failed[0]
            raise InvalidRequestError(f"working_dir: cannot copy {len(failed)} entries, e.g. "
                                      f"{brief(first_src, 200)}: {why}") from None
        except OSError as e:
            raise InvalidRequestError(f"working_dir: cannot copy {brief(e.filename or str(src))}: "
                                      f"{e.strerror}") from None

    def job_environ(self, job: JobInfo) -> dict[str, str]:
        """The variables every process of a job gets besides the spec's ``environment``."""
        job_dir = Path(job.job_dir)
        env = dict(job.spec.environment)
        env[envvars.JOB_ID] = job.id
        env[envvars.SHARE_ROOT] = str(self.root)
        env[envvars.JOB_DIR] = str(job_dir)
        for name, path in job.spec.inputs.items():
            env[envvars.input_var(name)] = path
        for name in job.spec.outputs:
            env[envvars.output_var(name)] = str(job_dir / "outputs" / name)
        return env

    def open_file(self, job_id: str, relpath: str) -> BinaryIO:
        """Open a regular file of a job's folder for reading, following no symbolic link.

        Raises:
            InvalidRequestError: the path is malformed, leads outside the folder, goes through a
                symbolic link, or names a folder or something that is not a regular file.
            NotFoundError: nothing exists at the path.
        """
        with self._opened(job_id, relpath) as fd:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                raise InvalidRequestError(f"{brief(relpath)} is a folder; list it with `job files`")
            f = os.fdopen(os.dup(fd), "rb")
        return f

    def list_files(self, job_id: str, relpath: str = "") -> list[FileInfo]:
        """Regular files under a path of a job's folder (recursively), sorted by path.

        Symbolic links are neither followed nor listed, and neither are named pipes, sockets or
        devices: only what :meth:`open_file` would serve.

        Raises:
            InvalidRequestError: the path is malformed, leads outside the folder or goes through
                a symbolic link.
            NotFoundError: nothing exists at the path.
        """
        parts = _parts(relpath)
        prefix = "/".join(parts)
        with self._opened(job_id, relpath) as fd:
            st = os.fstat(fd)
            if not stat.S_ISDIR(st.st_mode):
                return [FileInfo(path=prefix, size=st.st_size, modified_at=st.st_mtime)]
            out = []
            # fwalk works from descriptors and never enters a symlinked folder, even one swapped
            # in while it walks.
            for folder, _dirs, names, dir_fd in os.fwalk(".", dir_fd=fd):
                for name in names:
                    try:
                        entry = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                    except FileNotFoundError:  # removed while listed
                        continue
                    if stat.S_ISREG(entry.st_mode):
                        path = os.path.normpath(os.path.join(prefix, folder, name))
                        out.append(FileInfo(path=path, size=entry.st_size,
                                            modified_at=entry.st_mtime))
        return sorted(out, key=lambda f: f.path.split("/"))

    @contextmanager
    def _opened(self, job_id: str, relpath: str) -> Iterator[int]:
        """A descriptor of a folder or regular file of a job's folder, reached one component at a
        time without following links; closed on exit."""
        parts = _parts(relpath)
        if "/" in job_id or job_id in ("", ".", ".."):
            raise NotFoundError(f"no job with id {brief(job_id)}")
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NotFoundError(f"no folder for job {brief(job_id)}") from None
        try:
            for name in ["jobs", job_id, *parts]:
                child = _open_below(fd, name, relpath)
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)

    def log_path(self, job_id: str, rank: int, stream: str) -> Path:
        """Where ``ringtrain run`` writes one rank's stdout or stderr."""
        return self.job_dir(job_id) / "stdouterr" / f"rank.{rank}" / stream

    def archive_attempt(self, job_id: str, attempt: int) -> None:
        """Move an earlier attempt's logs to ``attempts/<attempt>/`` before a retry starts."""
        job_dir = self.job_dir(job_id)
        dest = job_dir / "attempts" / str(attempt)
        dest.mkdir(parents=True, exist_ok=True)
        for sub in ("stdouterr", "prep", "launcher"):
            if (job_dir / sub).exists():
                shutil.move(str(job_dir / sub), str(dest / sub))
            (job_dir / sub).mkdir()

    def remove_job_dir(self, job_id: str) -> None:
        """Delete a job's folder and everything in it."""
        shutil.rmtree(self.job_dir(job_id), ignore_errors=True)


def python_path_env(environ: dict[str, str]) -> dict[str, str]:
    """Put the service's interpreter first on PATH, so `python` in a job command is that Python."""
    bin_dir = str(Path(sys.executable).parent)
    path = environ.get("PATH", "")
    if path.split(":")[:1] != [bin_dir]:
        environ = {**environ, "PATH": f"{bin_dir}:{path}" if path else bin_dir}
    return environ


_SPECIAL = {stat.S_IFIFO: "named pipe", stat.S_IFSOCK: "socket", stat.S_IFCHR: "device",
            stat.S_IFBLK: "device"}


def _parts(relpath: str) -> list[str]:
    """The components of a path relative to a job's folder, ``.`` and ``..`` applied.

    Raises:
        InvalidRequestError: the path has a NUL byte, is not UTF-8, is too long, is absolute or
            leads outside.
    """
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


def _open_below(dir_fd: int, name: str, relpath: str) -> int:
    """Open ``name`` in the folder ``dir_fd`` without following a link.

    Only folders and regular files are opened: the entry is checked first, so that a named pipe
    or a device is never opened, and checked again through the descriptor, so that an entry
    swapped in between is refused.
    """
    try:
        before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        raise NotFoundError(f"no file or folder {brief(relpath)} in the job's folder") from None
    if stat.S_ISLNK(before.st_mode):
        raise InvalidRequestError(f"path {brief(relpath)} goes through the symbolic link "
                                  f"{brief(name)}; links in a job's folder are not followed")
    if not (stat.S_ISDIR(before.st_mode) or stat.S_ISREG(before.st_mode)):
        raise InvalidRequestError(f"path {brief(relpath)} is not a regular file or folder")
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ELOOP):  # removed, or made a link, since the stat
            raise InvalidRequestError(f"{brief(relpath)} changed while it was opened; "
                                      "try again") from None
        raise InvalidRequestError(f"cannot open {brief(relpath)}: {e.strerror}") from None
    after = os.fstat(fd)
    if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
        os.close(fd)
        raise InvalidRequestError(f"{brief(relpath)} changed while it was opened; try again")
    return fd
