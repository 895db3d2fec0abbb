"""Where a job's shared-memory segments live, which ranks share them, and how the launcher sweeps
them away.

A leaf (standard library only): the shared-memory backend names its segments with
:func:`segment_path`, and ``ringtrain run`` removes what is left of a launch with :func:`sweep`
after its ranks have exited, however they exited (a rank unlinks a segment as soon as every
member has mapped it, so only a job killed while it sets a segment up leaves one behind).
"""

from __future__ import annotations

import os
from pathlib import Path

#: The tmpfs where segments are created (POSIX shared memory on Linux).
SHM_DIR = Path("/dev/shm")
_PREFIX = "ringtrain-"
#: The variable that widens shared memory from the ranks of one host name to every rank of the
#: machine ("machine"; "host" is the default): the job service sets it for the nodes of a local
#: cluster, which are several host names of one machine.
SCOPE_VAR = "RINGTRAIN_SHM_SCOPE"


def segment_path(run_id: str, token: str, key: str, directory: Path = SHM_DIR) -> Path:
    """The file of one segment: ``/dev/shm/ringtrain-<run_id>-<token>-<key>``.

    Args:
        run_id: the launch's id (what :func:`sweep` matches).
        token: random per ``init()``, agreed by every rank: two jobs with the same run id (two
            torchrun launches, say) never share a segment.
        key: which segment of this ``init()`` (process set and host group).
    """
    for part in (run_id, token, key):
        if not part or "/" in part or part.startswith("."):
            raise ValueError(f"segment name part {part!r} must be a non-empty file name")
    return directory / f"{_PREFIX}{run_id}-{token}-{key}"


def sweep(run_id: str, directory: Path = SHM_DIR) -> list[Path]:
    """Remove every segment of launch ``run_id`` still in ``directory``; returns those removed.

    Call it only once the launch's ranks on this host have exited.
    """
    removed: list[Path] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    prefix = f"{_PREFIX}{run_id}-"
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(directory / name)
                removed.append(directory / name)
            except FileNotFoundError:
                pass
    return removed
