"""What a job left in its folder, as the API reads it: pages of its files, a file to download,
a folder's archive checked before it streams, a rank's or a node's log, its training scalars.

Every read checks that the job exists first (404 otherwise) and goes through the share's one
safe open (:mod:`ringtrain.jobs.files.safe_open`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, BinaryIO

from ringtrain.jobs.errors import InvalidRequestError
from ringtrain.jobs.job_folder import PREP_STREAMS, prep_log_path, rank_log_path
from ringtrain.jobs.models import FileInfo
from ringtrain.jobs.models.paging import DEFAULT_PAGE, MAX_PAGE, FilePage, check_range, take_page
from ringtrain.jobs.service.monitor.scalars import ScalarCache
from ringtrain.jobs.service.share import Share
from ringtrain.jobs.service.store import Store
from ringtrain.run_files import COMBINED_STREAM, RANK_STREAMS

#: A rank's streams; ``output`` holds both, interleaved as written (``ringtrain run`` writes it;
#: where its backend writes none, it falls back to ``stdout``). ``prep.*`` are a node's
#: preparation step, with the rank parameter naming the node.
LOG_STREAMS = (*RANK_STREAMS, *(f"prep.{s}" for s in PREP_STREAMS))
#: The largest rank a log is asked for (more processes than any job can have).
MAX_RANK = 2**31 - 1


class JobFiles:
    """The job folders of a service's jobs; ``store`` says whether a job exists, its spec and
    state. Every read raises NotFoundError for an unknown job, and InvalidRequestError for a
    path (or cursor) that is malformed, leads outside the job's folder or goes through a
    symbolic link."""

    def __init__(self, store: Store, share: Share):
        self.store = store
        self.share = share
        self.scalars = ScalarCache()

    def forget(self, job_id: str) -> None:
        """Drop what is cached of a deleted job."""
        self.scalars.forget(job_id)

    def list_files(self, job_id: str, path: str = "", limit: int = DEFAULT_PAGE,
                   cursor: str | None = None) -> FilePage:
        """One page of the files under ``path`` of a job's folder (see
        :mod:`ringtrain.jobs.models.paging`); ``limit`` must be 1..MAX_PAGE."""
        check_range("limit", limit, 1, MAX_PAGE, "ask for the next page with cursor=")
        self.store.get_job(job_id)
        return take_page(self.share.iter_files(job_id, path, cursor, limit + 1), limit)

    def iter_files(self, job_id: str, path: str = "") -> Iterator[FileInfo]:
        """Every file under ``path`` of a job's folder, walked lazily (see
        :meth:`Share.iter_files`)."""
        self.store.get_job(job_id)
        return self.share.iter_files(job_id, path)

    def check_archive(self, job_id: str, path: str, after: str | None = None) -> None:
        """Check what an archive of the files under ``path`` after ``after`` would read, so that
        its errors come before its stream."""
        self.store.get_job(job_id)
        next(self.share.iter_opened(job_id, path, after), None)  # closed as soon as dropped

    def open_file(self, job_id: str, path: str) -> BinaryIO:
        """Open one file of a job for download (see :meth:`Share.open_file`)."""
        self.store.get_job(job_id)
        return self.share.open_file(job_id, path)

    def job_scalars(self, job_id: str, cursor: int = 0) -> dict[str, Any]:
        """The training scalars a job logged (see :class:`~ringtrain.jobs.service.monitor.scalars.
        JobScalars`), the points after ``cursor``."""
        self.store.get_job(job_id)
        return self.scalars.get(job_id, self.share.job_dir(job_id)).since(cursor)

    def log_path(self, job_id: str, rank: int, stream: str) -> str:
        """Where one rank's stdout, stderr or both (``output``) are, or (``prep.stdout``,
        ``prep.stderr``) node ``rank``'s preparation output, relative to the job's folder; the
        file may not exist yet. Raises InvalidRequestError if the rank, node or stream does not
        exist in this job."""
        job = self.store.get_job(job_id)
        if stream not in LOG_STREAMS:
            raise InvalidRequestError(f"stream must be one of {', '.join(LOG_STREAMS)} "
                                      f"(got {stream!r})")
        if stream.startswith("prep."):
            nodes = job.spec.max_nodes or job.spec.node_count
            if not 0 <= rank < nodes:
                raise InvalidRequestError(f"node {rank} is out of range: job {job_id} has "
                                          f"{nodes} nodes (0..{nodes - 1})")
            return prep_log_path(rank, stream.removeprefix("prep."))
        total = job.spec.total_processes
        # An elastic job's workers that join later count on past its first world's ranks.
        if rank < 0 or rank > MAX_RANK or (rank >= total and not job.spec.elastic):
            shown = rank if abs(rank) <= MAX_RANK else f"{str(rank)[:12]}..."
            raise InvalidRequestError(f"rank {shown} is out of range: job {job_id} has "
                                      f"{total} ranks (0..{total - 1})")
        if stream == COMBINED_STREAM and job.state.is_terminal() \
                and not self._exists(job_id, rank_log_path(rank, stream)) \
                and self._exists(job_id, rank_log_path(rank, "stdout")):
            # A job that ran before every node wrote the interleaved copy (Ray nodes wrote the
            # streams apart): its stdout stands in.
            return rank_log_path(rank, "stdout")
        return rank_log_path(rank, stream)

    def _exists(self, job_id: str, relpath: str) -> bool:
        # lexists: a name the job made a link or a pipe exists too (the open refuses it later)
        return os.path.lexists(self.share.job_dir(job_id) / relpath)

    def log_ended(self, job_id: str, stream: str) -> bool:
        """Whether nothing will be written to the job's log ``stream`` any more: the job is
        over, or (a preparation log) its ranks have started."""
        if self.store.get_job(job_id).state.is_terminal():
            return True
        return stream.startswith("prep.") and self._exists(job_id, rank_log_path(0, "stdout"))
