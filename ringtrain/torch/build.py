"""Build probes, answered truthfully for this build (Horovod scripts branch on them)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ringtrain.torch import runtime


def mpi_built() -> bool:
    """ringtrain has no MPI."""
    return False


def mpi_enabled() -> bool:
    return False


def mpi_threads_supported() -> bool:
    return False


def gloo_built() -> bool:
    return dist.is_gloo_available()


def gloo_enabled() -> bool:
    """Whether collectives of this run go through Gloo (always, for a world of more than one)."""
    return runtime.is_initialized() and runtime.current().topology.size > 1


def nccl_built() -> bool:
    return dist.is_nccl_available()


def cuda_built() -> bool:
    return torch.backends.cuda.is_built()


def rocm_built() -> bool:
    return torch.version.hip is not None


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False
