"""Horovod's PyTorch API on torch.distributed: ``import ringtrain.torch as hvd``."""

from ringtrain.engine.handle import Handle
from ringtrain.errors import HorovodInternalError, RingtrainError, StallError, TensorMismatchError
from ringtrain.torch.autograd_ops import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
)
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
from ringtrain.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from ringtrain.torch.lifecycle import add_process_set, init, remove_process_set, shutdown
from ringtrain.torch.ops import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    allgather_async,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall_async,
    barrier,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather_async,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)
from ringtrain.torch.optimizer import DistributedOptimizer
from ringtrain.torch.process_sets import ProcessSet, global_process_set
from ringtrain.torch.runtime import (
    cross_rank,
    cross_size,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    rank,
    size,
    start_timeline,
    stop_timeline,
)
from ringtrain.torch.sync_batch_norm import SyncBatchNorm

__all__ = [
    "Adasum", "Average", "Compression", "DistributedOptimizer", "Handle", "HorovodInternalError",
    "Max", "Min", "ProcessSet", "Product", "RingtrainError", "StallError", "Sum", "SyncBatchNorm",
    "TensorMismatchError",
    "add_process_set", "allgather", "allgather_async", "allgather_object", "allreduce",
    "allreduce_", "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async", "barrier",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "broadcast_object",
    "broadcast_optimizer_state", "broadcast_parameters", "ccl_built", "cross_rank", "cross_size",
    "cuda_built", "ddl_built", "global_process_set", "gloo_built", "gloo_enabled",
    "grouped_allgather", "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "grouped_reducescatter",
    "grouped_reducescatter_async", "init", "is_homogeneous", "is_initialized", "join",
    "local_rank", "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported",
    "nccl_built", "poll", "rank", "reducescatter", "reducescatter_async", "remove_process_set",
    "rocm_built", "shutdown", "size", "sparse_allreduce_async", "start_timeline",
    "stop_timeline", "synchronize", "elastic",
]

# Last: elastic builds on the names above (``hvd.elastic.TorchState``, ``hvd.elastic.run``).
from ringtrain.torch import elastic  # noqa: E402
