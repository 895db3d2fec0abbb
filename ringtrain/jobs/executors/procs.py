"""Finding and signalling a job's processes on this host, through Linux's /proc.

A job's processes are found two ways: its runner's process group (everything it started without a
new session) and the ``RINGTRAIN_JOB_ID`` variable every one of them inherits, which also finds
ranks that a launcher moved into sessions of their own.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

from ringtrain.jobs.envvars import JOB_ID
from ringtrain.jobs.proc_stat import is_alive

log = logging.getLogger(__name__)

_PROC = Path("/proc")


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
