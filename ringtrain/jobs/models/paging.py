"""Pages of a file listing: a bounded number of files and where the next page starts.

``GET /v1/jobs/{id}/files`` answers at most ``limit`` files (:data:`DEFAULT_PAGE` unless asked,
never more than :data:`MAX_PAGE`) and a ``next_cursor``: the last path of the page, from which
the next request goes on (``cursor=``). A page costs what it holds, whatever the folder holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice

from pydantic import BaseModel

from ringtrain.jobs.errors import InvalidRequestError
from ringtrain.jobs.models import FileInfo

DEFAULT_PAGE = 1000
MAX_PAGE = 10_000
#: The largest offset a file can have (``off_t`` is 64-bit signed on every platform served).
MAX_OFFSET = 2**63 - 1


class FilePage(BaseModel):
    """One page of a listing; ``next_cursor`` is ``None`` on the last page."""

    files: list[FileInfo]
    next_cursor: str | None = None


def take_page(files: Iterator[FileInfo], limit: int) -> FilePage:
    """The first ``limit`` of ``files``, and the cursor of the next page if any are left."""
    page = list(islice(files, limit + 1))
    more = len(page) > limit
    del page[limit:]
    return FilePage(files=page, next_cursor=page[-1].path if more else None)


def check_range(name: str, value: int, low: int, high: int, hint: str = "") -> int:
    """``value`` if ``low <= value <= high``.

    Raises:
        InvalidRequestError: it is not; the message names the parameter, the range and ``hint``.
    """
    if not low <= value <= high:
        shown = (str(value) if abs(value) < 10**30
                 else f"{str(value)[:12]}... ({len(str(value))} digits)")
        raise InvalidRequestError(f"{name} must be between {low} and {high} (got {shown})"
                                  + (f"; {hint}" if hint else ""))
    return value
