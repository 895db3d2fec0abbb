"""Gradient buckets: the flat tensors ``DistributedOptimizer`` reduces, filled during backward.

One model of a bucket serves training and the scaling forecast: :func:`plan_buckets` cuts
parameters into buckets (the torch and Keras optimizers' plan), a :class:`GradBucket` holds one
bucket's gradients while training, and :class:`Bucket` describes it as
:mod:`ringtrain.torch.gradient_plan` records it. Gradients are copied in and out of the flat
tensor by the training thread, as DDP does, so the engine's thread moves no gradient bytes
(docs/engine.md, "Which thread does the tensor work").
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

from ringtrain.engine import fusion
from ringtrain.engine.timeline import Timeline

#: What a bucket holds gradients of: the torch optimizer's parameters, keras variable values.
P = TypeVar("P", bound=torch.Tensor)


@dataclass(frozen=True)
class Bucket:
    """One bucket: its name, its gradient bytes, reduced as one message, and the (median)
    milliseconds between its last gradient's arrival and the end of backward (0: at its end)."""

    name: str
    nbytes: int
    ready_before_end_ms: float = 0.0


def plan_buckets(params: list[P], bucket_bytes: int) -> list[list[P]]:
    """Split parameters into the buckets whose gradients are submitted together.

    Autograd produces gradients roughly in reverse registration order, so buckets are cut from
    the end, one per dtype and device at a time, each of at most ``bucket_bytes`` unless one
    parameter alone is larger. Every rank computes the same buckets from the same parameter
    order. No small first bucket, as DDP has: on CPUs it gained nothing (benchmarks/ARCHIVE.md,
    "Tried and dropped").
    """
    return fusion.pack(reversed(params), lambda p: (p.dtype, p.device),
                       lambda p: p.numel() * p.element_size(), bucket_bytes)


def by_kind(params: list[P]) -> list[list[P]]:
    """``params`` split by dtype and device (one flat tensor each), in order."""
    kinds: dict = {}
    for p in params:
        kinds.setdefault((p.dtype, p.device), []).append(p)
    return list(kinds.values())


class GradBucket(Generic[P]):
    """Parameters of one dtype and device whose gradients travel as one flat tensor."""

    def __init__(self, name: str, params: list[P], names: dict):
        self.name = name
        self.params = params
        self._names = names
        self._flat: torch.Tensor | None = None  # allocated on first use, like DDP's buckets
        self._slots: dict[P, torch.Tensor] = {}

    @property
    def nbytes(self) -> int:
        """Gradient bytes of the bucket."""
        return sum(p.numel() * p.element_size() for p in self.params)

    def describe(self, ready_before_end_ms: float = 0.0) -> Bucket:
        """This bucket as the forecast sees it."""
        return Bucket(self.name, self.nbytes, ready_before_end_ms)

    def _slot(self, p: P) -> torch.Tensor:
        self.flat()
        return self._slots[p]

    def put(self, p: P, grad: torch.Tensor | None, scale: float,
            timeline: Timeline) -> None:
        """Copy ``p``'s gradient (zeros for None) into its slot, multiplied by ``scale``."""
        start = time.monotonic()
        slot = self._slot(p)
        if grad is None:  # unused on this rank this step; peers may have used it
            slot.zero_()
        elif scale == 1.0:
            slot.copy_(grad)
        else:
            torch.mul(grad, scale, out=slot)
        if timeline.active:
            timeline.span(self._names[p], "MEMCPY_IN_FUSION_BUFFER", start, time.monotonic(),
                          bucket=self.name)

    def flat(self) -> torch.Tensor:
        """The flat tensor every slot lives in."""
        if self._flat is None:
            first = self.params[0]
            self._flat = torch.empty(sum(q.numel() for q in self.params), dtype=first.dtype,
                                     device=first.device)
            offset = 0
            for q in self.params:
                self._slots[q] = self._flat[offset:offset + q.numel()].view(q.shape)
                offset += q.numel()
        return self._flat

    def views(self, reduced: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's part of a reduced flat tensor, shaped as the parameter (views)."""
        out, offset = [], 0
        for p in self.params:
            out.append(reduced[offset:offset + p.numel()].view(p.shape))
            offset += p.numel()
        return out

    def take(self, reduced: torch.Tensor, timeline: Timeline, scale: float = 1.0) -> None:
        """Copy the reduced flat tensor back into every parameter's gradient, multiplied by
        ``scale`` on the way (an average's division costs no pass of its own)."""
        start = time.monotonic()
        for p, values in zip(self.params, self.views(reduced)):
            if p.grad is not None and p.grad.is_sparse:
                continue  # found sparse this step: reduced on its own (sparse_grads)
            if p.grad is None:
                p.grad = (values.clone(memory_format=torch.preserve_format) if scale == 1.0
                          else values * scale)
            elif scale == 1.0:
                p.grad.copy_(values)
            else:
                torch.mul(values, scale, out=p.grad)
        if timeline.active:
            end = time.monotonic()
            for p in self.params:
                timeline.span(self._names[p], "MEMCPY_OUT_FUSION_BUFFER", start, end,
                              bucket=self.name)
