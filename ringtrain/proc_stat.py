"""Whether a pid still names the process it named, from Linux's ``/proc/<pid>/stat``.

A leaf: the job service's client reads it to see whether a server still runs, its executor
whether a job's runner does, and the engine which peer rank died. The start time tells a live
process from a reused pid after a restart.
"""

from __future__ import annotations

from pathlib import Path

_PROC = Path("/proc")


def stat_fields(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/PID/stat (state, ppid, pgrp, session, ...), or ``None`` if gone."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after its last ')'.
    return stat[stat.rindex(")") + 2:].split()


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or ``None`` if it is gone."""
    fields = stat_fields(pid)
    return None if fields is None else int(fields[19])  # field 22 of stat(5)


def is_alive(pid: int, ticks: int | None) -> bool:
    """True if ``pid`` runs (not a zombie) and, when ``ticks`` is given, started then."""
    fields = stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    return ticks is None or int(fields[19]) == ticks
