"""Horovod's Keras API on Keras 3 (torch, TensorFlow or JAX backend): ``import ringtrain.keras
as hvd``.

The names of ``horovod.keras`` / ``horovod.tensorflow.keras`` (docs/keras.md). Importing it makes
``torch`` Keras' backend if keras is not imported yet and ``KERAS_BACKEND`` is unset, and refuses
a backend other than the three (see :mod:`ringtrain.keras.backend`).
"""

from ringtrain.keras.backend import KerasBackendError, import_keras

import_keras()

from ringtrain.errors import HorovodInternalError
from ringtrain.keras import callbacks, elastic
from ringtrain.keras.collectives import (
    allgather,
    allreduce,
    broadcast,
    broadcast_global_variables,
    broadcast_variables,
    reducescatter,
)
from ringtrain.keras.optimizer import DistributedOptimizer
from ringtrain.keras.saving import load_model
from ringtrain.torch.build import (
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rocm_built,
)
from ringtrain.torch.compression import Compression
from ringtrain.torch.functions import allgather_object, broadcast_object
from ringtrain.torch.lifecycle import (
    add_process_set,
    init,
    remove_process_set,
    shutdown,
)
from ringtrain.torch.ops import Adasum, Average, Sum
from ringtrain.torch.process_sets import ProcessSet, global_process_set
from ringtrain.torch.runtime import (
    cross_rank,
    cross_size,
    is_initialized,
    local_rank,
    local_size,
    rank,
    size,
    start_timeline,
    stop_timeline,
)

__all__ = [
    "Adasum", "Average", "Compression", "DistributedOptimizer", "HorovodInternalError",
    "KerasBackendError", "ProcessSet", "Sum", "add_process_set", "allgather",
    "allgather_object", "allreduce", "broadcast", "broadcast_global_variables",
    "broadcast_object", "broadcast_variables", "callbacks", "ccl_built",
    "cross_rank", "cross_size", "cuda_built", "ddl_built", "elastic", "global_process_set",
    "gloo_built", "gloo_enabled", "init", "is_initialized", "load_model", "local_rank",
    "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "rank",
    "reducescatter", "remove_process_set", "rocm_built", "shutdown", "size", "start_timeline",
    "stop_timeline",
]
