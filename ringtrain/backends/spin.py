"""How long a waiter on shared memory may spin before it sleeps on a futex.

A peer that is already on its way (the other rank of a synchronous allreduce, a few microseconds
of Python behind) is met by spinning without a wake-up, which on a virtual machine costs tens of
microseconds on each side. Spinning only pays while every runnable thread has a core: on a
machine with more runnable threads than cores, the spinner takes the core its peer needs, so it
then looks only once or twice before sleeping. What the kernel says is runnable right now (the
fourth field of ``/proc/loadavg``) is read at most every :data:`RECHECK_S`, so the check costs
nothing per wait and a load that comes and goes is followed within a fraction of a second.
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


def _cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class SpinPolicy:
    """Decides a waiter's spin, from the machine's load read every :data:`RECHECK_S`.

    Args:
        runnable: threads runnable now (None: unknown, taken as loaded).
        cores: the cores this process may run on.
        clock: the monotonic clock that paces the reads.
    """

    def __init__(self, runnable: Callable[[], int | None] = _runnable,
                 cores: Callable[[], int] = _cores,
                 clock: Callable[[], float] = time.monotonic):
        self._runnable = runnable
        self._cores = cores
        self._clock = clock
        self._checked = -RECHECK_S  # never: the first call reads the load
        self._spin_s = LOADED_SPIN_S

    def spin_s(self) -> float:
        """How long the calling waiter may spin before it sleeps."""
        now = self._clock()
        if now - self._checked >= RECHECK_S:
            self._checked = now
            runnable = self._runnable()
            idle = runnable is not None and runnable <= self._cores()
            self._spin_s = IDLE_SPIN_S if idle else LOADED_SPIN_S
        return self._spin_s


_POLICY: SpinPolicy | None = None
_THREAD = threading.local()  # a thread's cap on its spins, if it set one


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
    cap = getattr(_THREAD, "cap", None)
    return allowed if cap is None else min(allowed, cap)
