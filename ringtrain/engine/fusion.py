"""Tensor fusion: pack small allreduces of the same kind into one collective.

Planning is pure: ready allreduce responses are grouped by everything that must be identical for
one collective (dtype, device, process set, reduction, scale factors, joined ranks), in response
order, into batches of at most the fusion threshold. A large tensor is reduced on its own, in
place: copying it into a buffer and back costs more memory traffic than the extra collective.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from ringtrain.engine.negotiation import Response

#: Tensors at least this large skip the fusion buffer (see module docstring).
DIRECT_BYTES = 4 * 1024 * 1024

_ITEMSIZE: dict[str, int] = {}


def nbytes(response: Response) -> int:
    """Bytes of all the tensors of one response."""
    total = 0
    for t in response.meta.tensors:
        size = _ITEMSIZE.get(t.dtype)
        if size is None:
            size = _ITEMSIZE[t.dtype] = getattr(torch, t.dtype.removeprefix("torch.")).itemsize
        total += math.prod(t.shape) * size
    return total


def fusion_key(response: Response) -> tuple:
    m = response.meta
    return (m.tensors[0].dtype, m.tensors[0].device, m.set_ranks, m.reduce_op, m.prescale,
            m.postscale, response.joined)


def plan(responses: Iterable[Response], threshold_bytes: int) -> list[list[Response]]:
    """Group allreduce responses into batches, each one collective.

    A response's tensors always travel together (grouped allreduce is one unit).
    """
    batches: list[list[Response]] = []
    open_batch: dict[tuple, tuple[list[Response], int]] = {}
    for response in responses:
        size = nbytes(response)
        if size >= min(DIRECT_BYTES, threshold_bytes) and len(response.meta.tensors) == 1:
            batches.append([response])
            continue
        key = fusion_key(response)
        current = open_batch.get(key)
        if current is not None and current[1] + size <= threshold_bytes:
            current[0].append(response)
            open_batch[key] = (current[0], current[1] + size)
            continue
        batch = [response]
        batches.append(batch)
        open_batch[key] = (batch, size)
    return batches


class FusionBuffers:
    """Reusable flat buffers per (dtype, device); several may be in flight at once."""

    def __init__(self) -> None:
        self._free: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}

    def acquire(self, dtype: torch.dtype, device: torch.device, numel: int) -> torch.Tensor:
        """A buffer of at least ``numel`` elements (the view returned has exactly that many)."""
        free = self._free.setdefault((dtype, device), [])
        for i, buf in enumerate(free):
            if buf.numel() >= numel:
                return free.pop(i)[:numel]
        return torch.empty(numel, dtype=dtype, device=device)

    def release(self, view: torch.Tensor) -> None:
        base = view._base if view._base is not None else view
        self._free.setdefault((view.dtype, view.device), []).append(base)
