"""Reading a file that one ringtrain process left for another (a status file, ``server.json``).

One rule for all of them: no file means no record yet, and a file that is there but cannot be
read is an error that names it. Standard library only, as the job runner needs.

Status files live in a job's folder, where the job may replace them: the file is opened the one
way :mod:`ringtrain.jobs.files.safe_open` defines (no link followed in any component below the
folder, no wait on a named pipe: one would block the scheduler, and every request with it), only
a regular file is read, and at most :data:`MAX_RECORD_BYTES`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from ringtrain.jobs.errors import InvalidRequestError, NotFoundError, RecordError
from ringtrain.jobs.files.safe_open import open_regular
from ringtrain.record_fields import FieldError, parse_json

R = TypeVar("R")

#: Far above any record ringtrain writes (a few hundred bytes).
MAX_RECORD_BYTES = 1 << 20


def read_record_file(folder: Path, relpath: str, source: str) -> bytes | None:
    """The bytes of ``folder/relpath``, or ``None`` if there is no such file. ``folder`` is one
    the service made or trusts (a job's folder, the home); ``source`` says what the file is, for
    the error message (e.g. "the launch file /x/launch.json").

    Raises:
        RecordError: the file exists but cannot be read, goes through a link, is a folder, a
            named pipe or the like, or is larger than :data:`MAX_RECORD_BYTES`.
    """
    try:
        fd = open_regular(folder, relpath)
    except NotFoundError:
        return None
    except InvalidRequestError as e:
        raise RecordError(f"cannot read {source}: {e}") from None
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(MAX_RECORD_BYTES + 1)
        except OSError as e:
            raise RecordError(f"cannot read {source}: {e.strerror or e}") from None
    if len(data) > MAX_RECORD_BYTES:
        raise RecordError(f"cannot read {source}: larger than {MAX_RECORD_BYTES} bytes")
    return data


def read_record(folder: Path, relpath: str, source: str,
                parse: Callable[[Any], R]) -> R | None:
    """The record in the JSON file ``folder/relpath`` as ``parse`` makes it (raising
    :class:`~ringtrain.record_fields.FieldError` on a bad one), or ``None`` if there is no such
    file. Raises RecordError, naming ``source``, as :func:`read_record_file`, or if the file is
    not JSON or ``parse`` refused it."""
    raw = read_record_file(folder, relpath, source)
    if raw is None:
        return None
    with naming(source):
        return parse(parse_json(raw))


@contextmanager
def naming(source: str) -> Iterator[None]:
    """Turn a field's :class:`~ringtrain.record_fields.FieldError` into a :class:`RecordError`
    that names the record (``source``)."""
    try:
        yield
    except FieldError as e:
        raise RecordError(f"{source}: {e}") from None
