"""Reading a file that one ringtrain process left for another (a status file, ``server.json``).

One rule for all of them: no file means no record yet, and a file that is there but cannot be
read is an error that names it. Standard library only, as the job runner needs.

Status files live in a job's folder, where the job may replace them: the file is opened without
following a link at its name and without waiting (a named pipe would block the scheduler, and
every request with it), only a regular file is read, and at most :data:`MAX_RECORD_BYTES`.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ringtrain.jobs.errors import RecordError

#: Far above any record ringtrain writes (a few hundred bytes).
MAX_RECORD_BYTES = 1 << 20


def read_record_file(path: Path, source: str) -> bytes | None:
    """The bytes of ``path``, or ``None`` if there is no such file.

    Args:
        path: the file.
        source: what the file is, for the error message (e.g. "the launch file /x/launch.json").

    Raises:
        RecordError: the file exists but cannot be read, is a link, named pipe or the like, or is
            larger than :data:`MAX_RECORD_BYTES`.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise RecordError(f"cannot read {source}: {e.strerror or e}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        why = os.strerror(errno.EISDIR) if stat.S_ISDIR(mode) else "it is not a regular file"
        raise RecordError(f"cannot read {source}: {why}")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(MAX_RECORD_BYTES + 1)
        except OSError as e:
            raise RecordError(f"cannot read {source}: {e.strerror or e}") from None
    if len(data) > MAX_RECORD_BYTES:
        raise RecordError(f"cannot read {source}: larger than {MAX_RECORD_BYTES} bytes")
    return data
