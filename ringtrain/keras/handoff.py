"""How values cross between Keras' backend and the engine, which works on torch CPU tensors.

One :class:`Handoff` per Keras backend, found by name in :data:`HANDOFFS`; the optimizer, the
broadcasts and the elastic state use the one of the running backend, so that their logic has one
code path (docs/keras.md, "Backends"):

- ``torch``: Keras' tensors and variables are torch tensors already; nothing is copied.
- ``tensorflow``: the gradients leave the compiled train step (``tf.function``) through
  ``tf.numpy_function``, a host call that TensorFlow runs once per step, in the step's order.
- ``jax``: the gradients leave the jitted train step through ``jax.experimental.io_callback``
  with ``ordered=True``: every rank must make its collectives in the same order, and an
  ordered callback is never dropped, duplicated or reordered by the compiler (a
  ``pure_callback`` may be).

On the host side the arrays become torch tensors with ``torch.from_numpy`` (no copy), the
reducer copies them into its buckets, and the reduced buckets go back as numpy views (no copy):
each gradient crosses memory once each way, as on the torch backend.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import torch

#: The host side of a hand-off: gradients as torch tensors (None: no gradient on this rank),
#: one per variable, in; reduced gradients, one per variable, out.
HostFn = Callable[[list[torch.Tensor | None]], list[torch.Tensor | None]]
#: A host side that may reduce nothing on a call (a pass only accumulated): None then.
GatedHostFn = Callable[[list[torch.Tensor | None]], list[torch.Tensor | None] | None]


def to_torch(array: np.ndarray) -> torch.Tensor:
    """``array`` as a torch tensor sharing its memory (bfloat16 through its bits)."""
    # Called for every gradient of every step: the cheap tests first (a dtype's name and
    # catch_warnings cost microseconds each). ml_dtypes' bfloat16, a void kind to numpy, is
    # unknown to torch.from_numpy.
    if array.dtype.kind == "V" and array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    if array.flags.writeable:
        return torch.from_numpy(array)
    with warnings.catch_warnings():
        # JAX hands read-only arrays to callbacks; they are only read (copied into buckets).
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        return torch.from_numpy(array)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A CPU torch tensor as a numpy array sharing its memory (bfloat16 through its bits)."""
    if tensor.dtype is torch.bfloat16:
        import ml_dtypes  # numpy's bfloat16, a dependency of both TensorFlow and JAX

        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def _torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of a Keras dtype name (``"float32"``)."""
    return getattr(torch, str(dtype))


def keras_dtype(dtype: str) -> np.dtype:
    """The numpy dtype of a Keras dtype name (bfloat16: ml_dtypes')."""
    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


class Handoff(Protocol):
    """What the Keras frontend needs from a backend to reach the engine."""

    def stand_in(self, variable: Any) -> torch.Tensor:
        """A torch tensor with ``variable``'s shape, dtype and device, for planning buckets;
        it is a key and a size, never written (may be a view of one element)."""

    def reduce(self, host: HostFn, grads: Sequence[Any], variables: Sequence[Any]) -> list:
        """``host`` applied to ``grads`` (backend tensors or None; symbolic inside a compiled
        step), as backend tensors of the variables' shapes and dtypes, one per variable."""

    def read(self, variable: Any) -> torch.Tensor:
        """``variable``'s value as a CPU torch tensor that may be written in place; give it
        to :meth:`write` after writing."""

    def write(self, variable: Any, tensor: torch.Tensor) -> None:
        """Store ``tensor`` (from :meth:`read`, changed in place) as ``variable``'s value."""

    def snapshot(self, variable: Any) -> Any:
        """A copy of ``variable``'s value that ``variable.assign`` takes back."""


class TorchHandoff:
    """Keras on torch: its variables hold torch tensors, which the engine takes as they are."""

    def stand_in(self, variable: Any) -> torch.Tensor:
        return variable.value

    def reduce(self, host: HostFn, grads: Sequence[Any], variables: Sequence[Any]) -> list:
        return host([g if g is None or isinstance(g, torch.Tensor) else torch.as_tensor(g)
                     for g in grads])

    def read(self, variable: Any) -> torch.Tensor:
        return variable.value.detach()  # the variable's own storage: written in place

    def write(self, variable: Any, tensor: torch.Tensor) -> None:
        pass  # read() gave the variable's storage, already written

    def snapshot(self, variable: Any) -> Any:
        return torch.clone(variable.value.detach())


class HostHandoff:
    """A backend whose tensors are not torch's, whose train step is compiled: values cross as
    numpy arrays through a host call in the step."""

    def stand_in(self, variable: Any) -> torch.Tensor:
        # One element, expanded: the variable's shape and dtype without its memory.
        return torch.zeros(1, dtype=_torch_dtype(variable.dtype)).expand(tuple(variable.shape))

    def reduce(self, host: HostFn, grads: Sequence[Any], variables: Sequence[Any]) -> list:
        return self._call(host, grads, variables, gated=False)

    def reduce_when(self, host: GatedHostFn, grads: Sequence[Any],
                    variables: Sequence[Any]) -> tuple[list, Any]:
        """:meth:`reduce` for a ``host`` that may return None (nothing reduced on this call):
        the tensors (zeros then) and a boolean scalar tensor, whether ``host`` returned some;
        the compiled step always runs the call, so the step decides on the flag."""
        outputs = self._call(host, grads, variables, gated=True)
        return outputs[:-1], outputs[-1]

    def _call(self, host: GatedHostFn, grads: Sequence[Any], variables: Sequence[Any],
              gated: bool) -> list:
        """The backend's host call of ``host`` inside the compiled step: its outputs, one
        per variable, and the flag if ``gated``."""
        raise NotImplementedError

    def read(self, variable: Any) -> torch.Tensor:
        import keras

        return to_torch(np.array(keras.ops.convert_to_numpy(variable)))  # a writable copy

    def write(self, variable: Any, tensor: torch.Tensor) -> None:
        variable.assign(to_numpy(tensor))

    def snapshot(self, variable: Any) -> Any:
        import keras

        return np.array(keras.ops.convert_to_numpy(variable))

    @staticmethod
    def _host_call(host: GatedHostFn, present: list[bool], variables: Sequence[Any],
                   gated: bool) -> Callable[..., list[np.ndarray]]:
        """The function the backend calls with the present gradients as numpy arrays; it
        returns one array per variable (zeros where ``host`` gives None: a variable without a
        gradient in a world of one, or every variable where ``host`` returns None), then, if
        ``gated``, a boolean scalar: whether ``host`` returned gradients."""
        like = [(tuple(v.shape), str(v.dtype)) for v in variables]

        def call(*arrays: np.ndarray) -> list[np.ndarray]:
            given = iter(arrays)
            grads = [to_torch(np.asarray(next(given))) if p else None for p in present]
            out = host(grads)
            reduced = [to_numpy(g) if g is not None
                       else np.zeros(shape, keras_dtype(dtype))
                       for g, (shape, dtype) in zip(out or [None] * len(like), like)]
            return reduced + [np.array(out is not None)] if gated else reduced

        return call


class TensorFlowHandoff(HostHandoff):
    """Keras on TensorFlow: ``tf.numpy_function`` inside the ``tf.function`` train step."""

    def _call(self, host: GatedHostFn, grads: Sequence[Any], variables: Sequence[Any],
              gated: bool) -> list:
        import tensorflow as tf
        from tensorflow.python.ops import control_flow_util

        if control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
            # XLA compiles the whole step and cannot call back into Python.
            raise ValueError("DistributedOptimizer cannot reduce gradients inside an XLA-"
                             "compiled TensorFlow step: model.compile(..., jit_compile=False) "
                             "(Keras' default turns XLA on where a GPU is visible)")
        present = [g is not None for g in grads]
        # Sparse gradients (embeddings) travel dense, as Horovod's sparse_as_dense does.
        inputs = [tf.convert_to_tensor(g) for g in grads if g is not None]
        dtypes = [tf.as_dtype(v.dtype) for v in variables] + ([tf.bool] if gated else [])
        outputs = tf.numpy_function(self._host_call(host, present, variables, gated), inputs,
                                    dtypes, stateful=True, name="ringtrain_allreduce")
        shapes = [v.shape for v in variables] + ([()] if gated else [])
        for out, shape in zip(outputs, shapes):
            out.set_shape(shape)  # numpy_function's outputs have unknown shapes
        return list(outputs)


class JaxHandoff(HostHandoff):
    """Keras on JAX: an ordered ``io_callback`` inside the jitted train step."""

    def _call(self, host: GatedHostFn, grads: Sequence[Any], variables: Sequence[Any],
              gated: bool) -> list:
        import jax
        from jax.experimental import io_callback

        present = [g is not None for g in grads]
        shapes = [jax.ShapeDtypeStruct(tuple(v.shape), v.dtype) for v in variables]
        if gated:
            shapes.append(jax.ShapeDtypeStruct((), np.bool_))
        return list(io_callback(self._host_call(host, present, variables, gated), shapes,
                                *[g for g in grads if g is not None], ordered=True))


#: The hand-off of each Keras backend that ringtrain.keras runs on.
HANDOFFS: dict[str, Handoff] = {
    "torch": TorchHandoff(),
    "tensorflow": TensorFlowHandoff(),
    "jax": JaxHandoff(),
}


def current() -> Handoff:
    """The hand-off of the backend Keras runs on (checked at ``import ringtrain.keras``)."""
    import keras

    return HANDOFFS[keras.backend.backend()]
