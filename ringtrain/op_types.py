"""The plain enums that name a collective and its reduction.

A leaf: it imports nothing, so the torch frontend, the engine and the backends can all name an
operation without importing one another upward (see docs/architecture.md).
"""

from __future__ import annotations

import enum


class OpType(enum.Enum):
    """The collective an operation performs."""

    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    BROADCAST = "broadcast"
    ALLTOALL = "alltoall"
    REDUCESCATTER = "reducescatter"
    BARRIER = "barrier"
    JOIN = "join"


class ReduceOp(enum.Enum):
    """Reductions, with Horovod's names."""

    AVERAGE = "Average"
    SUM = "Sum"
    MIN = "Min"
    MAX = "Max"
    PRODUCT = "Product"
    ADASUM = "Adasum"

    def __repr__(self) -> str:
        return self.value
