"""How much CPU and memory the running jobs of a local cluster use, in all and by rank, from
``/proc``.

A local attempt's processes all descend from its job runner, which leads their session (see
:mod:`ringtrain.jobs.service.executors.local.procs`). One pass over ``/proc`` reads every
process's parent, session, CPU ticks and resident pages; each process counts for the job whose
runner leads it or an ancestor. CPU is the share of one core used between two samples (200 % =
two cores busy). A pass costs a few milliseconds on a host with a few hundred processes, and runs
only when a dashboard asks, at most once per ``max_age_s``.

By rank: every rank runs under the task wrapper (``python -m ringtrain.runner.task``), which the
launcher starts with the rank's variables (``HOROVOD_RANK``, ``RANK``) in its environment; below
it run the rank's command (``sh -c ...``), the user's Python and whatever that starts (data loader
workers). So a pass finds each wrapper below the job's runner, reads its rank from
``/proc/PID/environ`` (readable by the user the service runs as, who started the job), and counts
everything below it as that rank's. The wrapper itself is left out: it only forwards signals, and
Ray's dashboard also shows the worker, not its supervisor. Only the job's processes' ``cmdline``
is read.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ringtrain.proc_stat import stat_fields

_PROC = Path("/proc")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: The task wrapper's module, as its command line names it (``python -m ringtrain.runner.task``).
TASK_MODULE = "ringtrain.runner.task"
#: Where a rank's number is, in order: Horovod's name, then torchrun's (the launcher sets both).
RANK_VARIABLES = ("HOROVOD_RANK", "RANK")

Processes = Mapping[int, tuple[int, int, int, int]]  # pid -> (ppid, session, ticks, rss bytes)


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
    """Samples the processes of running jobs by their runner's pid, at most once per
    ``max_age_s`` (a sample is served until then)."""

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


@dataclass(frozen=True)
class RankProcesses:
    """One rank's processes.

    Attributes:
        rank: the rank.
        wrapper: the pid of its task wrapper.
        main: the rank's Python process (the shallowest below the wrapper running Python; else
            the wrapper's first child), which a stack dump looks at; ``None`` if there is none.
        pids: the processes below the wrapper, shallowest first.
    """

    rank: int
    wrapper: int
    main: int | None
    pids: tuple[int, ...]


def find_ranks(leader: int, procs: Processes | None = None) -> list[RankProcesses]:
    """The ranks running below the job runner ``leader``, by rank.

    Args:
        leader: the pid of the job's runner.
        procs: a pass over ``/proc`` (:func:`read_processes`); taken now if not given.
    """
    procs = read_processes() if procs is None else procs
    children: dict[int, list[int]] = {}
    for pid, info in procs.items():
        children.setdefault(info[0], []).append(pid)
    out = []
    queue = deque(sorted(children.get(leader, [])))
    while queue:
        pid = queue.popleft()
        rank = _rank_of(pid) if _is_wrapper(pid) else None
        if rank is None:
            queue.extend(sorted(children.get(pid, [])))
            continue
        below = _below(pid, children)
        main = next((p for p in below if _runs_python(p)), below[0] if below else None)
        out.append(RankProcesses(rank, pid, main, tuple(below)))
    return sorted(out, key=lambda r: (r.rank, r.wrapper))


def _below(pid: int, children: Mapping[int, list[int]]) -> list[int]:
    """The descendants of ``pid``, breadth first."""
    out: list[int] = []
    queue = deque(sorted(children.get(pid, [])))
    while queue:
        p = queue.popleft()
        out.append(p)
        queue.extend(sorted(children.get(p, [])))
    return out


def _is_wrapper(pid: int) -> bool:
    try:
        args = (_PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    wanted = TASK_MODULE.encode()
    return any(a == b"-m" and b == wanted for a, b in zip(args, args[1:], strict=False))


def _rank_of(pid: int) -> int | None:
    """The rank in a process's environment, or ``None`` (none, unreadable, or gone)."""
    try:
        raw = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    env = dict(item.partition(b"=")[::2] for item in raw.split(b"\0") if item)
    for name in RANK_VARIABLES:
        value = env.get(name.encode(), b"")
        if value.isdigit():
            return int(value)
    return None


def _runs_python(pid: int) -> bool:
    try:
        return (_PROC / str(pid) / "comm").read_text().startswith("python")
    except OSError:
        return False


class RankUsageSampler:
    """Samples the ranks of running jobs: CPU (percent of one core since the previous sample of
    the same job) and resident memory of each rank's processes, at most once per ``max_age_s``
    per job."""

    def __init__(self, max_age_s: float = 1.0):
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        # job -> (when, {rank: (wrapper pid, cpu ticks)}, the sample served)
        self._last: dict[str, tuple[float, dict[int, tuple[int, int]], list[dict[str, Any]]]] = {}

    def sample(self, job_id: str, leader: int) -> list[dict[str, Any]]:
        """``[{"rank", "pid", "cpu_percent", "memory", "processes"}]`` of the job whose runner
        is ``leader``, by rank; ``pid`` is the rank's main process and ``cpu_percent`` is
        ``None`` on a rank's first sample."""
        with self._lock:
            now = time.monotonic()
            last = self._last.get(job_id)
            if last is not None and now - last[0] < self.max_age_s:
                return last[2]
            procs = read_processes()
            ticks_now: dict[int, tuple[int, int]] = {}
            out = []
            for r in find_ranks(leader, procs):
                live = [procs[p] for p in r.pids if p in procs]
                ticks = sum(p[2] for p in live)
                cpu = None
                if last is not None and (before := last[1].get(r.rank)) is not None \
                        and before[0] == r.wrapper and ticks >= before[1]:
                    cpu = round(100.0 * (ticks - before[1]) / _TICK / (now - last[0]), 1)
                ticks_now[r.rank] = (r.wrapper, ticks)
                out.append({"rank": r.rank, "pid": r.main, "cpu_percent": cpu,
                            "memory": sum(p[3] for p in live), "processes": len(live)})
            # A job not asked about for a minute has no page open: its ticks are dropped.
            for job in [j for j, v in self._last.items() if now - v[0] > 60.0]:
                del self._last[job]
            self._last[job_id] = (now, ticks_now, out)
            return out
