"""Helpers built on the collectives: broadcasting model and optimizer state, and objects."""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from ringtrain.torch import ops, runtime
from ringtrain.torch.process_sets import ProcessSet, global_process_set


def broadcast_parameters(params: Mapping[str, torch.Tensor] | Iterable, root_rank: int,
                         process_set: ProcessSet = global_process_set) -> None:
    """Overwrite every rank's parameters with rank ``root_rank``'s, in place.

    Args:
        params: a ``state_dict()``, or ``named_parameters()`` (or a list of tensors).
        root_rank: the rank whose values everyone takes.
    """
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
                              process_set: ProcessSet = global_process_set) -> None:
    """Give every rank's optimizer the state and hyperparameters of rank ``root_rank``'s.

    Works for any torch optimizer, including those that create their state lazily on the first
    step: the root's whole ``state_dict()`` is sent, so ranks whose state does not exist yet
    receive it as it is on the root.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("broadcast_optimizer_state does not support LBFGS (its state holds "
                         "closures over the whole history); broadcast the parameters instead")
    is_root = runtime.current().topology.rank == root_rank
    state = broadcast_object(optimizer.state_dict() if is_root else None, root_rank,
                             name="broadcast_optimizer_state", process_set=process_set)
    if not is_root:
        optimizer.load_state_dict(state)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Return rank ``root_rank``'s ``obj`` (any picklable object, tensors included) everywhere."""
    name = name or runtime.current().auto_name("broadcast_object", process_set.process_set_id)
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
    name = name or runtime.current().auto_name("allgather_object", process_set.process_set_id)
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
