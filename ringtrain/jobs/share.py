"""The share: one folder per job, holding its working dir, logs, preparation output and outputs.

Layout under the share root::

    jobs/<id>/wd/                       the working_dir copied at submit time (the ranks' cwd)
    jobs/<id>/stdouterr/rank.N/stdout   each rank's output, written by `ringtrain run`
    jobs/<id>/prep/node.K.{stdout,stderr}
    jobs/<id>/outputs/<name>/           one folder per spec output
    jobs/<id>/launcher/                 the job runner's launch file, status file and log
    jobs/<id>/attempts/<n>/             logs of earlier attempts of a retried job

Every path a client names is resolved by :meth:`Share.resolve`, which refuses anything outside the
job's folder (``..``, absolute paths, symlinks pointing out).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from ringtrain.jobs import envvars
from ringtrain.jobs.errors import InvalidRequestError, NotFoundError
from ringtrain.jobs.models import FileInfo, JobInfo, JobSpec

# Never worth copying into a job: version control, environments, caches, ringtrain's own state.
COPY_IGNORE = (".git", ".hg", ".venv", "venv", "__pycache__", ".pytest_cache", "*.pyc",
               ".ringtrain", "node_modules", ".mypy_cache")


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
            InvalidRequestError: the working dir does not exist or is not a folder.
        """
        job_dir = self.job_dir(job_id)
        wd = job_dir / "wd"
        job_dir.parent.mkdir(parents=True, exist_ok=True)
        job_dir.mkdir()
        try:
            if spec.working_dir:
                src = Path(spec.working_dir).expanduser().resolve()
                if not src.is_dir():
                    raise InvalidRequestError(f"working_dir: {src} is not a folder")
                ignore = shutil.ignore_patterns(*COPY_IGNORE)
                # The share may live inside the working dir (RINGTRAIN_HOME=./.ringtrain): skip it.
                shutil.copytree(src, wd, symlinks=True,
                                ignore=lambda d, names: set(ignore(d, names)) | {
                                    n for n in names if (Path(d) / n).resolve() == self.root})
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

    def resolve(self, job_id: str, relpath: str) -> Path:
        """A path inside a job's folder, refusing anything that leads outside it.

        Raises:
            InvalidRequestError: the path is absolute or escapes the folder.
        """
        job_dir = self.job_dir(job_id).resolve()
        rel = Path(relpath or ".")
        if rel.is_absolute():
            raise InvalidRequestError(f"path {relpath!r} must be relative to the job's folder")
        target = (job_dir / rel).resolve()
        if target != job_dir and not target.is_relative_to(job_dir):
            raise InvalidRequestError(f"path {relpath!r} leads outside the job's folder; "
                                      "paths are relative to it (e.g. outputs/model)")
        return target

    def list_files(self, job_id: str, relpath: str = "") -> list[FileInfo]:
        """Files under a path of a job's folder (recursively), sorted by path.

        Raises:
            InvalidRequestError: the path escapes the folder.
            NotFoundError: nothing exists at the path.
        """
        job_dir = self.job_dir(job_id).resolve()
        target = self.resolve(job_id, relpath)
        if not target.exists():
            raise NotFoundError(f"job {job_id} has no file or folder {relpath!r}")
        candidates = [target] if target.is_file() else sorted(target.rglob("*"))
        out = []
        for p in candidates:
            # rglob follows no symlinked folders, but a symlinked file may point outside.
            if not p.is_file() or not p.resolve().is_relative_to(job_dir):
                continue
            st = p.stat()
            out.append(FileInfo(path=p.relative_to(job_dir).as_posix(), size=st.st_size,
                                modified_at=st.st_mtime))
        return out

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
