"""Adasum: the adaptive summation rule of Maleki et al. (2020), as Horovod applies it.

Two gradients are combined as ``(1 - a·b / 2|a|²) a + (1 - a·b / 2|b|²) b``: orthogonal
gradients add, parallel ones average. Ranks' tensors are combined pairwise in a binary tree in
rank order, which is the reduction order of Horovod's recursive doubling; every rank computes the
same tree from the gathered tensors so all hold an identical result.
"""

from __future__ import annotations

import torch


def combine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The Adasum of two tensors (accumulated in float64 for the dot products)."""
    a64, b64 = a.double().reshape(-1), b.double().reshape(-1)
    dot = torch.dot(a64, b64)
    na, nb = torch.dot(a64, a64), torch.dot(b64, b64)
    ca = 1.0 - dot / (2 * na) if na > 0 else torch.tensor(1.0, dtype=torch.float64)
    cb = 1.0 - dot / (2 * nb) if nb > 0 else torch.tensor(1.0, dtype=torch.float64)
    return (ca * a64 + cb * b64).reshape(a.shape).to(a.dtype)


def reduce(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Adasum over a list of tensors (one per rank, in rank order) by a pairwise tree."""
    level = list(tensors)
    while len(level) > 1:
        paired = [combine(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            paired.append(level[-1])
        level = paired
    return level[0]
