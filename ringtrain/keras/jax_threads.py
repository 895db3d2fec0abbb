"""JAX's host callbacks in a process confined to one CPU.

The gradients leave a jitted step through ``io_callback`` (:mod:`ringtrain.keras.handoff`),
whose arguments JAX copies to the CPU device on its client's thread pool while the callback
already runs on a thread of that pool. The pool has as many threads as the process may use
CPUs: confined to one (``taskset``, a batch scheduler that binds each task to a core), the
callback waits for a copy that no thread is left to make, and training stops for good, with
no error (a convolutional model on Keras' JAX backend does so in its first step). JAX sizes the
pool from ``PJRT_NPROC`` when it is set, read once, when its CPU client is created.
"""

from __future__ import annotations

import os
import warnings

#: Threads that a host callback and the copy of its arguments need at the least.
_CALLBACK_THREADS = 2


def ensure_callback_threads() -> None:
    """Give JAX's CPU client two threads when this process may use one CPU only and nobody
    chose their number (``PJRT_NPROC``, ``NPROC``); warn where the client exists already."""
    if "PJRT_NPROC" in os.environ or "NPROC" in os.environ:
        return
    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) >= _CALLBACK_THREADS:
        return
    try:
        from jax._src import xla_bridge

        started = xla_bridge.backends_are_initialized()
    except (ImportError, AttributeError):  # a JAX without this private check: assume not
        started = False
    if started:
        warnings.warn("this process may use one CPU and JAX's CPU client was created before "
                      "ringtrain.keras was imported: with one thread, the gradients' host "
                      "callback can wait forever. Import ringtrain.keras before running JAX "
                      "code, or export PJRT_NPROC=2", RuntimeWarning, stacklevel=3)
        return
    os.environ["PJRT_NPROC"] = str(_CALLBACK_THREADS)
