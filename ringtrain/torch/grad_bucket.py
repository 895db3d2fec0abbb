"""Gradient buckets: the flat tensors ``DistributedOptimizer`` reduces, filled during backward.

Each gradient is copied into its slot of the bucket's flat tensor by the training thread, in the
hook that autograd fires when the gradient is ready, and copied back out by the thread that
synchronizes, as DDP does. The engine then reduces one contiguous tensor in place: its thread
moves no gradient bytes, and every copy runs with the training thread's intra-op team (see
:mod:`ringtrain.engine.intraop` for why work on another thread is slow on a busy many-core host).
"""

from __future__ import annotations

import time
from typing import Generic, TypeVar

import torch

from ringtrain.engine.timeline import Timeline

#: What a bucket holds gradients of: the torch optimizer's parameters, keras variable values.
P = TypeVar("P", bound=torch.Tensor)


class GradBucket(Generic[P]):
    """Parameters of one dtype and device whose gradients travel as one flat tensor."""

    def __init__(self, name: str, params: list[P], names: dict):
        self.name = name
        self.params = params
        self._names = names
        self._flat: torch.Tensor | None = None  # allocated on first use, like DDP's buckets
        self._slots: dict[P, torch.Tensor] = {}

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
