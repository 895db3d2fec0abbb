"""Reading a file that one ringtrain process left for another (a status file, ``server.json``).

One rule for all of them: no file means no record yet, and a file that is there but cannot be
read is an error that names it. Standard library only, as the job runner needs.
"""

from __future__ import annotations

from pathlib import Path

from ringtrain.jobs.errors import RecordError


def read_record_file(path: Path, source: str) -> bytes | None:
    """The bytes of ``path``, or ``None`` if there is no such file.

    Args:
        path: the file.
        source: what the file is, for the error message (e.g. "the launch file /x/launch.json").

    Raises:
        RecordError: the file exists but cannot be read.
    """
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise RecordError(f"cannot read {source}: {e.strerror or e}") from None
