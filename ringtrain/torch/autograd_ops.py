"""The synchronous collectives, differentiable as in Horovod.

The gradient of an allreduce is an allreduce of the gradient; of an allgather, this rank's slice
of the averaged gradient; of a broadcast, the averaged gradient on the root and zeros elsewhere;
of an alltoall, the alltoall back; of a reducescatter, an allgather of the gradient, scaled as
Horovod scales it (see :func:`_reducescatter_grad_scale`). The grouped forms differentiate each
tensor as the single forms do.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ringtrain.op_types import ReduceOp
from ringtrain.torch import ops, runtime
from ringtrain.torch.compression import Compression
from ringtrain.torch.process_sets import ProcessSet, global_process_set
from ringtrain.torch.submit import resolve_op, run_synchronously


def _allreduce(tensor: torch.Tensor, name: str | None, op: ReduceOp, prescale: float,
               postscale: float, process_set: ProcessSet) -> torch.Tensor:
    """The reduced copy of ``tensor``, waited for at once."""
    return ops.start_allreduce([tensor], in_place=False, grouped=False, average=None, name=name,
                               op=op, prescale_factor=prescale, postscale_factor=postscale,
                               process_set=process_set, synchronous=True).wait()


def _grouped_allreduce(tensors: Sequence[torch.Tensor], name: str | None, op: ReduceOp,
                       prescale: float, postscale: float,
                       process_set: ProcessSet) -> list[torch.Tensor]:
    """The reduced copies of ``tensors``, as one unit, waited for at once."""
    return ops.start_allreduce(list(tensors), in_place=False, grouped=True, average=None,
                               name=name, op=op, prescale_factor=prescale,
                               postscale_factor=postscale, process_set=process_set,
                               synchronous=True).wait()


def _broadcast(tensor: torch.Tensor, root_rank: int, name: str | None,
               process_set: ProcessSet) -> torch.Tensor:
    """Rank ``root_rank``'s ``tensor``, a new tensor, waited for at once."""
    return run_synchronously(lambda: ops.broadcast_async(tensor, root_rank, name, process_set))


def _needs_grad(tensor: torch.Tensor) -> bool:
    """Whether autograd records an operation on ``tensor``: a metric, a count or a tensor made
    under ``torch.no_grad()`` skips the ``autograd.Function`` of ``allreduce``,
    ``grouped_allreduce`` and ``broadcast`` (some 20 Python-level calls of a small operation's
    ~200), which would return the same tensors."""
    return tensor.requires_grad and torch.is_grad_enabled()


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, process_set):
        ctx.args = (op, prescale, postscale, process_set)
        return _allreduce(tensor, name, op, prescale, postscale, process_set)

    @staticmethod
    def backward(ctx, grad):
        op, prescale, postscale, process_set = ctx.args
        reduced = ops.synchronize(ops.allreduce_async(grad.contiguous(), None, None, op,
                                                      prescale, postscale, process_set))
        return reduced, None, None, None, None, None


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale, postscale, process_set, *tensors):
        ctx.args = (op, prescale, postscale, process_set)
        return tuple(_grouped_allreduce(tensors, name, op, prescale, postscale, process_set))

    @staticmethod
    def backward(ctx, *grads):
        op, prescale, postscale, process_set = ctx.args
        reduced = ops.synchronize(ops.grouped_allreduce_async(
            [g.contiguous() for g in grads], None, None, op, prescale, postscale, process_set))
        return (None, None, None, None, None, *reduced)


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.rows = [tensor.shape[0]]
        ctx.process_set = process_set
        return run_synchronously(lambda: ops.allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad):
        return _own_rows(ctx, [grad])[0], None, None


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.rows = [t.shape[0] for t in tensors]
        ctx.process_set = process_set
        return tuple(run_synchronously(lambda: ops.grouped_allgather_async(tensors, name,
                                                                       process_set)))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, *_own_rows(ctx, grads))


def _own_rows(ctx, grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The backward of an allgather: the gradients averaged over the members, each cut to the
    rows this rank contributed (the first dimension may differ between ranks)."""
    process_set = ctx.process_set
    reduced = ops.synchronize(ops.grouped_allreduce_async(
        [g.contiguous() for g in grads], None, None, ReduceOp.AVERAGE, 1.0, 1.0, process_set))
    rows = ops.synchronize(ops.allgather_async(torch.tensor([ctx.rows]), None, process_set))
    offsets = rows[:process_set.rank()].sum(dim=0).tolist()
    return [r.narrow(0, offset, n) for r, offset, n in zip(reduced, offsets, ctx.rows)]


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return _broadcast(tensor, root_rank, name, process_set)

    @staticmethod
    def backward(ctx, grad):
        reduced = ops.synchronize(ops.allreduce_async(grad.contiguous(), None, None,
                                                      ReduceOp.AVERAGE, 1.0, 1.0,
                                                      ctx.process_set))
        if runtime.current().topology.rank != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None, None


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        ctx.process_set = process_set
        output, received = run_synchronously(lambda: ops.alltoall_async(tensor, splits, name,
                                                                        process_set))
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad, _grad_splits):
        back, _ = ops.synchronize(ops.alltoall_async(grad.contiguous(), ctx.received, None,
                                                     ctx.process_set))
        return back, None, None, None


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale, postscale):
        ctx.args = (op, process_set, prescale, postscale)
        return run_synchronously(lambda: ops.reducescatter_async(tensor, name, op, process_set,
                                                                 prescale, postscale))

    @staticmethod
    def backward(ctx, grad):
        op, process_set, prescale, postscale = ctx.args
        gathered = ops.synchronize(ops.allgather_async(grad.contiguous(), None, process_set))
        return (gathered * _reducescatter_grad_scale(op, process_set, prescale, postscale),
                None, None, None, None, None)


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale, postscale, *tensors):
        ctx.args = (op, process_set, prescale, postscale)
        return tuple(run_synchronously(lambda: ops.grouped_reducescatter_async(
            tensors, name, op, process_set, prescale, postscale)))

    @staticmethod
    def backward(ctx, *grads):
        op, process_set, prescale, postscale = ctx.args
        gathered = ops.synchronize(ops.grouped_allgather_async(
            [g.contiguous() for g in grads], None, process_set))
        scale = _reducescatter_grad_scale(op, process_set, prescale, postscale)
        return (None, None, None, None, None, *(g * scale for g in gathered))


def _reducescatter_grad_scale(op: ReduceOp, process_set: ProcessSet, prescale: float,
                              postscale: float) -> float:
    """Horovod's factor on the allgathered gradient of a reducescatter: the pre- and postscale
    factors, times the member count for ``Sum``.

    For both ops that is the member count times the derivative of the members' summed loss;
    kept as it is because Horovod scripts are tuned to it (learning rates, say).
    """
    scale = prescale * postscale
    return scale * process_set.size() if op is ReduceOp.SUM else scale


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression=Compression.none, op: ReduceOp | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce ``tensor`` (left unmodified) over all ranks (default: average) and return the
    result; differentiable.

    Args:
        average: deprecated Horovod flag; use ``op``.
        name: a name unique among operations in flight; generated when omitted.
        compression: ``Compression.none``, ``.fp16`` or ``.bf16`` for the wire.
        prescale_factor / postscale_factor: multiply before / after the reduction.

    Raises:
        ValueError: bad arguments; RuntimeError: ranks disagree on the tensor, or a peer failed.
    """
    op = resolve_op(op, average, ReduceOp.AVERAGE)
    compressed, ctx = compression.compress(tensor)
    if _needs_grad(compressed):
        reduced = _Allreduce.apply(compressed, name, op, prescale_factor, postscale_factor,
                                   process_set)
    else:
        reduced = _allreduce(compressed, name, op, prescale_factor, postscale_factor,
                             process_set)
    return compression.decompress(reduced, ctx)


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None,
                      name: str | None = None, compression=Compression.none,
                      op: ReduceOp | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Reduce a list of tensors as one unit; see :func:`allreduce`."""
    op = resolve_op(op, average, ReduceOp.AVERAGE)
    pairs = [compression.compress(t) for t in tensors]
    wires = [c for c, _ in pairs]
    if any(_needs_grad(w) for w in wires):
        reduced = _GroupedAllreduce.apply(name, op, prescale_factor, postscale_factor,
                                          process_set, *wires)
    else:
        reduced = _grouped_allreduce(wires, name, op, prescale_factor, postscale_factor,
                                     process_set)
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, pairs)]


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Concatenate every member's ``tensor`` along dim 0, in rank order."""
    return _Allgather.apply(tensor, name, process_set)


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Allgather a list of tensors as one unit; see :func:`allgather`."""
    return list(_GroupedAllgather.apply(name, process_set, *tensors))


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Return rank ``root_rank``'s ``tensor`` on every member."""
    if _needs_grad(tensor):
        return _Broadcast.apply(tensor, root_rank, name, process_set)
    return _broadcast(tensor, root_rank, name, process_set)


def alltoall(tensor: torch.Tensor, splits=None, name: str | None = None,
             process_set: ProcessSet = global_process_set):
    """Exchange rows: ``splits[i]`` rows go to member ``i``.

    Returns:
        The received tensor; with ``splits`` given, ``(tensor, received_splits)`` as in Horovod.
    """
    output, received = _Alltoall.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received)


def reducescatter(tensor: torch.Tensor, name: str | None = None, compression=Compression.none,
                  op: ReduceOp | None = None, process_set: ProcessSet = global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce ``tensor`` and return this member's slice of the result along dim 0."""
    op = resolve_op(op, None, ReduceOp.AVERAGE)
    compressed, ctx = compression.compress(tensor)
    out = _Reducescatter.apply(compressed, name, op, process_set, prescale_factor,
                               postscale_factor)
    return compression.decompress(out, ctx)


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: str | None = None,
                          compression=Compression.none, op: ReduceOp | None = None,
                          process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """Reducescatter a list of tensors as one unit; see :func:`reducescatter`."""
    op = resolve_op(op, None, ReduceOp.AVERAGE)
    pairs = [compression.compress(t) for t in tensors]
    reduced = _GroupedReducescatter.apply(name, op, process_set, prescale_factor,
                                          postscale_factor, *[c for c, _ in pairs])
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, pairs)]
