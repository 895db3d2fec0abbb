"""Tensor fusion: pack small allreduces of the same kind into one collective.

Planning is pure: ready allreduce responses are grouped by everything that must be identical for
one collective, in response order, into batches of at most the fusion threshold. A large tensor
is reduced alone, in place, unless the backend reduces a batch's tensors where they lie
(docs/engine.md, "Execution").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

import torch

from ringtrain.engine.negotiation import Response

#: Tensors at least this large skip the fusion buffer (copying costs more than a collective).
DIRECT_BYTES = 4 * 1024 * 1024

_ITEMSIZE: dict[str, int] = {}
T = TypeVar("T")


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
            m.postscale)


def plan(responses: Iterable[Response], threshold_bytes: int,
         in_place: Callable[[Response], bool] = lambda _: False) -> list[list[Response]]:
    """Group allreduce responses into batches, each one collective.

    A response's tensors always travel together (grouped allreduce is one unit). A large one
    goes alone unless ``in_place(response)``: its batch needs no fusion buffer.
    """
    direct = min(DIRECT_BYTES, threshold_bytes)
    return pack(responses, fusion_key, nbytes, threshold_bytes,
                alone=lambda r, n: n >= direct and len(r.meta.tensors) == 1 and not in_place(r))


def pack(items: Iterable[T], kind: Callable[[T], Hashable], size: Callable[[T], int], cap: int,
         alone: Callable[[T, int], bool] = lambda _, __: False) -> list[list[T]]:
    """Batch items in order: each joins the open batch of its kind while that stays within
    ``cap`` bytes, else opens a new one; items for which ``alone(item, its size)`` holds get a
    batch each."""
    batches: list[list[T]] = []
    open_batch: dict[Hashable, tuple[list[T], int]] = {}
    for item in items:
        n = size(item)
        if alone(item, n):
            batches.append([item])
            continue
        key = kind(item)
        current = open_batch.get(key)
        if current is not None and current[1] + n <= cap:
            current[0].append(item)
            open_batch[key] = (current[0], current[1] + n)
            continue
        batch = [item]
        batches.append(batch)
        open_batch[key] = (batch, n)
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
