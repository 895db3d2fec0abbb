"""The routes of what a job left in its folder: listings, archives, downloads and logs.

Every file is opened the one way :mod:`ringtrain.jobs.files.safe_open` defines, and what was
opened is what is served. A listing and a log read run in worker threads; a folder's archive is
made by a process of its own (:mod:`ringtrain.jobs.service.archive_process`).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from typing import BinaryIO

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from ringtrain.jobs.errors import NotFoundError
from ringtrain.jobs.models.paging import DEFAULT_PAGE, MAX_PAGE, FilePage
from ringtrain.jobs.models.schemas import API_PREFIX
from ringtrain.jobs.service.api.logs import CHUNK, check_log, follow_file
from ringtrain.jobs.service.api.params import ERRORS, CursorQuery, FilePath, JobIdPath
from ringtrain.jobs.service.archive_process import ArchiveProducers
from ringtrain.jobs.service.job_service import JobService


def file_routes(service: JobService, producers: ArchiveProducers) -> APIRouter:
    """``/v1/jobs/{id}/files``, ``archive``, ``download`` and ``logs``."""
    r = APIRouter(prefix=API_PREFIX, responses=ERRORS)
    files = service.files

    @r.get("/jobs/{job_id}/files")
    def list_files(job_id: JobIdPath, path: FilePath = "",
                   limit: int = Query(DEFAULT_PAGE, description=f"Files per page, 1..{MAX_PAGE}."),
                   cursor: CursorQuery = None) -> FilePage:
        return files.list_files(job_id, path, limit, cursor)

    @r.get("/jobs/{job_id}/archive", response_class=StreamingResponse,
           responses={200: {"content": {"application/x-tar": {}}}})
    async def archive(job_id: JobIdPath, path: FilePath = "", after: CursorQuery = None
                      ) -> StreamingResponse:
        # The path is checked (400/404) before the 200 is sent; the archive is made while it
        # is sent, by a process of its own.
        await run_in_threadpool(files.check_archive, job_id, path, after)
        return StreamingResponse(await producers.start(job_id, path, after),
                                 media_type="application/x-tar")

    @r.get("/jobs/{job_id}/download", response_class=StreamingResponse,
           responses={200: {"content": {"application/octet-stream": {}}}})
    def download(job_id: JobIdPath, path: FilePath) -> StreamingResponse:
        # The descriptor opened (without following links) is the one served.
        f = files.open_file(job_id, path)
        return StreamingResponse(_read(f, os.fstat(f.fileno()).st_size),
                                 media_type="application/octet-stream")

    @r.get("/jobs/{job_id}/logs", response_class=StreamingResponse,
           responses={200: {"content": {"text/plain": {}}}})
    def logs(job_id: JobIdPath, rank: int = 0, stream: str = "stdout",
             follow: bool = Query(False, description="Stream until the job ends."),
             offset: int = Query(0, description="Start at this byte (to resume); at most the "
                                                "log's size.")
             ) -> StreamingResponse:
        relpath = files.log_path(job_id, rank, stream)
        folder = service.share.job_dir(job_id)
        # A link, pipe or bad offset: 400 before streaming.
        offset = check_log(folder, relpath, offset, follow)

        def done() -> bool:
            try:
                return not follow or files.log_ended(job_id, stream)
            except NotFoundError:  # deleted while followed
                return True

        body: AsyncIterator[bytes] = follow_file(folder, relpath, done, offset)
        return StreamingResponse(body, media_type="text/plain; charset=utf-8")

    return r


def _read(f: BinaryIO, size: int) -> Iterator[bytes]:
    """The first ``size`` bytes of ``f`` (its size when opened), then close it."""
    with f:
        while size > 0 and (chunk := f.read(min(CHUNK, size))):
            size -= len(chunk)
            yield chunk
