"""The share: one folder per job, holding its working dir, logs, preparation output and outputs.

Under the share root, ``jobs/<id>/`` is the folder of one job, laid out as
:class:`~ringtrain.jobs.job_folder.JobFolder` says; its working dir is copied less what it
ignores (see :mod:`ringtrain.jobs.files.workdir`).

A path a client names is opened once, one component at a time from the job folder's descriptor,
never following a symbolic link (``O_NOFOLLOW`` on every component), and what is served is that
descriptor: a job cannot swap a checked file for a link between the check and the read.

Hard links are served like any file. Making one needs read access to its target
(``fs.protected_hardlinks``), and every job runs as the service's user, so a hard link exposes
nothing the job could not copy into its folder; refusing files with several links would refuse
legitimate outputs (hard-linked checkpoints) and protect nothing.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from ringtrain.jobs import envvars
from ringtrain.jobs.errors import InvalidRequestError, JobsError, NotFoundError, brief
from ringtrain.jobs.files.folder_walk import MAX_BATCH, walk
from ringtrain.jobs.files.safe_open import open_below, open_path, split_path
from ringtrain.jobs.files.workdir import CopyFilter
from ringtrain.jobs.job_folder import ATTEMPT_FOLDERS, JobFolder
from ringtrain.jobs.models import FileInfo, JobInfo, JobSpec
from ringtrain.jobs.models.spec import expand_path


class Share:
    """The job folders under one share root (a local directory)."""

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()

    def job_dir(self, job_id: str) -> Path:
        """The folder of one job."""
        return self.root / "jobs" / job_id

    def folder(self, job_id: str) -> JobFolder:
        """The folder of one job, with the paths of its parts."""
        return JobFolder(self.job_dir(job_id))

    def create_job_dir(self, job_id: str, spec: JobSpec,
                       fill: Callable[[Path], None] | None = None) -> Path:
        """Create a job's folder: copy its working dir (or, with ``fill``, have it write ``wd/``
        and ``inputs/`` into the folder: an upload) and make its output folders.

        Raises:
            InvalidRequestError: the working dir is not a folder, holds a named pipe, socket or
                device, or cannot be copied; the message names the file.
        """
        folder = self.folder(job_id)
        job_dir = folder.root
        job_dir.parent.mkdir(parents=True, exist_ok=True)
        job_dir.mkdir()
        try:
            if fill is not None:
                fill(job_dir)
            elif spec.working_dir:
                self._copy_working_dir(spec.working_dir, folder.working_dir)
            else:
                folder.working_dir.mkdir()
            for name in spec.outputs:
                folder.output(name).mkdir(parents=True)
            for sub in ATTEMPT_FOLDERS:
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
        folder = JobFolder(Path(job.job_dir))
        env = dict(job.spec.environment)
        env[envvars.JOB_ID] = job.id
        env[envvars.SHARE_ROOT] = str(self.root)
        env[envvars.JOB_DIR] = str(folder.root)
        for name, path in job.spec.inputs.items():
            # a copied store input's variable is set to its staged copy by the executor
            env[envvars.input_var(name)] = path if isinstance(path, str) else path.url
        for name in job.spec.outputs:
            env[envvars.output_var(name)] = str(folder.output(name))
        return env

    def open_file(self, job_id: str, relpath: str) -> BinaryIO:
        """Open a regular file of a job's folder for reading.

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

    def iter_files(self, job_id: str, relpath: str = "", after: str | None = None,
                   first_batch: int = 1024) -> Iterator[FileInfo]:
        """The regular files under ``relpath`` of a job's folder (recursively), sorted by path,
        after ``after`` (the last path of a previous page).

        Symbolic links are neither followed nor listed, and neither are named pipes, sockets or
        devices: only what :meth:`open_file` would serve. The walk holds a few MiB whatever the
        folder holds (``first_batch``: names kept per pass over a long folder at first, about
        the page size; see :mod:`ringtrain.jobs.files.folder_walk`).

        Raises:
            InvalidRequestError: the path or ``after`` is malformed, leads outside the folder or
                goes through a symbolic link, or ``after`` is not below the path.
            NotFoundError: nothing exists at the path.
        """
        for info, _fd in self._walk(job_id, relpath, after, first_batch, opened=False):
            yield info

    def iter_opened(self, job_id: str, relpath: str = "", after: str | None = None
                    ) -> Iterator[tuple[FileInfo, int]]:
        """Like :meth:`iter_files`, with each file opened: the descriptor is the caller's to
        read until it asks for the next file, which closes it. The size is the file's when
        opened."""
        yield from self._walk(job_id, relpath, after, MAX_BATCH, opened=True)

    def _walk(self, job_id: str, relpath: str, after: str | None, first_batch: int,
              opened: bool) -> Iterator[tuple[FileInfo, int]]:
        parts = split_path(relpath)
        prefix = "/".join(parts)
        resume = _resume_parts(parts, after)
        with self._opened(job_id, relpath) as fd:
            st = os.fstat(fd)
            if not stat.S_ISDIR(st.st_mode):
                if resume is None:
                    yield FileInfo(path=prefix, size=st.st_size, modified_at=st.st_mtime), fd
                return
            for entry in walk(fd, prefix, resume, first_batch):
                file_fd = -1
                try:
                    if opened:
                        file_fd = open_below(entry.dir_fd, entry.name, entry.path)
                        found = os.fstat(file_fd)
                    else:
                        found = os.stat(entry.name, dir_fd=entry.dir_fd, follow_symlinks=False)
                except (FileNotFoundError, JobsError):  # removed, or not a regular file
                    continue
                try:
                    if stat.S_ISREG(found.st_mode):
                        yield FileInfo(path=entry.path, size=found.st_size,
                                       modified_at=found.st_mtime), file_fd
                finally:
                    if file_fd >= 0:
                        os.close(file_fd)

    @contextmanager
    def _opened(self, job_id: str, relpath: str) -> Iterator[int]:
        """A descriptor of a folder or regular file of a job's folder (see
        :func:`~ringtrain.jobs.files.safe_open.open_path`); closed on exit."""
        if "/" in job_id or job_id in ("", ".", ".."):
            raise NotFoundError(f"no job with id {brief(job_id)}")
        split_path(relpath)  # a malformed path is reported before a missing job folder
        if not self.job_dir(job_id).is_dir():
            raise NotFoundError(f"no folder for job {brief(job_id)}")
        with open_path(self.job_dir(job_id), relpath) as fd:
            yield fd

    def archive_attempt(self, job_id: str, attempt: int) -> None:
        """Move an earlier attempt's logs to ``attempts/<attempt>/`` before a retry starts."""
        folder = self.folder(job_id)
        job_dir = folder.root
        dest = folder.attempt(attempt)
        dest.mkdir(parents=True, exist_ok=True)
        for sub in ATTEMPT_FOLDERS:
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


def _resume_parts(parts: list[str], after: str | None) -> list[str] | None:
    """The components of ``after`` below the folder ``parts`` names (``None`` without ``after``).
    Raises InvalidRequestError if ``after`` is malformed or not below that folder."""
    if after is None:
        return None
    resume = split_path(after)
    if resume[:len(parts)] != parts or len(resume) == len(parts):
        below = brief('/'.join(parts) or '.')
        raise InvalidRequestError(f"cursor {brief(after)} is not a path below {below}; "
                                  "pass the next_cursor of the previous page unchanged")
    return resume[len(parts):]
