"""Keeping the engine's threads out of PyTorch's intra-op parallelism.

With an OpenMP build of PyTorch each thread running a parallel kernel gets a team of its own; a
background thread's team would spin on the cores the training thread's team needs (docs/engine.md,
"Which thread does the tensor work"). ``torch.set_num_threads`` would also change the process-wide
default the user's threads start from, but OpenMP's thread count is a per-thread setting (the
``nthreads-var`` ICV): set on the engine's thread alone, its kernels run serially and the user's
settings stay untouched.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import sys

import torch

log = logging.getLogger(__name__)


def serialize_this_thread() -> bool:
    """Make tensor kernels run on the calling thread alone, without an OpenMP team.

    Call it first thing in a background thread that runs tensor work; other threads and the
    process default are unaffected, and so is MKL's threading (BLAS, which the engine never calls).

    Returns:
        Whether the thread was limited (False when PyTorch was built without OpenMP, where
        kernels use a shared pool and there is no per-thread team to avoid).
    """
    # PyTorch sets a thread's OpenMP count from its process default the first time that thread
    # asks; ask first, so that this thread's setting is not overwritten later.
    torch.get_num_threads()
    setter = _omp_set_num_threads()
    if setter is None:
        return False
    setter(1)
    return True


@functools.cache
def _omp_set_num_threads():
    """The ``omp_set_num_threads`` of the OpenMP runtime PyTorch uses, or None."""
    library = os.path.join(os.path.dirname(torch.__file__), "lib",
                           {"darwin": "libtorch_cpu.dylib", "win32": "torch_cpu.dll"}.get(
                               sys.platform, "libtorch_cpu.so"))
    try:
        # dlsym on libtorch_cpu also searches the libraries it links, so this finds the OpenMP
        # runtime PyTorch actually uses (libgomp, libomp or libiomp5), whichever it is.
        setter = ctypes.CDLL(library).omp_set_num_threads
    except (OSError, AttributeError) as exc:
        log.debug("cannot limit the engine thread's OpenMP team through %s: %s", library, exc)
        return None
    setter.argtypes = [ctypes.c_int]
    setter.restype = None
    return setter
