"""``DistributedOptimizer`` for Keras 3: any ``keras.optimizers.Optimizer``, gradients averaged
across ranks before they are applied.

Every Keras trainer (torch, TensorFlow's ``tf.function`` step, JAX's jitted ``stateless_apply``)
ends in ``optimizer.apply(grads, variables)``: the wrapper is an instance of a subclass of the
user's optimizer class whose ``apply`` reduces the gradients first
(:mod:`ringtrain.keras.gradient_reducer`), through the backend's hand-off
(:mod:`ringtrain.keras.handoff`) where the step is compiled. The subclass has the wrapped class's
name and module, so a model saved with it loads in plain Keras (docs/keras.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ringtrain.keras import handoff as handoffs
from ringtrain.keras.backend import import_keras
from ringtrain.keras.gradient_reducer import GradientReducer
from ringtrain.op_types import ReduceOp
from ringtrain.torch import runtime
from ringtrain.torch.compression import Compression
from ringtrain.torch.process_sets import ProcessSet, global_process_set

_STATE = "_ringtrain_state"
_CLASSES: dict[type, type[Any]] = {}


class _CallableList(list):
    """``optimizer.variables`` that Horovod's code may also call, ``opt.variables()``, as
    TensorFlow's optimizers had it (Horovod's own ``CallableList``)."""

    def __call__(self) -> _CallableList:
        return self


class _DistributedState:
    """What a distributed optimizer adds to the user's: the reducer, local accumulation and
    the rank-local variables."""

    def __init__(self, reducer: GradientReducer, handoff: handoffs.Handoff, passes: int,
                 average_aggregated: bool, process_set: ProcessSet,
                 scale_local_gradients: bool):
        self.reducer = reducer
        self.handoff = handoff
        # TensorFlow and JAX trace apply() once into a compiled step: what depends on the world
        # (its size, an elastic reset) is decided at run time, inside the hand-off.
        self.compiled = not isinstance(handoff, handoffs.TorchHandoff)
        self.passes = passes
        self.average_aggregated = average_aggregated
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self.local_vars: set[int] = set()  # ids of variables whose gradients are not reduced
        self.counter = 0  # backward passes accumulated since the last reduction
        self.accumulated: list[torch.Tensor | None] = []
        self.world = runtime.current()  # the world whose passes are accumulated

    def apply(self, optimizer: Any, grads: Sequence[Any], variables: Sequence[Any] | None,
              base_apply: Callable[[Sequence, Sequence | None], Any]) -> Any:
        world = runtime.current()
        if world is not self.world:
            # A new world (an elastic reset): passes of the old one are dropped, so that
            # survivors and newcomers count this world's passes alike and reduce together.
            self.world, self.accumulated, self.counter = world, [], 0
        if len(grads) == 0:
            return base_apply(list(grads), variables)
        if self.passes == 1 and not self.compiled and self.process_set.size() == 1:
            return base_apply(grads, variables)  # nothing to reduce: the plain optimizer's cost
        if variables is None:
            if not optimizer.built:
                raise ValueError("apply(grads) without variables needs a built optimizer: call "
                                 "optimizer.build(model.trainable_variables) first, or pass them")
            variables = optimizer._trainable_variables
        variables = list(variables)
        grads = list(grads)
        if self.passes > 1 and self.compiled:
            return self._apply_passes_compiled(optimizer, grads, variables, base_apply)
        if self.passes > 1:
            self._accumulate(grads)
            self.counter += 1
            if self.counter < self.passes:
                # As Horovod: a pass without an update still counts as an iteration.
                optimizer._iterations.assign_add(1)
                return None
            grads, self.accumulated, self.counter = self.accumulated, [], 0
        given = grads
        grads = self.handoff.reduce(lambda host_grads: self._reduce(host_grads, variables),
                                    grads, variables)
        if self.compiled:
            # The compiled hand-off returns a tensor for every variable; a local variable
            # without a gradient stays without one, so that Keras leaves it alone.
            grads = [None if g is None and id(v) in self.local_vars else r
                     for g, r, v in zip(given, grads, variables)]
        if self.passes > 1 and self.average_aggregated:
            grads = [None if g is None else g / self.passes for g in grads]
        return base_apply(grads, variables)

    def _apply_passes_compiled(self, optimizer: Any, grads: list, variables: list,
                               base_apply: Callable[[Sequence, Sequence | None], Any]) -> None:
        """``backward_passes_per_step`` in a compiled step, which does the same on every
        pass: the host call counts the passes and sums the gradients, reducing the sums on a
        step's last pass (:meth:`_host_pass`); the step applies an update on every pass and
        keeps it on that pass only, as Keras' own gradient accumulation does on JAX (a jitted
        step cannot skip an assignment). The iteration counter counts every pass, as Horovod's.
        """
        keras = import_keras()
        if not optimizer.built:  # its slots must exist before they are kept or restored
            with keras.name_scope(optimizer.name, caller=optimizer):
                optimizer.build(variables)
            optimizer.built = True
        assert isinstance(self.handoff, handoffs.HostHandoff)  # self.compiled
        reduced, due = self.handoff.reduce_when(
            lambda host_grads: self._host_pass(host_grads, variables), grads, variables)
        reduced = [None if g is None and id(v) in self.local_vars else r
                   for g, r, v in zip(grads, reduced, variables)]
        if self.average_aggregated:
            reduced = [None if g is None else g / self.passes for g in reduced]
        kept = [v for v in (*variables, *optimizer.variables) if v is not optimizer.iterations]
        before = [keras.ops.copy(v) for v in kept]
        base_apply(reduced, variables)
        for v, old in zip(kept, before):
            v.assign(keras.ops.where(due, v.value, old))

    def _host_pass(self, grads: list, variables: list) -> list | None:
        """One backward pass on the host, from a compiled step: its gradients added to the
        sums of this world's passes; on the step's last pass the sums reduced, else None."""
        world = runtime.current()
        if world is not self.world:  # an elastic reset: as in apply()
            self.world, self.accumulated, self.counter = world, [], 0
        self._accumulate(grads)
        self.counter += 1
        if self.counter < self.passes:
            return None
        summed, self.accumulated, self.counter = self.accumulated, [], 0
        return self._reduce(summed, variables)

    def _reduce(self, grads: list, variables: list) -> list:
        """The gradients reduced across ranks, except those of local variables, which are
        only divided by the number of ranks (Horovod's ``scale_local_gradients``); run on the
        host, eagerly, every step (inside the compiled step's hand-off on TensorFlow and JAX).
        """
        if self.process_set.size() == 1:
            return grads
        if not self.local_vars:
            return self.reducer.reduce(grads, variables)
        shared = [i for i, v in enumerate(variables) if id(v) not in self.local_vars]
        # The ranks train the average of their losses; a local variable is in one rank's loss
        # only, so its gradient of the average is its own divided by the number of ranks
        # (Horovod divides so whatever the op).
        size = self.process_set.size() if self.scale_local_gradients else 1
        out = [g if g is None or size == 1 else g / size for g in grads]
        reduced = self.reducer.reduce([grads[i] for i in shared], [variables[i] for i in shared])
        for i, g in zip(shared, reduced):
            out[i] = g
        return out

    def _accumulate(self, grads: list) -> None:
        if not self.accumulated:
            self.accumulated = [None] * len(grads)
        if len(grads) != len(self.accumulated):
            raise ValueError(f"got {len(grads)} gradients, but the accumulated passes had "
                             f"{len(self.accumulated)}: the variables must stay the same")
        for i, g in enumerate(grads):
            if g is None:
                continue
            g = g if isinstance(g, torch.Tensor) else torch.as_tensor(g)
            acc = self.accumulated[i]
            self.accumulated[i] = g.detach().clone() if acc is None else acc.add_(g)


def _distributed_class(base: type[Any]) -> type[Any]:
    """The subclass of ``base`` whose ``apply`` reduces gradients (one per base class)."""
    cls = _CLASSES.get(base)
    if cls is not None:
        return cls

    class Distributed(base):
        def apply(self, grads, trainable_variables=None):
            state = self.__dict__.get(_STATE)
            if state is None:  # made by deserialisation, not by DistributedOptimizer
                return super().apply(grads, trainable_variables)
            return state.apply(self, grads, trainable_variables, super().apply)

        @property
        def variables(self) -> _CallableList:
            return _CallableList(super().variables)

        def register_local_var(self, var: Any) -> None:
            """Keep ``var`` rank-local: its gradient is not reduced across ranks (divided by
            their number instead, with ``scale_local_gradients``), as in Horovod."""
            state = self.__dict__.get(_STATE)
            if state is None:
                raise ValueError("register_local_var needs an optimizer made by "
                                 "DistributedOptimizer")
            state.local_vars.add(id(var))

    # Keras records the class by module and name: these make a saved model load without
    # ringtrain, with the user's optimizer class.
    Distributed.__name__ = base.__name__
    Distributed.__qualname__ = base.__qualname__
    Distributed.__module__ = base.__module__
    _CLASSES[base] = Distributed
    return Distributed


def is_distributed(optimizer: Any) -> bool:
    """Whether ``optimizer`` was made by :func:`DistributedOptimizer`."""
    return getattr(optimizer, _STATE, None) is not None


def DistributedOptimizer(optimizer: Any, name: str | None = None, device_dense: str = "",
                         device_sparse: str = "", compression: Any = Compression.none,
                         sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                         op: ReduceOp = ReduceOp.AVERAGE, backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: int | list | None = None,
                         process_set: ProcessSet = global_process_set,
                         scale_local_gradients: bool = True) -> Any:
    """Wrap a Keras optimizer so that it applies gradients averaged over all ranks.

    Returns a new optimizer of a subclass of ``optimizer``'s class, made from its config (as
    Horovod does), with its state (slots, iterations) copied if it is already built.

    Args:
        name: prefix of the names of the gradient allreduces (default
            ``Distributed<Class>``); ranks must agree on it.
        device_dense, device_sparse, sparse_as_dense: accepted for Horovod's signature.
        gradient_predivide_factor: with ``Average``, divide gradients by this before the sum
            and by ``size / factor`` after.
        backward_passes_per_step: gradients of this many ``apply`` calls are summed locally,
            then reduced and applied once; the calls in between only count an iteration
            (on TensorFlow and JAX the compiled step computes an update on every call and keeps
            it on the reducing one: a copy of the variables and slots while it runs).
        num_groups: deprecated form of ``groups=N`` (as in Horovod).
        groups: ``N`` to reduce the variables in ``N`` groups, or a list of lists of
            variables, each list reduced as one unit; other variables go in buckets.
        scale_local_gradients: divide the gradients of the variables given to
            ``register_local_var`` (never reduced) by the number of ranks, as Horovod does.

    Raises:
        TypeError: ``optimizer`` is not a Keras optimizer.
        ValueError: ``optimizer`` is already distributed, ``op`` is
            neither Average nor Sum, or another argument is out of range.
    """
    keras = import_keras()
    runtime.current()  # hvd.init() first
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a keras.optimizers.Optimizer, got "
                         f"{type(optimizer).__name__}; for torch.optim use "
                         "ringtrain.torch.DistributedOptimizer")
    if is_distributed(optimizer):
        raise ValueError("this optimizer is already a DistributedOptimizer; wrap the plain "
                         "optimizer once")
    groups = _checked_groups(op, gradient_predivide_factor, backward_passes_per_step,
                             num_groups, groups)
    handoff = handoffs.current()
    cls = _distributed_class(type(optimizer))
    wrapped = cls.from_config(optimizer.get_config())
    if optimizer.built:
        _copy_state(optimizer, wrapped, keras)
    prefix = name or f"Distributed{type(optimizer).__name__}"
    reducer = GradientReducer(prefix, compression, op, gradient_predivide_factor, groups,
                              process_set, handoff)
    setattr(wrapped, _STATE, _DistributedState(reducer, handoff, backward_passes_per_step,
                                               average_aggregated_gradients, process_set,
                                               scale_local_gradients))
    return wrapped


def _checked_groups(op: ReduceOp, gradient_predivide_factor: float, passes: int,
                    num_groups: int, groups: int | list | None) -> int | list | None:
    """``groups`` (or the deprecated ``num_groups``); raises :func:`DistributedOptimizer`'s
    ``ValueError`` for an argument out of range."""
    if op not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        raise ValueError(f"op currently only supports Average and Sum (as in Horovod's Keras "
                         f"DistributedOptimizer), got {op!r}")
    if gradient_predivide_factor != 1.0 and op is not ReduceOp.AVERAGE:
        raise ValueError("gradient_predivide_factor only applies to op=Average")
    if gradient_predivide_factor <= 0:
        raise ValueError(f"gradient_predivide_factor must be positive, got "
                         f"{gradient_predivide_factor}")
    if passes < 1:
        raise ValueError(f"backward_passes_per_step must be at least 1, got {passes}")
    if num_groups:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be "
                      "removed in v0.23.0.", DeprecationWarning, stacklevel=3)
        if groups is None:
            groups = num_groups
    if groups is not None and not (isinstance(groups, list)
                                   or (isinstance(groups, int) and groups > 0)):
        raise ValueError("groups should be a non-negative integer or a list of list of "
                         "keras variables.")
    return groups


def _copy_state(source: Any, target: Any, keras: Any) -> None:
    """Build ``target`` on ``source``'s variables and give it ``source``'s slot values."""
    with keras.name_scope(target.name, caller=target):
        target.build(source._trainable_variables)
    target.built = True
    if len(target.variables) != len(source.variables):
        raise ValueError(f"the wrapped optimizer has {len(target.variables)} variables where "
                         f"{type(source).__name__} has {len(source.variables)}: its get_config() "
                         "does not rebuild it")
    for dst, src in zip(target.variables, source.variables):
        dst.assign(src)
