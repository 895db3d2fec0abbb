"""Finding and signalling a job's processes on this host, through Linux's /proc.

Where no cgroup holds a job (:mod:`ringtrain.jobs.service.executors.cgroups`), its processes
are found three ways: the job runner's session and process group (everything it started without a
new session), its descendants (the runner is a child subreaper, so even an orphan that left the
session stays below it while it lives), and the ``RINGTRAIN_JOB_ID`` variable every process of
the job inherits. The start time read from /proc tells a live process from a reused pid after a
server restart.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

from ringtrain.jobs.envvars import JOB_ID
from ringtrain.proc_stat import is_alive, stat_fields

log = logging.getLogger(__name__)

_PROC = Path("/proc")


def tree_pids(leader: int) -> list[int]:
    """Live processes in ``leader``'s session or process group, or descended from it (never
    ``leader`` itself nor this process)."""
    children: dict[int, list[int]] = {}
    found = set()
    me = os.getpid()
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        fields = stat_fields(pid)
        if fields is None or fields[0] in ("Z", "X") or pid in (me, leader):
            continue
        ppid, pgrp, session = int(fields[1]), int(fields[2]), int(fields[3])
        children.setdefault(ppid, []).append(pid)
        if leader in (pgrp, session):
            found.add(pid)
    todo = [leader, *found]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return sorted(found)


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


def signal_job(job_id: str, leader: int | None, sig: signal.Signals) -> int:
    """Send ``sig`` to the job's processes: those of the live runner ``leader`` (its session,
    process group and descendants, see :func:`tree_pids`) and every one carrying its marker.

    Returns:
        How many processes besides the runner were signalled.
    """
    pids = set(job_pids(job_id))
    if leader is not None:
        pids.update(tree_pids(leader))
        try:
            os.killpg(leader, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    if pids:
        log.debug("sent %s to %d processes of job %s", sig.name, len(pids), job_id)
    return len(pids)
