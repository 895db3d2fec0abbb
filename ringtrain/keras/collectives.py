"""Horovod's Keras collectives on values: numpy arrays, Python numbers, torch tensors and
Keras variables, each through ringtrain.torch's one submission path.

A numpy array, number or list gives back a numpy array (a number: a numpy scalar, as Horovod's
session run gives one); a torch tensor or a Keras variable on the torch backend gives back a
torch tensor (Keras' backend tensor); a Keras variable or tensor of TensorFlow or JAX gives back
a numpy array. A scalar stays a scalar: ``hvd.broadcast(resume_from_epoch, 0)`` is usable as
``fit(initial_epoch=...)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from ringtrain.errors import TensorMismatchError
from ringtrain.keras.handoff import current as current_handoff
from ringtrain.op_types import ReduceOp
from ringtrain.torch import ops
from ringtrain.torch.compression import Compression
from ringtrain.torch.functions import allgather_object
from ringtrain.torch.process_sets import ProcessSet, global_process_set


def _as_tensor(value: Any) -> tuple[torch.Tensor, bool]:
    """``value`` as a contiguous torch tensor of its own shape, and whether the caller gets
    numpy back."""
    if isinstance(value, torch.Tensor):
        return value.detach(), False
    inner = getattr(value, "value", None)  # a Keras variable on the torch backend
    if isinstance(inner, torch.Tensor):
        return inner.detach(), False
    # Not np.ascontiguousarray: it makes a scalar a 1-element vector.
    array = np.require(np.asarray(value), requirements="C")
    if array.dtype == object:
        raise ValueError(f"cannot reduce a value of type {type(value).__name__}: pass numbers, "
                         "numpy arrays or tensors")
    return torch.from_numpy(array), True


def _back(result: torch.Tensor, value: Any, as_numpy: bool) -> Any:
    if not as_numpy:
        return result
    array = result.numpy()
    # A number in gives a numpy number out (a 0-d array in, a 0-d array out).
    return array[()] if array.ndim == 0 and not isinstance(value, np.ndarray) else array


def allreduce(value: Any, name: str | None = None, average: bool | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              op: ReduceOp | None = None, compression: Any = Compression.none) -> Any:
    """Reduce ``value`` (of the same shape on every rank) over all ranks, the average by
    default; as :func:`ringtrain.torch.allreduce` otherwise (``average`` deprecated)."""
    tensor, as_numpy = _as_tensor(value)
    wire, ctx = compression.compress(tensor)
    # Waited for at once: a lone cached one runs in this thread (docs/engine.md, "The express
    # round"), not handed to the engine's thread and back.
    result = ops.start_allreduce([wire], in_place=False, grouped=False, average=average,
                                 name=name, op=op, prescale_factor=prescale_factor,
                                 postscale_factor=postscale_factor,
                                 process_set=global_process_set, synchronous=True).wait()
    return _back(compression.decompress(result, ctx), value, as_numpy)


def allgather(value: Any, name: str | None = None) -> Any:
    """Concatenate every rank's ``value`` along the first dimension, in rank order (the first
    dimension may differ between ranks).

    Raises:
        ValueError: ``value`` is a scalar, which has no first dimension (Horovod refuses a
            rank-zero tensor too): gather ``[value]``.
    """
    tensor, as_numpy = _as_tensor(value)
    if tensor.dim() == 0:
        raise ValueError("allgather concatenates along the first dimension, which a scalar "
                         "does not have (Horovod refuses it too): gather [value] for a vector "
                         "of every rank's value")
    return _back(ops.synchronize(ops.allgather_async(tensor, name=name)), value, as_numpy)


def broadcast(value: Any, root_rank: int, name: str | None = None) -> Any:
    """Return rank ``root_rank``'s ``value`` on every rank (same shape everywhere)."""
    tensor, as_numpy = _as_tensor(value)
    return _back(ops.synchronize(ops.broadcast_async(tensor, root_rank, name=name)), value,
                 as_numpy)


def reducescatter(value: Any, name: str | None = None, op: ReduceOp = ReduceOp.AVERAGE) -> Any:
    """Reduce ``value`` over all ranks and give each rank its share of the rows (the first
    ``rows % size`` ranks get one more)."""
    tensor, as_numpy = _as_tensor(value)
    return _back(ops.synchronize(ops.reducescatter_async(tensor, name=name, op=op)), value,
                 as_numpy)


def is_seed_state(variable: Any) -> bool:
    """Whether ``variable`` is the state of a ``keras.random.SeedGenerator`` (dropout,
    augmentation layers): left out of model broadcasts, so that each rank keeps drawing its own
    random numbers, as separate TensorFlow processes under Horovod do."""
    return getattr(variable, "name", None) == "seed_generator_state"


def check_same_variables(variables: Sequence[Any], name: str,
                         process_set: ProcessSet = global_process_set) -> None:
    """Check that every member has variables of the same shapes and dtypes, in the same order.

    Ranks pair their variables by position, as Horovod does, not by their paths: Keras
    generates those (``dense_1/bias`` in a loaded model, ``sequential_1/dense_3/bias`` in one
    built after another), so they differ between a rank that loaded a checkpoint and one that
    built a fresh model. One object allgather (``name``) on every member, so that all of them
    raise alike.

    Raises:
        TensorMismatchError: the members' variables differ (another architecture), naming
            the first difference and both shapes.
    """
    mine = [(tuple(v.shape), str(v.dtype)) for v in variables]
    everyone = allgather_object(mine, name=name, process_set=process_set)
    first = everyone[0]
    for rank, theirs in enumerate(everyone):
        if theirs == first:
            continue
        where = (f"rank 0 has {len(first)} variables, rank {rank} has {len(theirs)}"
                 if len(theirs) != len(first) else "")
        for i, (a, b) in enumerate(zip(first, theirs)):
            if a != b:
                path = getattr(variables[i], "path", "?")
                where = (f"variable {i} (here {path!r}) is {a[0]} {a[1]} on rank 0 and "
                         f"{b[0]} {b[1]} on rank {rank}")
                break
        raise TensorMismatchError(
            f"{name}: the ranks' variables differ: {where}. Ranks pair variables by their order "
            "(as Horovod does), so every rank needs the same model: the same layers, built "
            "alike, with the same variables left out")


def broadcast_variables(variables: Iterable[Any], root_rank: int,
                        process_set: ProcessSet = global_process_set,
                        name: str = "broadcast_variables") -> None:
    """Overwrite Keras variables (``model.variables``, say, in the same order on every rank),
    in place on every rank, with rank ``root_rank``'s values; ``name``: the operations'
    names' prefix.

    Raises:
        TensorMismatchError: the ranks' variables differ in number, shape or dtype.
    """
    variables = list(variables)
    check_same_variables(variables, f"{name}.variables", process_set)
    handoff = current_handoff()
    tensors = [handoff.read(v) for v in variables]
    handles = [ops.broadcast_async_(t, root_rank, f"{name}.{i}", process_set)
               for i, t in enumerate(tensors)]
    for variable, tensor, handle in zip(variables, tensors, handles):
        ops.synchronize(handle)
        handoff.write(variable, tensor)


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
