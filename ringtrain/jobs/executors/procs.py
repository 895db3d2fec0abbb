"""Finding and signalling a job's processes on this host, through Linux's /proc.

A job's processes are found two ways: its runner's process group (everything it started without a
new session) and the ``RINGTRAIN_JOB_ID`` variable every one of them inherits, which also finds
ranks that a launcher moved into sessions of their own. The start time read from /proc tells a
live process from a reused pid after a server restart.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

from ringtrain.jobs.envvars import JOB_ID

log = logging.getLogger(__name__)

_PROC = Path("/proc")


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or ``None`` if it is gone."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after its last ')'.
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[19])  # field 22 of stat(5), counted from field 3


def is_alive(pid: int, ticks: int | None) -> bool:
    """True if ``pid`` runs (not a zombie) and, when ``ticks`` is given, started then."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    rest = stat[stat.rindex(")") + 2:].split()
    if rest[0] in ("Z", "X"):
        return False
    return ticks is None or int(rest[19]) == ticks


def job_pids(job_id: str) -> list[int]:
    """The pids of live processes that carry ``RINGTRAIN_JOB_ID=<job_id>`` (never this one)."""
    needle = f"{JOB_ID}={job_id}".encode()
    me = os.getpid()
    found = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or another user's
            continue
        if needle in environ.split(b"\0") and is_alive(int(entry.name), None):
            found.append(int(entry.name))
    return found


def signal_job(job_id: str, pgid: int | None, sig: signal.Signals) -> int:
    """Send ``sig`` to the job's process group and to every process carrying its marker.

    Returns:
        How many marker-carrying processes were signalled.
    """
    if pgid is not None:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    pids = job_pids(job_id)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    if pids:
        log.debug("sent %s to %d processes of job %s", sig.name, len(pids), job_id)
    return len(pids)
