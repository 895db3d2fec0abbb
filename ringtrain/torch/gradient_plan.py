"""What a ``DistributedOptimizer`` reduces each step, and when in backward each part is ready.

For ``ringtrain doctor --forecast``: the gradient buckets a larger world would reduce and how long
before the end of backward each becomes ready (the time its reduction could hide behind
backward), timed by a hook on every parameter and a step pre-hook, and written as
``gradients.rank<N>.json`` (one :class:`GradientPlan`) at exit. On CUDA the times are host times
of autograd's bookkeeping, ahead of the device: approximate.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ringtrain.torch.grad_bucket import Bucket

FILE_PATTERN = "gradients.rank{rank}.json"


@dataclass(frozen=True)
class GradientPlan:
    """The buckets of one rank (each with the median time it was ready before the end of
    backward), earliest ready first, the training device's type, and the steps timed."""

    device: str
    buckets: list[Bucket]
    steps: int

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> GradientPlan:
        """Raises:
            ValueError: not a gradient plan.
        """
        try:
            data = json.loads(text)
            return GradientPlan(data["device"], [Bucket(**b) for b in data["buckets"]],
                                int(data["steps"]))
        except (KeyError, TypeError, json.JSONDecodeError) as e:
            raise ValueError(f"not a gradient plan: {e}") from e


class GradientRecorder:
    """Times a ``DistributedOptimizer``'s buckets (its ``_units``) for :meth:`write` to ``path``;
    ``clock``: seconds (tests move one by hand)."""

    def __init__(self, optimizer: torch.optim.Optimizer, path: Path,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.path = path
        self._clock = clock
        # _units: the mixin's, on a class made at run time that mypy cannot see
        self._buckets = [bucket for unit in optimizer._units  # type: ignore[attr-defined]
                         for bucket in unit]
        params = [p for b in self._buckets for p in b.params]
        self._device = params[0].device.type if params else "cpu"
        self._bucket_of = {p: i for i, b in enumerate(self._buckets) for p in b.params}
        self._arrived: dict[int, float] = {}
        self._offsets: list[list[float]] = [[] for _ in self._buckets]
        self._steps = 0  # steps timed
        self._warm = False
        self._handles = [p.register_post_accumulate_grad_hook(self._arrive) for p in params]
        self._handles.append(optimizer.register_step_pre_hook(self._end_backward))

    def _arrive(self, p: torch.nn.Parameter) -> None:
        self._arrived[self._bucket_of[p]] = self._clock()

    def _end_backward(self, *_) -> None:
        now = self._clock()
        if not self._arrived:
            # The step's second pre-hook call (the wrapper's class and the user's class both
            # run them), or a step without backward.
            return
        # The first step pays for allocations and autograd's warm-up: left out.
        if self._warm and len(self._arrived) == len(self._buckets):
            for i, arrived in self._arrived.items():
                self._offsets[i].append((now - arrived) * 1e3)
            self._steps += 1
        self._warm = True
        self._arrived.clear()

    def plan(self) -> GradientPlan:
        """The buckets timed so far (offset 0 for any never timed), earliest ready first."""
        timings = [b.describe(statistics.median(o) if o else 0.0)
                   for b, o in zip(self._buckets, self._offsets)]
        timings.sort(key=lambda t: -t.ready_before_end_ms)
        return GradientPlan(self._device, timings, self._steps)

    def write(self) -> None:
        """Write :meth:`plan` to ``path``."""
        self.path.write_text(self.plan().to_json() + "\n", encoding="utf-8")


def read_plan(folder: Path, rank: int = 0) -> GradientPlan | None:
    """The plan rank ``rank`` wrote into ``folder`` (``None``: none there).

    Raises:
        ValueError: the file is not a gradient plan.
    """
    path = folder / FILE_PATTERN.format(rank=rank)
    return GradientPlan.from_json(path.read_text(encoding="utf-8")) if path.exists() else None
