"""How much CPU and memory each running job of a local cluster uses, from ``/proc``.

A local attempt's processes all descend from its job runner, which leads their session (see
:mod:`ringtrain.jobs.service.executors.procs`). One pass over ``/proc`` reads every process's
parent, session, CPU ticks and resident pages; each process counts for the job whose runner leads it
or an ancestor. CPU is the share of one core used between two samples (200 % = two cores busy).
A pass costs a few milliseconds on a host with a few hundred processes, and runs only when a
dashboard asks, at most once per ``max_age_s``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ringtrain.proc_stat import stat_fields

_PROC = Path("/proc")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def read_processes() -> dict[int, tuple[int, int, int, int]]:
    """pid -> (ppid, session, cpu ticks, resident bytes) of every live process."""
    out = {}
    for entry in os.scandir(_PROC):
        if not entry.name.isdigit():
            continue
        fields = stat_fields(int(entry.name))
        if fields is None or fields[0] in ("Z", "X"):
            continue
        out[int(entry.name)] = (int(fields[1]), int(fields[3]), int(fields[11]) + int(fields[12]),
                                int(fields[21]) * _PAGE)
    return out


class JobUsageSampler:
    """Samples the processes of running jobs by their runner's pid.

    Args:
        max_age_s: how long a sample is served before the next is taken.
    """

    def __init__(self, max_age_s: float = 2.0):
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._last: dict[str, dict[str, Any]] = {}
        self._taken = 0.0
        self._ticks: dict[str, tuple[float, int]] = {}  # job -> (when, its cpu ticks then)

    def sample(self, leaders: Mapping[str, int]) -> dict[str, dict[str, Any]]:
        """``{job id: {"cpu_percent", "memory", "processes"}}`` for the jobs whose runner pid
        ``leaders`` gives (``cpu_percent`` is ``None`` on a job's first sample)."""
        with self._lock:
            now = time.monotonic()
            if now - self._taken < self.max_age_s and set(self._last) == set(leaders):
                return self._last
            procs = read_processes()
            by_leader = {pid: job for job, pid in leaders.items()}
            totals: dict[str, list[int]] = {job: [0, 0, 0] for job in leaders}
            owner: dict[int, str | None] = {}

            def job_of(pid: int) -> str | None:
                chain = []
                while pid not in owner:
                    if pid in by_leader:
                        owner[pid] = by_leader[pid]
                        break
                    info = procs.get(pid)
                    if info is None or info[0] <= 1:
                        owner[pid] = by_leader.get(info[1]) if info else None
                        break
                    chain.append(pid)
                    pid = info[0]
                for p in chain:
                    owner[p] = owner[pid]
                return owner[pid]

            for pid, (_, session, ticks, rss) in procs.items():
                job = by_leader.get(session) or job_of(pid)
                if job is not None:
                    t = totals[job]
                    t[0] += ticks
                    t[1] += rss
                    t[2] += 1
            result = {}
            for job, (ticks, rss, count) in totals.items():
                before = self._ticks.get(job)
                cpu = None
                if before is not None and now > before[0] and ticks >= before[1]:
                    cpu = round(100.0 * (ticks - before[1]) / _TICK / (now - before[0]), 1)
                self._ticks[job] = (now, ticks)
                result[job] = {"cpu_percent": cpu, "memory": rss, "processes": count}
            for job in set(self._ticks) - set(leaders):
                del self._ticks[job]
            self._last, self._taken = result, now
            return result
