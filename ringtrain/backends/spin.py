"""How long a waiter on shared memory may spin before it sleeps on a futex.

A peer that is already on its way (the other rank of a synchronous allreduce, a few microseconds
of Python behind) is met by spinning without a wake-up, which on a virtual machine costs tens of
microseconds on each side. Spinning only pays while every thread that can run has a core: where
threads wait for cores, the spinner takes the core its peer needs, so it then looks only once or
twice before sleeping.

The kernel measures exactly that: the time during which some thread waited for a core (pressure
stall information, ``/proc/pressure/cpu``). Its share of the last window, read at most every
:data:`RECHECK_S`, decides, so the check costs nothing per wait and a load that comes and goes is
followed within a fraction of a second. A thread runnable for a moment (a kernel worker, an
engine's periodic look) hardly counts, where a count of the threads runnable at the instant of
the read stopped the spins for a whole window; the ranks' own spinning threads count only once
they keep some thread from a core. Where the kernel keeps no such total (not Linux, before 4.20,
or booted with ``psi=0``), the policy goes by the threads runnable at the instant
(``/proc/loadavg``).

A thread that other threads of its process may need the GIL from while it waits caps its own
spins (:func:`limit_this_thread`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

#: Spin this long while every runnable thread has a core: several times the median wait for a
#: peer's bell measured on the 2-core VM (8-18 µs, docs/engine.md, "Where the time goes"), so
#: most waits end without the futex sleep and wake-up that cost tens of microseconds there; a
#: wait for a peer further behind wastes at most this much of an otherwise idle core.
IDLE_SPIN_S = 1e-4
#: Spin this long while the machine is loaded: a look or two before sleeping.
LOADED_SPIN_S = 2e-6
#: How often the load is read again.
RECHECK_S = 0.1
#: Spin long only while threads waited for a core less than this share of the last window.
#: Measured on the 2-core VM (benchmarks/RESULTS.md, "The spin policy"): two ranks calling
#: allreduce back to back, 3 % of the time in the median window and 6-31 % in the worst tenth;
#: the same with one busy process beside them, 31-51 %.
STALL_LIMIT = 0.25
#: A thread that waits beside a thread running Python (the engine's thread, beside training)
#: spins at most this long: a spinning thread holds the GIL, which the other then waits for.
BESIDE_PYTHON_SPIN_S = 2e-5


def _runnable() -> int | None:
    """Threads runnable right now on this machine (the caller included), or None where the
    kernel does not say (not Linux)."""
    try:
        with open("/proc/loadavg", "rb") as f:
            return int(f.read().split()[3].split(b"/")[0])
    except (OSError, IndexError, ValueError):
        return None


def _stalled_us() -> int | None:
    """Microseconds since boot during which some thread of this machine waited for a core, or
    None where the kernel does not say."""
    try:
        with open("/proc/pressure/cpu", "rb") as f:
            return int(f.readline().rsplit(b"total=", 1)[1])
    except (OSError, IndexError, ValueError):
        return None


def _cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class SpinPolicy:
    """Decides a waiter's spin, from the machine's load read every :data:`RECHECK_S`.

    Args:
        stalled_us: microseconds some thread waited for a core, a running total (None: the
            kernel does not say).
        runnable: threads runnable now (None: unknown, taken as loaded); read only without a
            stall total, or for the first window.
        cores: the cores this process may run on.
        clock: the monotonic clock that paces the reads.
    """

    def __init__(self, stalled_us: Callable[[], int | None] = _stalled_us,
                 runnable: Callable[[], int | None] = _runnable,
                 cores: Callable[[], int] = _cores,
                 clock: Callable[[], float] = time.monotonic):
        self._stalled_us = stalled_us
        self._runnable = runnable
        self._cores = cores
        self._clock = clock
        self._checked = -RECHECK_S  # never: the first call reads the load
        self._stalled: int | None = None
        self._spin_s = LOADED_SPIN_S

    def spin_s(self) -> float:
        """How long the calling waiter may spin before it sleeps."""
        now = self._clock()
        if now - self._checked >= RECHECK_S:
            self._spin_s = IDLE_SPIN_S if self._idle(now) else LOADED_SPIN_S
            self._checked = now
        return self._spin_s

    def _idle(self, now: float) -> bool:
        stalled, previous = self._stalled_us(), self._stalled
        self._stalled = stalled
        if stalled is not None and previous is not None:
            return stalled - previous <= STALL_LIMIT * (now - self._checked) * 1e6
        runnable = self._runnable()
        return runnable is not None and runnable <= self._cores()


_POLICY: SpinPolicy | None = None


class _ThreadCap(threading.local):
    """A thread's cap on its spins, if it set one (a class default: a missing attribute
    of a thread-local costs an exception on every look)."""

    cap: float | None = None


_THREAD = _ThreadCap()


def limit_this_thread(seconds: float) -> None:
    """Cap the calling thread's spins at ``seconds`` from now on (see
    :data:`BESIDE_PYTHON_SPIN_S`)."""
    _THREAD.cap = seconds


def spin_s() -> float:
    """How long the calling waiter may spin now (one policy per process, made on first use:
    nothing is read at import time), within its thread's cap."""
    global _POLICY
    if _POLICY is None:
        _POLICY = SpinPolicy()
    allowed = _POLICY.spin_s()
    cap = _THREAD.cap
    return allowed if cap is None else min(allowed, cap)
