"""The one path from a frontend call to the engine: validate, describe, queue, return a handle."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ringtrain.engine.handle import Handle
from ringtrain.engine.request import Request, RequestMeta, TensorMeta
from ringtrain.op_types import OpType, ReduceOp
from ringtrain.torch import runtime
from ringtrain.torch.process_sets import ProcessSet, global_process_set


class _Synchronous(threading.local):
    """Set while :func:`run_synchronously` submits: this thread waits for the result at once
    (a class default: a missing attribute of a thread-local costs an exception on every
    look)."""

    active = False


_synchronous = _Synchronous()

SUPPORTED_DTYPES = frozenset({
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
    torch.bfloat16, torch.float32, torch.float64, torch.bool,
})


def submit(
    op: OpType,
    name: str | None,
    inputs: Sequence[torch.Tensor],
    outputs: Sequence[torch.Tensor],
    process_set: ProcessSet | None = None,
    *,
    reduce_op: ReduceOp | None = None,
    root_rank: int = -1,
    prescale: float = 1.0,
    postscale: float = 1.0,
    splits: Sequence[int] | None = None,
    grouped: bool = False,
    finish: Callable[[Any], Any] | None = None,
    synchronous: bool | None = None,
) -> Handle:
    """Queue one named operation on this rank's engine and return its handle.

    ``inputs`` have passed :func:`check_tensors` (before ``outputs`` were made from them).
    ``outputs`` are the tensors the engine works in (clones for out-of-place forms, the tensors
    themselves for in-place ones); ``finish`` post-processes the engine's result in the thread
    that synchronizes. ``synchronous``: the caller waits for the result at once (None: whether
    it submits inside :func:`run_synchronously`).

    Raises:
        ValueError: the tensors, process set or arguments cannot be used.
    """
    rt = runtime.current()
    process_set = global_process_set if process_set is None else process_set
    members = process_set._members()
    if rt.topology.rank not in members:
        raise ValueError(f"rank {rt.topology.rank} is not a member of {process_set!r}; only "
                         "members may submit collectives on it")
    if name is None:
        name = rt.auto_name(op.value, process_set._id())
    elif not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    as_ints = None if splits is None else tuple(int(s) for s in splits)
    meta = _describe(rt, (name, op, members, reduce_op, root_rank, float(prescale),
                          float(postscale), as_ints), inputs)
    handle = Handle(name, finish)
    ready = None
    if meta.on_cuda:
        ready = torch.cuda.Event()
        ready.record()
    request = Request(meta=meta, outputs=list(outputs), handle=handle, ready_event=ready,
                      grouped=grouped)
    if synchronous is None:
        synchronous = _synchronous.active
    rt.engine.submit(request, synchronous=synchronous)
    return handle


def _describe(rt: runtime.Runtime, args: tuple, inputs: Sequence[torch.Tensor]) -> RequestMeta:
    """The request's meta for ``args`` (name, op, members, reduce op, root, prescale,
    postscale, splits) and the inputs: the one built before for the same arguments and inputs of
    the same shapes, dtypes and devices, if this runtime remembers it. A training loop submits
    the same names step after step; a meta costs more to build than to find, and the response
    cache recognises one it has already compared (see ``ResponseCache.lookup``)."""
    signature = [(t.shape, t.dtype, t.is_cuda) for t in inputs]
    known = rt.metas.get(args)
    if known is not None and known[0] == signature:
        return known[1]
    name, op, members, reduce_op, root_rank, prescale, postscale, splits = args
    meta = RequestMeta(name=name, op=op, rank=rt.topology.rank, set_ranks=members,
                       tensors=tuple(TensorMeta(tuple(t.shape), str(t.dtype), t.device.type)
                                     for t in inputs),
                       reduce_op=reduce_op, root_rank=root_rank, prescale=prescale,
                       postscale=postscale, splits=splits)
    if known is not None or len(rt.metas) < runtime.METAS_KEPT:
        rt.metas[args] = (signature, meta)
    return meta


def run_synchronously(start: Callable[[], Handle]) -> Any:
    """Submit with ``start`` and wait for the result: the synchronous forms (``allreduce_``).

    The engine knows that this thread blocks on the operation right away, so a lone cached one
    may run in this thread instead of being handed to the engine thread and back (see
    :mod:`ringtrain.engine.engine`).

    Raises:
        ValueError: as for :func:`submit`.
        RuntimeError: as for :meth:`Handle.wait`.
    """
    previous = _synchronous.active
    _synchronous.active = True
    try:
        handle = start()
    finally:
        _synchronous.active = previous
    return handle.wait()


def check_tensors(tensors: Sequence[torch.Tensor], op: OpType) -> None:
    """Refuse what no collective takes (not a tensor, a dtype, a layout or a device it does
    not support), first thing: before a copy or a view is made of it."""
    for tensor in tensors:
        _check_tensor(tensor, op)


def _check_tensor(tensor: torch.Tensor, op: OpType) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{op.value} expects torch.Tensor arguments, got {type(tensor).__name__}")
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{op.value} does not support dtype {tensor.dtype}; supported: "
                         + ", ".join(sorted(str(d).removeprefix("torch.")
                                            for d in SUPPORTED_DTYPES)))
    if tensor.is_sparse:
        raise ValueError(f"{op.value} needs a dense tensor; use sparse_allreduce_async for "
                         "sparse ones, or .to_dense()")
    if not (tensor.is_cpu or tensor.is_cuda):  # properties: device.type builds a device
        raise ValueError(f"{op.value}: tensors on {tensor.device.type} are not supported; "
                         "use CPU or CUDA tensors")


def resolve_op(op: ReduceOp | None, average: bool | None, default: ReduceOp) -> ReduceOp:
    """Horovod's ``op``/``average`` arguments as one reduction (``average`` is deprecated)."""
    if op is not None and average is not None:
        raise ValueError("pass either op= or the deprecated average=, not both")
    if average is not None:
        return ReduceOp.AVERAGE if average else ReduceOp.SUM
    if op is None:
        return default
    if not isinstance(op, ReduceOp):
        raise ValueError(f"op must be one of hvd.Average, hvd.Sum, hvd.Min, hvd.Max, "
                         f"hvd.Product, hvd.Adasum; got {op!r}")
    return op


def check_reduction(tensors: Sequence[torch.Tensor], op: ReduceOp, prescale: float,
                    postscale: float) -> None:
    """Refuse reductions that have no meaning for the dtype, before anything is queued."""
    for t in tensors:
        if t.dtype is torch.bool and (op in (ReduceOp.AVERAGE, ReduceOp.ADASUM)
                                      or prescale != 1 or postscale != 1):
            raise ValueError(f"{op!r} and scale factors are undefined for boolean tensors; use "
                             "Sum (any), Min (all), Max or Product")
        if op is ReduceOp.ADASUM and not t.dtype.is_floating_point:
            raise ValueError(f"Adasum needs floating-point tensors, got {t.dtype}")


def contiguous_work(tensor: torch.Tensor, in_place: bool) -> torch.Tensor:
    """The tensor the engine reduces into: a private contiguous copy unless working in place."""
    if not in_place:
        return tensor.detach().clone(memory_format=torch.contiguous_format)
    return tensor.data if tensor.is_contiguous() else tensor.detach().contiguous()
