"""``DistributedOptimizer``: averages gradients across ranks while backward is still running.

A hook on every parameter copies its gradient into its bucket (:mod:`ringtrain.torch.grad_bucket`)
as soon as autograd has accumulated it; a bucket whose last gradient has arrived is submitted as
one in-place allreduce counted as a unit (docs/engine.md). ``step()`` waits for the buckets,
copies the averaged gradients back, then runs the user's optimizer. The returned object is an
instance of the user's optimizer class sharing its state, so ``isinstance`` checks, schedulers
and ``state_dict`` keep working.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from contextlib import contextmanager
from typing import Any

import torch

from ringtrain.engine.handle import Handle
from ringtrain.op_types import ReduceOp
from ringtrain.torch import auto_profile, ops, runtime
from ringtrain.torch.autotune import Autotuner
from ringtrain.torch.compression import Compression
from ringtrain.torch.grad_bucket import GradBucket, by_kind, plan_buckets
from ringtrain.torch.process_sets import ProcessSet, global_process_set
from ringtrain.torch.sparse_grads import SparseGradients

_STEP_WITHOUT_SKIP = ("optimizer.step() called without optimizer.skip_synchronize() context "
                      "after optimizer.synchronize(). This can cause training slowdown. You may "
                      "want to consider using optimizer.skip_synchronize() context if you use "
                      "optimizer.synchronize() in your code.")


class _DistributedOptimizer:
    """Mixed into a subclass of the user's optimizer class; see :func:`DistributedOptimizer`."""

    def _setup(self, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, groups, sparse_as_dense, process_set):
        self._compression = compression
        self._op = op
        # Average divides by the predivide factor before the sum (folded into the copy into the
        # bucket) and by size / factor after it.
        self._prescale = 1.0 / gradient_predivide_factor if op is ReduceOp.AVERAGE else 1.0
        self._postscale = gradient_predivide_factor if op is ReduceOp.AVERAGE else 1.0
        self._process_set = process_set
        self._names = _parameter_names(self.param_groups, named_parameters)
        self._parameter_names = _horovod_parameter_names(self.param_groups, named_parameters)
        # None: sparse gradients go through the buckets as dense ones
        self._sparse = (None if sparse_as_dense
                        else SparseGradients(self._names, op, process_set))
        # sparse_as_dense: parameters whose sparse gradient travels dense this step, with its
        # number of sparse dimensions, to be made sparse again for the optimizer (Horovod does:
        # SparseAdam refuses dense gradients)
        self._densified: dict[torch.nn.Parameter, int] = {}
        self._groups = _parameter_groups(self.param_groups, groups)
        self._bucket_bytes = runtime.current().env.knobs.bucket_bytes
        self._plan_units()
        self._put: set[torch.nn.Parameter] = set()  # gradients in their buckets this step
        self._unit_counts: dict[int, int] = {}
        # per unit: each bucket, its handle, its compression context, and the factor its
        # reduced values are multiplied by on the way back (see _wire)
        self._inflight: dict[int, list[tuple[GradBucket, Handle, object, float]]] = {}
        self._synchronized = False
        self._should_synchronize = True
        self.backward_passes_per_step = backward_passes_per_step
        self._delay = {p: backward_passes_per_step for p in self._names}
        self._hook_handles = []
        self._autotuner: Autotuner | None = None
        self._world: runtime.Runtime | None = None
        self._follow_world()

    def _follow_world(self) -> None:
        """Adapt to the world this process is in now, if it changed since the last call.

        An elastic reset keeps the optimizer but replaces the world, maybe with another size: a
        step begun in the old one belongs to an engine that is gone. Every rank of the new
        world, survivor or newcomer, starts it from an empty step, so their counts agree.
        """
        world = runtime.current() if runtime.is_initialized() else None
        if world is self._world:
            return
        if self._world is not None:  # the world of the last call is gone
            self._forget_step(wait=False)  # its engine failed whatever was in flight
            self._synchronized = False
            if self._autotuner is not None:
                self._autotuner.close()
                self._autotuner = None
        self._world = world
        if world is None:
            return
        # At size 1 the local gradient is the average: nothing is copied or submitted.
        self._reduces = self._process_set.size() > 1
        # As Horovod: hooks in a world of several ranks and in any elastic one, which may grow
        # (they count passes at size 1). Hooks stay once registered: at size 1 they only count.
        if not self._hook_handles and (self._reduces or runtime.is_elastic()):
            for p in self._names:
                if p.requires_grad:
                    self._hook_handles.append(p.register_post_accumulate_grad_hook(self._hook))
        # --autotune tunes this optimizer's buckets (and the engine's knobs) between steps,
        # counting steps in lockstep with the peers: each world starts a tuning of its own, as
        # Horovod's init() does.
        knobs = world.env.knobs
        if knobs.autotune is not None and self._process_set is global_process_set:
            self._autotuner = Autotuner(self, knobs)

    def _plan_units(self) -> None:
        """Plan the units of gradients submitted together: the user's groups (each one grouped
        allreduce), then DDP-style buckets of the other gradients; sparse gradients are in
        none. A unit is one bucket per dtype and device among its parameters."""
        sparse = set() if self._sparse is None else self._sparse.params
        explicit = [[p for p in group if p not in sparse] for group in self._groups]
        explicit = [group for group in explicit if group]
        grouped = {p for group in explicit for p in group}
        self._units: list[list[GradBucket]] = [
            [GradBucket(f"grouped.{self._names[b[0]]}", b, self._names) for b in by_kind(group)]
            for group in explicit]
        self._units += [[GradBucket(_bucket_name(bucket, self._names), bucket, self._names)]
                        for bucket in plan_buckets([p for p in self._names if p.requires_grad
                                                    and p not in grouped and p not in sparse],
                                                   self._bucket_bytes)]
        self._unit_of = {p: i for i, unit in enumerate(self._units)
                         for bucket in unit for p in bucket.params}
        self._bucket_of = {p: bucket for unit in self._units for bucket in unit
                           for p in bucket.params}
        self._unit_sizes = [sum(len(b.params) for b in unit) for unit in self._units]

    # -- gradient hooks -------------------------------------------------------------------------

    def _hook(self, p: torch.nn.Parameter) -> None:
        # Autograd may run this on a thread of its own (CUDA): that thread is no submitter
        # whose waits say whether the rank is blocked (see engine.deadlock).
        self._follow_world()
        with runtime.current().engine.submitting_for_autograd():
            self._gradient_ready(p)

    def _gradient_ready(self, p: torch.nn.Parameter) -> None:
        if self._delay[p] <= 0:  # already counted since the last synchronize()
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before call "
                "to step(). Increase backward_passes_per_step to accumulate gradients locally.")
        self._delay[p] -= 1
        if self._delay[p] > 0 or not self._reduces:
            return
        if self._sparse is not None and p in self._sparse.params:
            self._sparse.submit(p)
            return
        self._put_grad(p)
        unit = self._unit_of[p]
        self._unit_counts[unit] = self._unit_counts.get(unit, 0) + 1
        if self._unit_counts[unit] == self._unit_sizes[unit]:
            self._submit_unit(unit)

    def _put_grad(self, p: torch.nn.Parameter) -> None:
        grad = p.grad
        if grad is not None and grad.is_sparse:
            if self._sparse is None:
                self._densified[p] = grad.sparse_dim()
                grad = grad.to_dense()
            else:
                self._sparse.found(p)
                grad = None  # its slot carries zeros this step, as on every rank
        self._bucket_of[p].put(p, grad, self._prescale, runtime.current().engine.timeline)
        self._put.add(p)

    def _submit_unit(self, unit: int) -> None:
        """Submit the unit's buckets, gradients not put yet as they are now, as one unit."""
        for bucket in self._units[unit]:
            for p in bucket.params:
                if p not in self._put:
                    self._put_grad(p)
        submitted = []
        op, postscale, factor = self._wire()
        with runtime.current().engine.one_round():
            for bucket in self._units[unit]:
                wire, ctx = self._compression.compress(bucket.flat())
                handle = ops.allreduce_async_(wire, name=bucket.name, op=op,
                                              postscale_factor=postscale,
                                              process_set=self._process_set)
                submitted.append((bucket, handle, ctx, factor))
        self._inflight[unit] = submitted

    def _wire(self) -> tuple[ReduceOp, float, float]:
        """The op and postscale the buckets are reduced with, and the factor applied as the
        reduced values are copied back into the gradients. An average is a sum whose division
        is folded into that copy: the same numbers as Horovod's postscale, without a pass of
        its own over every gradient byte (which costs a step as much as the copy)."""
        if self._op is ReduceOp.AVERAGE:
            return ReduceOp.SUM, 1.0, self._postscale / self._process_set.size()
        return self._op, self._postscale, 1.0

    # -- the public surface ---------------------------------------------------------------------

    def synchronize(self) -> None:
        """Wait until every gradient has been averaged across ranks (and write it back)."""
        self._follow_world()
        if not self._reduces:
            self._forget_step()  # the hooks' pass counts: the next step starts afresh
            self._synchronized = True
            return
        # Every unit, whole: peers may have gradients where this rank has none, and they count
        # the same units.
        for unit in range(len(self._units)):
            if unit not in self._inflight:
                self._submit_unit(unit)
        if self._sparse is not None:
            self._sparse.submit_missing()
        timeline = runtime.current().engine.timeline
        for p in self._densified:
            p.grad = None  # the bucket gives it the dense average, made sparse below
        try:
            for unit in range(len(self._units)):
                for bucket, handle, ctx, factor in self._inflight[unit]:
                    bucket.take(self._compression.decompress(ops.synchronize(handle), ctx),
                                timeline, factor)
            if self._sparse is not None:
                self._sparse.finish()
            for p, sparse_dim in self._densified.items():
                assert p.grad is not None  # its bucket has just given it the dense average
                p.grad = p.grad.to_sparse(sparse_dim)
        finally:
            self._forget_step()
        self._synchronized = True

    def _forget_step(self, wait: bool = True) -> None:
        """Drop this step's bucket state: nothing submitted, nothing put, full delays; plan the
        buckets again if gradients turned out sparse. ``wait=False``: do not wait for sparse
        reductions still in flight (their engine is gone)."""
        if self._sparse is not None and self._sparse.forget_step(wait):
            self._plan_units()
        self._inflight.clear()
        self._unit_counts.clear()
        self._put.clear()
        self._densified.clear()
        for p in self._delay:
            self._delay[p] = self.backward_passes_per_step

    @contextmanager
    def skip_synchronize(self):
        """Let ``step()`` run without synchronizing, after an explicit ``synchronize()``.

        For gradient clipping and AMP: synchronize, unscale/clip, then step inside this block.
        """
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def set_bucket_bytes(self, nbytes: int) -> None:
        """Cut gradients into buckets of about ``nbytes`` from the next step on. Every rank
        must make the same change between the same two steps (autotuning does).

        Raises:
            ValueError: ``nbytes`` is not positive.
            RuntimeError: gradients of this step are in flight (call it after ``step()``).
        """
        if nbytes < 1:
            raise ValueError(f"bucket size must be positive, got {nbytes}")
        self._follow_world()
        if self._inflight or self._put:
            raise RuntimeError("set_bucket_bytes() during a step: call it after step()")
        self._bucket_bytes = nbytes
        self._plan_units()

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes accumulate locally before gradients are reduced."""
        if passes < 1:
            raise ValueError(f"backward_passes_per_step must be at least 1, got {passes}")
        self.backward_passes_per_step = passes
        for p in self._delay:
            self._delay[p] = passes

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(_STEP_WITHOUT_SKIP, stacklevel=2)
            self.synchronize()
        self._synchronized = False
        result = super(self.__class__, self).step(closure)
        if self._autotuner is not None:
            self._autotuner.after_step()
        return result

    def load_state_dict(self, state_dict):
        """Load the state and forget the gradients of a step that did not finish (an elastic
        restore after a failure mid-step), as Horovod's optimizer does."""
        self._follow_world()
        for submitted in self._inflight.values():
            for _, handle, _, _ in submitted:
                try:
                    ops.synchronize(handle)
                except RuntimeError:
                    pass  # the failure that brought us here; nothing of this step is used
        self._forget_step()
        self._synchronized = False
        self._should_synchronize = True
        return super(self.__class__, self).load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool = True):
        self._follow_world()
        if self._inflight:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                "cause a race condition.")
        # The mixin runs as a subclass of the user's optimizer class, which mypy cannot see.
        return super(self.__class__, self).zero_grad(set_to_none=set_to_none)  # type: ignore[misc]


class _DistributedAdasumOptimizer:
    """Applies the Adasum rule to each rank's optimizer update (its parameter delta)."""

    def _setup(self, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, groups, sparse_as_dense, process_set):
        self._compression = compression
        self._process_set = process_set
        self._names = _parameter_names(self.param_groups, named_parameters)
        self._parameter_names = _horovod_parameter_names(self.param_groups, named_parameters)
        self.backward_passes_per_step = backward_passes_per_step

    def synchronize(self) -> None:
        """Adasum reduces updates, not gradients: nothing to wait for before the step."""

    @contextmanager
    def skip_synchronize(self):
        yield

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.backward_passes_per_step = passes

    def step(self, closure=None):
        params = [p for p in self._names if p.grad is not None]
        starts = [p.detach().clone() for p in params]
        loss = super(self.__class__, self).step(closure)
        handles = []
        for p, start in zip(params, starts):
            delta = p.detach() - start
            compressed, ctx = self._compression.compress(delta)
            handles.append((ops.allreduce_async_(compressed, name=f"adasum.{self._names[p]}",
                                                 op=ReduceOp.ADASUM,
                                                 process_set=self._process_set), ctx))
        for p, start, (handle, ctx) in zip(params, starts, handles):
            delta = self._compression.decompress(ops.synchronize(handle), ctx)
            with torch.no_grad():
                p.copy_(start + delta)
        return loss


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None = None,
                         compression=Compression.none, backward_passes_per_step: int = 1,
                         op: ReduceOp = ReduceOp.AVERAGE, gradient_predivide_factor: float = 1.0,
                         num_groups: int = 0, groups=None, sparse_as_dense: bool = False,
                         process_set: ProcessSet = global_process_set) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that ``step()`` uses gradients averaged over all ranks.

    Args:
        optimizer: any ``torch.optim.Optimizer``; the wrapper shares its parameters and state.
        named_parameters: ``model.named_parameters()``: gives each gradient's allreduce a stable
            name. Without it, names are generated from parameter positions.
        backward_passes_per_step: backward passes accumulated locally before each reduction.
        op: ``Average`` (default), ``Sum``, or ``Adasum`` (applied to optimizer updates).
        gradient_predivide_factor: with ``Average``, divide by this before the sum and by
            ``size / factor`` after (for fp16 range).
        num_groups / groups: reduce parameters in this many groups, or in these explicit lists of
            parameters, each group as one grouped allreduce.
        sparse_as_dense: reduce sparse gradients as dense tensors in the buckets (made sparse
            again before the step), as needed with ``join()``, which refuses allgathers;
            otherwise each is reduced on its own (:mod:`ringtrain.torch.sparse_grads`).

    Raises:
        ValueError: duplicate names, parameters missing from ``named_parameters``, bad values.
    """
    runtime.current()
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be at least 1, got "
                         f"{backward_passes_per_step}")
    if op not in (ReduceOp.AVERAGE, ReduceOp.SUM, ReduceOp.ADASUM):
        raise ValueError(f"DistributedOptimizer supports Average, Sum and Adasum, got {op!r}")
    if gradient_predivide_factor != 1.0 and op is not ReduceOp.AVERAGE:
        raise ValueError("gradient_predivide_factor only applies to op=Average")
    if num_groups and groups is not None:
        raise ValueError("pass num_groups or groups, not both")
    if num_groups:
        params = [p for g in optimizer.param_groups for p in g["params"]]
        size = -(-len(params) // num_groups)
        groups = [params[i:i + size] for i in range(0, len(params), size)]
    if named_parameters is not None:
        named_parameters = list(named_parameters)  # read by two tables; may be a generator
    mixin = _DistributedAdasumOptimizer if op is ReduceOp.ADASUM else _DistributedOptimizer
    base = optimizer.__class__
    # Any: a class made here, the user's optimizer class with the mixin's methods
    cls: Any = type(base.__name__, (base,), {k: v for k, v in mixin.__dict__.items()
                                        if k not in ("__dict__", "__weakref__")})
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    # Optimizer.__init__ (skipped, to keep the user's state) is what installs step hooks and
    # profiling around step(): install them for the new class too.
    wrapped._patch_step_function()
    wrapped._setup(named_parameters, compression, backward_passes_per_step, op,
                   gradient_predivide_factor, groups, sparse_as_dense, process_set)
    # Under `ringtrain doctor -- SCRIPT`: the step breakdown of a script that was not changed.
    auto_profile.attach_from_environ(wrapped)
    return wrapped


def _parameter_names(param_groups, named_parameters) -> dict:
    params = [p for g in param_groups for p in g["params"]]
    if named_parameters is None:
        return {p: f"allreduce.noname.{i}" for i, p in enumerate(params)}
    named = list(named_parameters)
    if named and not isinstance(named[0], tuple):
        raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, "
                         "usually model.named_parameters()")
    names = [n for n, _ in named]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"parameter names in named_parameters must be unique; duplicates: "
                         f"{duplicates}")
    by_param = {p: n for n, p in named}
    missing = [i for i, p in enumerate(params) if p not in by_param]
    if missing:
        raise ValueError(f"named_parameters was specified, but {len(missing)} of the "
                         f"optimizer's parameters (positions {missing[:10]}) are not in it; pass "
                         "the named_parameters of the model the optimizer was built for")
    return {p: f"allreduce.{by_param[p]}" for p in params}


def _horovod_parameter_names(param_groups, named_parameters) -> dict:
    """Horovod's ``_parameter_names``: {parameter: name}, generated as
    ``allreduce.noname.<group>.<index>`` without ``named_parameters`` (scripts read it)."""
    if named_parameters is None:
        return {p: f"allreduce.noname.{i}.{j}" for i, group in enumerate(param_groups)
                for j, p in enumerate(group["params"])}
    return {p: name for name, p in named_parameters}


def _bucket_name(params: list, names: dict) -> str:
    """A bucket's name: its parameters' range, the same on every rank."""
    if len(params) == 1:
        return names[params[0]]
    return f"{names[params[0]]}..{names[params[-1]].removeprefix('allreduce.')}"


def _parameter_groups(param_groups, groups) -> list[list]:
    """The user's ``groups`` as lists, each checked to hold only the optimizer's parameters."""
    if groups is None:
        return []
    known = {p for g in param_groups for p in g["params"]}
    out = [list(group) for group in groups]
    if any(p not in known for group in out for p in group):
        raise ValueError("groups contains a tensor that is not one of the optimizer's parameters")
    return out
