"""``/v1/uploads/{key}``: a remote submit's working dir and inputs, sent before the submit.

``PUT ?offset=N&manifest=M`` appends the body (streamed, any length: the job service's body
limit does not apply here, the upload's own does) at byte N; ``GET`` answers ``{received,
manifest, complete}``. The body is checked as it comes (:mod:`ringtrain.jobs.service.uploads`);
a refused archive answers 422 and is deleted. A read token cannot write (the scope guard).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from ringtrain.jobs.models.schemas import (
    API_PREFIX,
    IDEMPOTENCY_KEY_PATTERN,
    IDEMPOTENCY_KEY_RULE,
)
from ringtrain.jobs.service.api.caller import CallerDep
from ringtrain.jobs.service.api.params import ERRORS
from ringtrain.jobs.service.uploads import Uploads

_FLUSH = 1 << 20
#: An upload's name: the Idempotency-Key of the submit that will name it.
UploadKey = Annotated[str, Path(pattern=IDEMPOTENCY_KEY_PATTERN, max_length=128,
                                description="The submit's Idempotency-Key: "
                                            f"{IDEMPOTENCY_KEY_RULE}")]


def upload_routes(uploads: Uploads) -> APIRouter:
    """Ask how much of an upload came; send the rest."""
    r = APIRouter(prefix=API_PREFIX, responses=ERRORS)

    @r.get("/uploads/{key}")
    def upload_status(key: UploadKey, caller: CallerDep) -> dict[str, object]:
        status = uploads.status(key, caller.owner)
        return {"received": status.received, "manifest": status.manifest,
                "complete": status.complete}

    @r.put("/uploads/{key}")
    async def upload(key: UploadKey, request: Request, caller: CallerDep,
                     offset: int = Query(..., ge=0),
                     manifest: str = Query(..., pattern=r"^[0-9a-f]{1,64}$")
                     ) -> dict[str, object]:
        opened = await run_in_threadpool(uploads.open, key, caller.owner, offset,
                                         manifest)
        buffer = bytearray()
        try:
            try:
                async for chunk in request.stream():
                    buffer += chunk
                    if len(buffer) >= _FLUSH:
                        await run_in_threadpool(uploads.write, opened, bytes(buffer))
                        buffer.clear()
            except ClientDisconnect:
                pass  # what came stays: the client resumes from it
            if buffer:
                await run_in_threadpool(uploads.write, opened, bytes(buffer))
        finally:
            status = await run_in_threadpool(uploads.close, opened)
        return {"received": status.received, "complete": status.complete}

    return r

