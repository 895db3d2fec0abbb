"""How many intra-op threads each rank gets by default: its host's cores shared by the ranks
on that host.

torch (and OpenMP) start one thread per core in every process, so N ranks on one host run N
times as many busy threads as cores: on 2 cores, two ranks of a plain script step 1.5x slower
and a Keras 3 model on the torch backend 18x slower than with one thread each. Like torchrun,
``ringtrain run`` sets ``OMP_NUM_THREADS`` for its ranks unless the user did; it is decided where
the rank starts (the task wrapper, or a Ray node), the only place that knows the host's cores.
Standard library only: the task wrapper imports it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

THREADS_VAR = "OMP_NUM_THREADS"
LOCAL_SIZE_VAR = "LOCAL_WORLD_SIZE"  # set by the worker contract (contract/env.py)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def threads_per_rank(cores: int, local_size: int) -> int:
    """``cores // local_size``, at least 1."""
    return max(1, cores // max(1, local_size))


def default_threads_environ(environ: Mapping[str, str], cores: int | None = None
                            ) -> dict[str, str]:
    """The ``OMP_NUM_THREADS`` to add to a rank's environment ``environ`` (the worker contract
    included) on a host of ``cores`` (default: :func:`usable_cores`): ``{}`` when the user set
    it or the rank's local size is unknown."""
    local = environ.get(LOCAL_SIZE_VAR, "")
    if THREADS_VAR in environ or not local.isdigit():
        return {}
    cores = usable_cores() if cores is None else cores
    return {THREADS_VAR: str(threads_per_rank(cores, int(local)))}


def threads_note(environ: Mapping[str, str], local_size: int | None,
                 cores: int | None = None) -> str | None:
    """The launch banner's line on threads (``None`` when the user set ``OMP_NUM_THREADS`` in
    the launcher's ``environ``); ``local_size`` is the most ranks on one host (``None``: not
    known yet), ``cores`` this host's (default: :func:`usable_cores`)."""
    if THREADS_VAR in environ:
        return None
    cores = usable_cores() if cores is None else cores
    here = ("" if local_size is None else
            f" (here: {cores} cores / {local_size} rank(s) = "
            f"{threads_per_rank(cores, local_size)} thread(s) each)")
    return (f"each rank gets {THREADS_VAR} = its host's cores / the ranks on that host{here}; "
            f"set {THREADS_VAR} to choose")
