"""Helpers built on the collectives: broadcasting model and optimizer state, and objects."""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from ringtrain.torch import ops, runtime
from ringtrain.torch import optimizer as distributed_optimizer
from ringtrain.torch.process_sets import ProcessSet, global_process_set


def broadcast_parameters(params: Mapping[str, torch.Tensor] | Iterable, root_rank: int,
                         process_set: ProcessSet = global_process_set) -> None:
    """Overwrite every rank's ``params`` (a ``state_dict()``, ``named_parameters()`` or a list
    of tensors) with rank ``root_rank``'s, in place."""
    if isinstance(params, Mapping):
        items = sorted(params.items())
    else:
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    handles = []
    for i, (name, tensor) in enumerate(items):
        if not torch.is_tensor(tensor):
            continue
        op_name = f"broadcast_parameters.{name if name is not None else i}"
        handles.append(ops.broadcast_async_(tensor, root_rank, op_name, process_set))
    for handle in handles:
        ops.synchronize(handle)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              model: torch.nn.Module | None = None,
                              process_set: ProcessSet = global_process_set) -> None:
    """Give every rank's optimizer the state and hyperparameters of rank ``root_rank``'s.

    As in Horovod, an optimizer without any state yet first creates it: each trainable
    parameter gets a zero gradient, and the optimizer takes one step on this rank alone (a
    ``DistributedOptimizer`` without reducing; the parameters keep their values). Then the
    root's whole ``state_dict()`` is sent, so that parameters without state on the root end up
    without state everywhere.

    Args:
        optimizer: a ``torch.optim.Optimizer`` or a ``DistributedOptimizer``.
        model: the model, to find sparse embeddings: their zero gradients are made sparse for
            ``SGD`` (``SparseAdam`` always gets sparse ones), as the optimizer expects.

    Raises:
        ValueError: ``optimizer`` is an ``LBFGS``, whose state cannot be sent.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("broadcast_optimizer_state does not support LBFGS (its state holds "
                         "closures over the whole history); broadcast the parameters instead")
    if not optimizer.state_dict()["state"]:
        _create_state(optimizer, _sparse_parameters(model))
    is_root = runtime.current().topology.rank == root_rank
    state = broadcast_object(optimizer.state_dict() if is_root else None, root_rank,
                             name="broadcast_optimizer_state", process_set=process_set)
    if not is_root:
        optimizer.load_state_dict(state)


def _sparse_parameters(model: torch.nn.Module | None) -> set[int]:
    if model is None:
        return set()
    return {id(p) for m in model.modules()
            if isinstance(m, torch.nn.Embedding) and m.sparse for p in m.parameters()}


def _create_state(optimizer: torch.optim.Optimizer, sparse: set[int]) -> None:
    """Horovod's state initialisation: zero gradients for trainable parameters, one local step.

    The parameters are put back afterwards: with weight decay (AdamW, ASGD, ...) even a zero
    gradient moves them, which Horovod lets happen; here the step only creates the state.
    """
    trainable = [p for group in optimizer.param_groups for p in group["params"]
                 if p.requires_grad]
    sparse_always = isinstance(optimizer, torch.optim.SparseAdam)
    sparse_for_sgd = isinstance(optimizer, torch.optim.SGD)
    for p in trainable:
        p.grad = torch.zeros_like(p)
        if sparse_always or (sparse_for_sgd and id(p) in sparse):
            p.grad = p.grad.to_sparse()
    values = [p.detach().clone() for p in trainable]
    # A DistributedOptimizer is a subclass of the user's optimizer class defined in the
    # optimizer module: its own step() would reduce the gradients, so step the user's class.
    if type(optimizer).__module__ == distributed_optimizer.__name__:
        super(type(optimizer), optimizer).step()  # type: ignore[misc]  # mypy: dynamic super
    else:
        optimizer.step()
    with torch.no_grad():
        for p, value in zip(trainable, values):
            p.copy_(value)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Return rank ``root_rank``'s ``obj`` (any picklable object, tensors included) everywhere."""
    name = name or runtime.current().auto_name("broadcast_object", process_set._id())
    is_root = runtime.current().topology.rank == root_rank
    payload = _serialize(obj) if is_root else torch.empty(0, dtype=torch.uint8)
    length = ops.broadcast_(torch.tensor([payload.numel()], dtype=torch.int64), root_rank,
                            f"{name}.length", process_set)
    if not is_root:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    payload = ops.broadcast_(payload, root_rank, f"{name}.data", process_set)
    return obj if is_root else _deserialize(payload)


def allgather_object(obj: Any, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:
    """Return the list of every member's ``obj``, in rank order."""
    name = name or runtime.current().auto_name("allgather_object", process_set._id())
    payload = _serialize(obj)
    lengths = ops.synchronize(ops.allgather_async(
        torch.tensor([payload.numel()], dtype=torch.int64), f"{name}.lengths", process_set))
    gathered = ops.synchronize(ops.allgather_async(payload, f"{name}.data", process_set))
    out, offset = [], 0
    for n in lengths.tolist():
        out.append(_deserialize(gathered[offset:offset + n]))
        offset += n
    return out


def _serialize(obj: Any) -> torch.Tensor:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return torch.frombuffer(bytearray(buf.getbuffer()), dtype=torch.uint8)


def _deserialize(payload: torch.Tensor) -> Any:
    # Objects come from this job's own ranks, so full unpickling is what the caller asked for.
    return torch.load(io.BytesIO(payload.numpy().tobytes()), weights_only=False)
