"""Horovod's Keras collectives on values: numpy arrays, Python numbers, torch tensors and
Keras variables, each through ringtrain.torch's one submission path.

A numpy array, number or list gives back a numpy array; a torch tensor or a Keras variable
gives back a torch tensor (Keras' backend tensor).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from ringtrain.op_types import ReduceOp
from ringtrain.torch import ops
from ringtrain.torch.compression import Compression
from ringtrain.torch.process_sets import ProcessSet, global_process_set


def _as_tensor(value: Any) -> tuple[torch.Tensor, bool]:
    """``value`` as a contiguous torch tensor, and whether the caller gets numpy back."""
    if isinstance(value, torch.Tensor):
        return value.detach(), False
    inner = getattr(value, "value", None)  # a Keras variable on the torch backend
    if isinstance(inner, torch.Tensor):
        return inner.detach(), False
    array = np.ascontiguousarray(np.asarray(value))
    if array.dtype == object:
        raise ValueError(f"cannot reduce a value of type {type(value).__name__}: pass numbers, "
                         "numpy arrays or tensors")
    return torch.from_numpy(array), True


def _back(result: torch.Tensor, as_numpy: bool) -> Any:
    return result.numpy() if as_numpy else result


def allreduce(value: Any, name: str | None = None, average: bool | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              op: ReduceOp | None = None, compression: Any = Compression.none) -> Any:
    """Reduce ``value`` (of the same shape on every rank) over all ranks, the average by
    default; as :func:`ringtrain.torch.allreduce` otherwise (``average`` deprecated)."""
    tensor, as_numpy = _as_tensor(value)
    wire, ctx = compression.compress(tensor)
    result = ops.synchronize(ops.allreduce_async(wire, average=average, name=name, op=op,
                                                 prescale_factor=prescale_factor,
                                                 postscale_factor=postscale_factor))
    return _back(compression.decompress(result, ctx), as_numpy)


def allgather(value: Any, name: str | None = None) -> Any:
    """Concatenate every rank's ``value`` along the first dimension, in rank order (the first
    dimension may differ between ranks)."""
    tensor, as_numpy = _as_tensor(value)
    return _back(ops.synchronize(ops.allgather_async(tensor, name=name)), as_numpy)


def broadcast(value: Any, root_rank: int, name: str | None = None) -> Any:
    """Return rank ``root_rank``'s ``value`` on every rank (same shape everywhere)."""
    tensor, as_numpy = _as_tensor(value)
    return _back(ops.synchronize(ops.broadcast_async(tensor, root_rank, name=name)), as_numpy)


def reducescatter(value: Any, name: str | None = None, op: ReduceOp = ReduceOp.AVERAGE) -> Any:
    """Reduce ``value`` over all ranks and give each rank its share of the rows (the first
    ``rows % size`` ranks get one more)."""
    tensor, as_numpy = _as_tensor(value)
    return _back(ops.synchronize(ops.reducescatter_async(tensor, name=name, op=op)), as_numpy)


def is_seed_state(variable: Any) -> bool:
    """Whether ``variable`` is the state of a ``keras.random.SeedGenerator`` (dropout,
    augmentation layers): left out of model broadcasts, so that each rank keeps drawing its own
    random numbers, as separate TensorFlow processes under Horovod do."""
    return getattr(variable, "name", None) == "seed_generator_state"


def broadcast_variables(variables: Iterable[Any], root_rank: int,
                        process_set: ProcessSet = global_process_set,
                        name: str = "broadcast_variables") -> None:
    """Overwrite Keras variables (``model.variables``, say, in the same order on every rank),
    in place on every rank, with rank ``root_rank``'s values; ``name``: the operations'
    names' prefix."""
    handles = []
    for i, variable in enumerate(variables):
        tensor = variable.value
        handles.append(ops.broadcast_async_(tensor, root_rank, f"{name}.{i}.{variable.path}",
                                            process_set))
    for handle in handles:
        ops.synchronize(handle)


def broadcast_global_variables(root_rank: int) -> None:
    """Horovod's TF1 call, which Keras 3 cannot offer: it keeps no collection of global
    variables (in TensorFlow 2's eager mode Horovod's raises too).

    Raises:
        RuntimeError: always, saying what to use instead.
    """
    raise RuntimeError(
        f"hvd.broadcast_global_variables({root_rank}) needs TensorFlow 1's global variable "
        "collection, which Keras 3 does not have (Horovod raises the same in TensorFlow 2's "
        f"eager mode). Use hvd.callbacks.BroadcastGlobalVariablesCallback({root_rank}) in "
        f"model.fit(callbacks=...), or hvd.broadcast_variables(model.variables, {root_rank}) "
        "(and the optimizer's variables) once the model is built")
