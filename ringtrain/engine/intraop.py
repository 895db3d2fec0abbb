"""Keeping the engine's threads out of PyTorch's intra-op parallelism.

With an OpenMP build of PyTorch (every Linux and Windows wheel), each thread that runs a parallel
kernel gets an OpenMP team of its own, sized by that thread's ``omp_get_max_threads()``. The
training thread's team already holds every core the rank was given; a second team started by a
background thread (a fusion copy, a scaling) doubles the threads, and its members spin-wait
between regions (libgomp's default) on the cores the training team needs. A training step then
waits for its slowest team member: DDP, which runs its copies on the training thread, does not
pay this.

``torch.set_num_threads`` cannot fix it from the background thread: it also changes the
process-wide default that the user's own threads start from. OpenMP's thread count, though, is
a per-thread setting (the ``nthreads-var`` ICV): setting it on the engine's thread alone makes
every kernel there run serially, with no team and nothing spinning, and leaves the user's thread
settings untouched.
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

    Call it first thing in a background thread that runs tensor work. Other threads, the process
    default (``torch.get_num_threads()`` elsewhere) and threads started later are unaffected.
    MKL's own threading (BLAS, which the engine does not call) is left as it is.

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
