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

    # Members are singletons: identity is their equality, and hashing by it runs no Python
    # (Enum's own hashes the name, a Python call per dict lookup of every operation's keys).
    __hash__ = object.__hash__


class ReduceOp(enum.Enum):
    """Reductions, with Horovod's names."""

    AVERAGE = "Average"
    SUM = "Sum"
    MIN = "Min"
    MAX = "Max"
    PRODUCT = "Product"
    ADASUM = "Adasum"

    __hash__ = object.__hash__  # as OpType's

    def __repr__(self) -> str:
        return self.value
