"""The route parameters the API's routers share: ids and names checked by their pattern, paths
bounded, and the error answers every route may give."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path, Query

from ringtrain.jobs.files.safe_open import MAX_PATH_BYTES
from ringtrain.jobs.models.ids import JOB_ID_PATTERN, NAME_PATTERN
from ringtrain.jobs.models.schemas import ErrorResponse
from ringtrain.jobs.models.tokens import TOKEN_ID_PATTERN

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 409, 413, 422, 503)}

ClusterName = Annotated[str, Path(pattern=NAME_PATTERN, description="A cluster's name.")]
JobIdPath = Annotated[str, Path(pattern=JOB_ID_PATTERN, description="A job's id.")]
TokenIdPath = Annotated[str, Path(pattern=TOKEN_ID_PATTERN, description="A token's id.")]
RankPath = Annotated[int, Path(ge=0, le=1_000_000, description="A rank of the job.")]
NameFilter = Annotated[str | None, Query(pattern=NAME_PATTERN)]
FilePath = Annotated[str, Query(max_length=MAX_PATH_BYTES,
                                description="Relative to the job's folder, e.g. outputs/model.")]
CursorQuery = Annotated[str | None, Query(
    max_length=MAX_PATH_BYTES,
    description="Go on after this path (relative to the job's folder): a listing's next_cursor, "
                "or the last file of an archive received whole.")]
