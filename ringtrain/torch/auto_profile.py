"""Step profiling of an unchanged training script, switched on from its environment.

``ringtrain doctor`` runs the script with ``RINGTRAIN_STEP_PROFILE=1`` (the first
``DistributedOptimizer`` gets a :class:`StepProfiler`; each ``optimizer.step()`` ends a step),
``RINGTRAIN_SYNTHETIC_DATA=1`` (each data loader yields its first batch again instead of loading
more) and ``RINGTRAIN_STEP_PROFILE_STEPS=N`` (exit 0 after ``N`` steps, on every rank at the
same step). The phases and the contract: docs/data.md. Batches that do not come from a torch
``DataLoader`` are seen when the script iterates them through :func:`profiled_batches`.
"""

from __future__ import annotations

import atexit
import os
import types
from collections.abc import Iterable, Iterator, Mapping, Sized
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch.utils.data import dataloader

from ringtrain.torch.gradient_plan import FILE_PATTERN, GradientRecorder
from ringtrain.torch.step_profiler import StepProfiler

PROFILE_VAR = "RINGTRAIN_STEP_PROFILE"
SYNTHETIC_VAR = "RINGTRAIN_SYNTHETIC_DATA"
STEPS_VAR = "RINGTRAIN_STEP_PROFILE_STEPS"

_T = TypeVar("_T")


@dataclass(frozen=True)
class ProfileRequest:
    """What the environment asks for: profiling, synthetic data, a step limit (``None``: none)."""

    synthetic: bool = False
    steps: int | None = None

    @staticmethod
    def from_environ(environ: Mapping[str, str] | None = None) -> ProfileRequest | None:
        """The request in ``environ`` (default ``os.environ``); ``None`` when profiling is off.

        Raises:
            ValueError: ``RINGTRAIN_STEP_PROFILE_STEPS`` is not a positive whole number.
        """
        environ = os.environ if environ is None else environ
        if environ.get(PROFILE_VAR, "0") in ("", "0"):
            return None
        steps = environ.get(STEPS_VAR)
        if steps is not None and (not steps.isdigit() or int(steps) < 1):
            raise ValueError(f"{STEPS_VAR} must be a positive whole number, got {steps!r}")
        return ProfileRequest(environ.get(SYNTHETIC_VAR, "0") not in ("", "0"),
                              int(steps) if steps else None)


class AutoProfile:
    """A step profiler driven by an optimizer's ``step()`` (one with ``synchronize``, as a
    ``DistributedOptimizer``) and the data loaders' waits."""

    def __init__(self, optimizer: torch.optim.Optimizer, request: ProfileRequest,
                 profiler: StepProfiler) -> None:
        self.request = request
        self.profiler = profiler
        self._optimizer = optimizer
        # Any: the instance's step and synchronize are replaced below
        patched: Any = optimizer
        self._step = optimizer.step
        self._synchronize = patched.synchronize
        self._compute_from: Any = None  # where this step's forward_backward began
        self._compute_done = False
        self._in_step = False
        self._steps = 0
        # No batch from a loader yet this step: the first module call's input tells the samples.
        self._samples_pending = True
        self._first_batches: dict[int, tuple[object, object]] = {}  # id(source): (source, batch)
        # Bound to the optimizer, not to this object: wrappers that re-bind ``step.__func__``
        # to the optimizer (torch's LR schedulers do) must still reach this profile.
        profile = self

        def step(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
            return profile.step(*args, **kwargs)

        def synchronize(opt: torch.optim.Optimizer) -> None:
            profile.synchronize()

        patched.step = types.MethodType(step, optimizer)
        patched.synchronize = types.MethodType(synchronize, optimizer)

    def batches(self, source: object, next_batch, remaining: int | None) -> Any:
        """The next batch of ``source`` fetched by ``next_batch()``, timed as ``data``; with
        synthetic data, ``source``'s first batch again (``remaining``: batches it has left
        in this pass, ``None``: unknown).

        Raises:
            StopIteration: ``source`` has no batch left.
        """
        with self.profiler.phase("data"):
            if self.request.synthetic and id(source) in self._first_batches:
                if remaining is not None and remaining <= 0:
                    raise StopIteration
                batch = self._first_batches[id(source)][1]
            else:
                batch = next_batch()
                if self.request.synthetic:
                    self._first_batches[id(source)] = (source, batch)
        self.profiler.note(samples=_batch_size(batch), synthetic=self.request.synthetic)
        self._samples_pending = False
        self._compute_from = self.profiler.mark()
        return batch

    def forward_input(self, args: tuple) -> None:
        """A module is called with ``args``: the first call of a step whose batch came from
        no loader counts the step's samples (its input's first dimension), so that a script
        making its batches inline is still measured in samples per second."""
        if self._samples_pending:
            self._samples_pending = False
            n = _batch_size(list(args))
            if n is not None:
                self.profiler.note(samples=n)

    def _end_compute(self) -> None:
        if self._compute_done:
            return
        now = self.profiler.mark()
        start = now if self._compute_from is None else self._compute_from
        self.profiler.add_span("forward_backward", start, now)
        self._compute_done = True

    def synchronize(self) -> None:
        """The optimizer's ``synchronize()``, timed as ``communication``."""
        if self._in_step:  # called by step() itself, which times it
            self._synchronize()
            return
        self._end_compute()
        with self.profiler.phase("communication"):
            self._synchronize()

    def step(self, closure=None):
        """The optimizer's ``step()``: its wait for gradients is ``communication``, the update
        ``optimizer``; the step ends here. After the requested steps the process exits."""
        self._end_compute()
        optimizer = self._optimizer
        self._in_step = True
        try:
            if (getattr(optimizer, "_should_synchronize", False)
                    and not getattr(optimizer, "_synchronized", True)):
                with self.profiler.phase("communication"):
                    self._synchronize()
                with self.profiler.phase("optimizer"), optimizer.skip_synchronize():
                    result = self._step(closure)
            else:
                with self.profiler.phase("optimizer"):
                    result = self._step(closure)
        finally:
            self._in_step = False
        self.profiler.begin_step()
        # Until a batch is waited for, the step's work is the script's own (made its batch
        # itself, or the forward pass began): forward_backward from here.
        self._compute_from, self._compute_done = self.profiler.mark(), False
        self._samples_pending = True
        self._steps += 1
        if self.request.steps is not None and self._steps >= self.request.steps:
            self.close()
            raise SystemExit(0)  # every rank reaches the same step: they all stop here
        return result

    def close(self) -> None:
        """Stop profiling: write the last finished steps and close the metrics file."""
        self.profiler.close(finish_current=False)


_active: AutoProfile | None = None


def attach_from_environ(optimizer: torch.optim.Optimizer) -> AutoProfile | None:
    """Profile ``optimizer``'s steps if the environment asks for it, unless another optimizer
    is profiled already; the profile, or ``None`` when none was attached."""
    global _active
    request = ProfileRequest.from_environ()
    if request is None or _active is not None:
        return None
    params = [p for group in optimizer.param_groups for p in group["params"]]
    device = params[0].device if params else torch.device("cpu")
    _active = AutoProfile(optimizer, request, StepProfiler(device))
    _patch_data_loaders()
    torch.nn.modules.module.register_module_forward_pre_hook(_forward_pre_hook)
    atexit.register(_active.close)
    _record_gradients(optimizer, _active.profiler)
    return _active


def _record_gradients(optimizer: torch.optim.Optimizer, profiler: StepProfiler) -> None:
    """For ``ringtrain doctor --forecast``: the buckets and when backward makes each ready,
    written beside the step records at exit (see :mod:`ringtrain.torch.gradient_plan`)."""
    if profiler.metrics_path is None or not hasattr(optimizer, "_units"):
        return  # no folder, or an optimizer without buckets (Adasum)
    recorder = GradientRecorder(optimizer, profiler.metrics_path.with_name(
        FILE_PATTERN.format(rank=profiler.rank)))
    atexit.register(recorder.write)


def profiled_batches(batches: Iterable[_T]) -> Iterator[_T]:
    """Iterate ``batches``; under ``ringtrain doctor`` each wait is timed as ``data`` and, for
    the synthetic-data comparison, the first batch comes again instead of new ones. Without
    profiling, this is ``iter(batches)``."""
    if _active is None:
        yield from batches
        return
    iterator = iter(batches)
    remaining = len(batches) if isinstance(batches, Sized) else None
    while True:
        try:
            batch = _active.batches(batches, lambda: next(iterator), remaining)
        except StopIteration:
            return
        if remaining is not None:
            remaining -= 1
        yield batch


def _forward_pre_hook(_module: torch.nn.Module, args: tuple) -> None:
    if _active is not None:
        _active.forward_input(args)


_original_next = dataloader._BaseDataLoaderIter.__next__


def _patch_data_loaders() -> None:
    """Time every torch ``DataLoader`` iterator's ``next()`` (profiling stays on for the life of
    the process, so this is never undone)."""

    def profiled_next(self: dataloader._BaseDataLoaderIter) -> Any:
        if _active is None:
            return _original_next(self)
        try:
            remaining = len(self) - self._num_yielded
        except TypeError:  # an IterableDataset without a length
            remaining = None
        fetched = []

        def fetch() -> Any:
            fetched.append(True)
            return _original_next(self)

        batch = _active.batches(self._dataset, fetch, remaining)
        if not fetched:  # the synthetic batch again: count it as the loader would
            self._num_yielded += 1
        _active.profiler.note(loader_workers=self._num_workers)
        return batch

    # a deliberate patch of torch's class, which mypy flags as assigning to a method
    dataloader._BaseDataLoaderIter.__next__ = profiled_next  # type: ignore[method-assign]


def _batch_size(batch: object) -> int | None:
    """The first dimension of the batch's first tensor (``None``: no tensor found)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else None
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            n = _batch_size(item)
            if n is not None:
                return n
    return None
