"""Horovod's collectives: asynchronous, in-place and grouped forms over one submission path.

Every function here is a thin wrapper over :func:`submit.submit`; the synchronous forms that
autograd differentiates (grouped ones included) live in :mod:`ringtrain.torch.autograd_ops`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ringtrain.engine.handle import DerivedHandle, Handle
from ringtrain.errors import UnsupportedOperationError
from ringtrain.op_types import OpType, ReduceOp
from ringtrain.torch import runtime
from ringtrain.torch.process_sets import ProcessSet, global_process_set
from ringtrain.torch.submit import (
    check_reduction,
    check_tensors,
    contiguous_work,
    resolve_op,
    run_synchronously,
    submit,
)

Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT
Adasum = ReduceOp.ADASUM


def poll(handle: Handle) -> bool:
    """Whether the asynchronous operation behind ``handle`` has finished."""
    return handle.done()


def synchronize(handle: Handle):
    """Wait for an asynchronous operation and return its result.

    Raises:
        RuntimeError: the operation failed on every rank (e.g. ranks disagreed on its shape), or
            a peer failed (``HorovodInternalError``).
    """
    return handle.wait()


# -- allreduce ---------------------------------------------------------------------------------

def start_allreduce(tensors: Sequence[torch.Tensor], *, in_place: bool, grouped: bool,
                    average: bool | None, name: str | None, op: ReduceOp | None,
                    prescale_factor: float, postscale_factor: float, process_set: ProcessSet,
                    synchronous: bool = False) -> Handle:
    """Every allreduce form's one path: ``in_place`` reduces the tensors themselves (else
    copies), ``grouped`` makes the handle's result a list, and ``synchronous`` says that the
    caller waits for the result at once (a lone cached one may then run in its thread: see
    :func:`~ringtrain.torch.submit.submit`).

    Raises:
        ValueError: as for :func:`~ringtrain.torch.submit.submit`.
    """
    check_tensors(tensors, OpType.ALLREDUCE)
    reduce_op = resolve_op(op, average, ReduceOp.AVERAGE)
    check_reduction(tensors, reduce_op, prescale_factor, postscale_factor)
    works = [contiguous_work(t, in_place) for t in tensors]
    finish = None
    if in_place:
        def finish(result):
            # A non-contiguous tensor was reduced in a contiguous copy: write it back.
            for t, w in zip(tensors, works):
                if not t.is_contiguous():
                    t.data.copy_(w)
            return list(tensors) if grouped else tensors[0]
    return submit(OpType.ALLREDUCE, name, tensors, works, process_set, reduce_op=reduce_op,
                  prescale=prescale_factor, postscale=postscale_factor, grouped=grouped,
                  finish=finish, synchronous=synchronous)


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: ReduceOp | None = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start an allreduce of ``tensor``; ``synchronize(handle)`` returns a new tensor."""
    return start_allreduce([tensor], in_place=False, grouped=False, average=average, name=name,
                           op=op, prescale_factor=prescale_factor,
                           postscale_factor=postscale_factor, process_set=process_set)


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op: ReduceOp | None = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> Handle:
    """Start an in-place allreduce of ``tensor``; ``synchronize`` returns ``tensor``."""
    return start_allreduce([tensor], in_place=True, grouped=False, average=average, name=name,
                           op=op, prescale_factor=prescale_factor,
                           postscale_factor=postscale_factor, process_set=process_set)


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               op: ReduceOp | None = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Allreduce ``tensor`` in place and return it."""
    return start_allreduce([tensor], in_place=True, grouped=False, average=average, name=name,
                           op=op, prescale_factor=prescale_factor,
                           postscale_factor=postscale_factor, process_set=process_set,
                           synchronous=True).wait()


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None,
                            name: str | None = None, op: ReduceOp | None = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> Handle:
    """Start an allreduce of a list of tensors as one unit; returns new tensors."""
    return start_allreduce(list(tensors), in_place=False, grouped=True, average=average,
                           name=name, op=op, prescale_factor=prescale_factor,
                           postscale_factor=postscale_factor, process_set=process_set)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                             name: str | None = None, op: ReduceOp | None = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set) -> Handle:
    """Start an in-place allreduce of a list of tensors as one unit."""
    return start_allreduce(list(tensors), in_place=True, grouped=True, average=average,
                           name=name, op=op, prescale_factor=prescale_factor,
                           postscale_factor=postscale_factor, process_set=process_set)


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                       name: str | None = None, op: ReduceOp | None = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Allreduce a list of tensors in place as one unit and return them."""
    return start_allreduce(list(tensors), in_place=True, grouped=True, average=average,
                           name=name, op=op, prescale_factor=prescale_factor,
                           postscale_factor=postscale_factor, process_set=process_set,
                           synchronous=True).wait()


class SparseAllreduceHandle(DerivedHandle):
    """What Horovod's ``sparse_allreduce_async`` returns: call it for the result. It is also a
    handle, for ``synchronize`` and ``poll``."""

    __slots__ = ()

    def __call__(self) -> torch.Tensor:
        return self.wait()


def sparse_allreduce_async(tensor: torch.Tensor, name: str | None = None,
                           op: ReduceOp | None = None,
                           process_set: ProcessSet = global_process_set) -> SparseAllreduceHandle:
    """Start an allreduce of a sparse COO tensor by gathering every member's indices and values
    (as ``<name>.indices`` and ``<name>.values``), as Horovod does.

    Returns:
        A handle to call (``handle()``, Horovod's form) or ``synchronize``: it gives a coalesced
        sparse tensor of ``tensor``'s shape, the sum, or with ``Average`` (the default) the sum
        divided by the size of ``process_set``.

    Raises:
        ValueError: ``tensor`` is not sparse COO, or ``op`` is neither Average nor Sum.
    """
    reduce_op = resolve_op(op, None, ReduceOp.AVERAGE)
    if reduce_op not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        raise ValueError(f"sparse allreduce supports Average and Sum, got {reduce_op!r}")
    if not tensor.is_sparse:
        raise ValueError("sparse_allreduce_async needs a sparse COO tensor; use allreduce_async "
                         "for dense ones")
    sparse = tensor.coalesce()
    base = name or runtime.current().auto_name("sparse_allreduce", process_set._id())
    indices = allgather_async(sparse.indices().t().contiguous(), name=f"{base}.indices",
                              process_set=process_set)
    values = allgather_async(sparse.values(), name=f"{base}.values", process_set=process_set)
    members = process_set.size()

    def finish(_):
        # Checked: a peer that passed a larger tensor under this name sent indices out of range
        summed = torch.sparse_coo_tensor(synchronize(indices).t(), synchronize(values),
                                         size=sparse.shape, check_invariants=True).coalesce()
        return summed / members if reduce_op is ReduceOp.AVERAGE else summed

    return SparseAllreduceHandle(base, [indices, values], finish)


# -- allgather ---------------------------------------------------------------------------------

def _check_gatherable(tensors: Sequence[torch.Tensor]) -> None:
    check_tensors(tensors, OpType.ALLGATHER)
    for t in tensors:
        if t.dim() == 0:
            raise ValueError("allgather needs tensors with at least one dimension; use "
                             "tensor.reshape(1) for a scalar")


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start gathering ``tensor`` from every member, concatenated along dim 0 in rank order.

    The first dimension may differ between ranks; the others must agree.
    """
    _check_gatherable([tensor])
    return submit(OpType.ALLGATHER, name, [tensor], [tensor.detach().contiguous()], process_set)


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> Handle:
    """Start an allgather of a list of tensors as one unit."""
    _check_gatherable(tensors)
    return submit(OpType.ALLGATHER, name, list(tensors),
                  [t.detach().contiguous() for t in tensors], process_set, grouped=True)


# -- broadcast ---------------------------------------------------------------------------------

def _check_root(root_rank: int) -> None:
    size = runtime.current().topology.size
    if not isinstance(root_rank, int) or not 0 <= root_rank < size:
        raise ValueError(f"root_rank must be a rank in [0, {size}), got {root_rank!r}")


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start broadcasting rank ``root_rank``'s ``tensor``; returns a new tensor on every rank."""
    check_tensors([tensor], OpType.BROADCAST)
    _check_root(root_rank)
    return submit(OpType.BROADCAST, name, [tensor], [contiguous_work(tensor, False)], process_set,
                  root_rank=root_rank)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Handle:
    """Start broadcasting rank ``root_rank``'s ``tensor`` into ``tensor`` on every rank."""
    check_tensors([tensor], OpType.BROADCAST)
    _check_root(root_rank)
    work = contiguous_work(tensor, True)

    def finish(result):
        if not tensor.is_contiguous():  # broadcast into a contiguous copy: write it back
            tensor.data.copy_(work)
        return tensor

    return submit(OpType.BROADCAST, name, [tensor], [work], process_set, root_rank=root_rank,
                  finish=finish)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Broadcast rank ``root_rank``'s ``tensor`` in place and return it."""
    return run_synchronously(lambda: broadcast_async_(tensor, root_rank, name, process_set))


# -- alltoall ----------------------------------------------------------------------------------

def alltoall_async(tensor: torch.Tensor, splits: torch.Tensor | Sequence[int] | None = None,
                   name: str | None = None,
                   process_set: ProcessSet = global_process_set) -> Handle:
    """Start an alltoall: rows ``splits[i]`` of ``tensor`` go to member ``i``.

    Without ``splits`` the first dimension is divided equally. ``synchronize`` returns
    ``(received_tensor, received_splits)``.
    """
    check_tensors([tensor], OpType.ALLTOALL)
    n = process_set.size()
    if tensor.dim() == 0:
        raise ValueError("alltoall needs a tensor with at least one dimension")
    if splits is None:
        if tensor.shape[0] % n:
            raise ValueError(f"alltoall without splits needs the first dimension "
                             f"({tensor.shape[0]}) divisible by the number of ranks ({n})")
        split_list = [tensor.shape[0] // n] * n
    else:
        split_list = [int(s) for s in (splits.tolist() if torch.is_tensor(splits) else splits)]
        if len(split_list) != n or sum(split_list) != tensor.shape[0] or min(split_list) < 0:
            raise ValueError(f"splits {split_list} must have one non-negative entry per rank "
                             f"({n}) summing to the first dimension ({tensor.shape[0]})")
    return submit(OpType.ALLTOALL, name, [tensor], [tensor.detach().contiguous()], process_set,
                  splits=split_list)


# -- reducescatter -----------------------------------------------------------------------------

def _reducescatter_async(tensors, *, grouped, name, op, prescale_factor, postscale_factor,
                         process_set) -> Handle:
    check_tensors(tensors, OpType.REDUCESCATTER)
    reduce_op = resolve_op(op, None, ReduceOp.AVERAGE)
    if reduce_op is ReduceOp.ADASUM:
        raise UnsupportedOperationError(
            "reducescatter does not support Adasum; use op=Sum or op=Average (Adasum applies "
            "to allreduce and DistributedOptimizer)")
    check_reduction(tensors, reduce_op, prescale_factor, postscale_factor)
    for t in tensors:
        if t.dim() == 0:
            raise ValueError("reducescatter needs tensors with at least one dimension")
    return submit(OpType.REDUCESCATTER, name, list(tensors),
                  [contiguous_work(t, False) for t in tensors], process_set,
                  reduce_op=reduce_op, prescale=prescale_factor, postscale=postscale_factor,
                  grouped=grouped)


def reducescatter_async(tensor: torch.Tensor, name: str | None = None,
                        op: ReduceOp | None = None,
                        process_set: ProcessSet = global_process_set,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Handle:
    """Start a reduction whose result is split along dim 0 among the members.

    Member ``i`` receives rows of its part; the first ``rows % size`` members get one more row.
    """
    return _reducescatter_async([tensor], grouped=False, name=name, op=op,
                                prescale_factor=prescale_factor,
                                postscale_factor=postscale_factor, process_set=process_set)


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                                op: ReduceOp | None = None,
                                process_set: ProcessSet = global_process_set,
                                prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> Handle:
    """Start a reducescatter of a list of tensors as one unit."""
    return _reducescatter_async(list(tensors), grouped=True, name=name, op=op,
                                prescale_factor=prescale_factor,
                                postscale_factor=postscale_factor, process_set=process_set)


# -- join and barrier --------------------------------------------------------------------------

def join(device: int = -1) -> int:
    """Declare that this rank has no more data; wait until every rank has joined.

    Until then this rank takes part in the others' allreduces with zeros; their other
    collectives that need it fail (docs/engine.md, "Join"). Returns the rank that joined last.
    """
    del device  # results are plain integers here; Horovod uses it to place a tensor
    last = synchronize(submit(OpType.JOIN, "join", [], [], global_process_set))
    runtime.current().joined()
    return last


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait until every member of ``process_set`` has reached this barrier."""
    synchronize(submit(OpType.BARRIER, None, [], [], process_set))
