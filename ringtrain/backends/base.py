"""The collective backend protocol: what the engine needs from a communication library.

Every method is a blocking collective over the members of one process set (their global ranks),
called in the same order on every member. Reductions are the plain ones (Sum, Min, Max,
Product); averaging, scaling and Adasum are the engine's business.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from ringtrain.op_types import ReduceOp


class CollectiveBackend(Protocol):
    """Blocking collectives over process sets, plus the engine's control channel."""

    rank: int
    size: int

    def add_set(self, ranks: tuple[int, ...]) -> None:
        """Create the communicators for a process set (collective over the whole world)."""

    def remove_set(self, ranks: tuple[int, ...]) -> None:
        """Release the communicators of a process set."""

    def control_allreduce(self, counts: torch.Tensor) -> None:
        """Sum a small int32 CPU tensor over the world, in place (negotiation)."""

    def control_allgather(self, obj: Any) -> list[Any]:
        """Gather one picklable object from every rank of the world (negotiation)."""

    def start_allreduce(self, tensor: torch.Tensor, op: ReduceOp,
                        ranks: tuple[int, ...]) -> Callable[[], None]:
        """Start reducing a contiguous tensor in place over the set; returns the wait (the
        engine starts several before waiting on the first)."""

    def allreduces_in_place(self, ranks: tuple[int, ...], device: str) -> bool:
        """Whether :meth:`start_allreduce_list` reduces several tensors of the set on ``device``
        (``"cpu"`` or ``"cuda"``) where they lie, without the engine's fusion buffer. The
        same on every member of the set."""

    def start_allreduce_list(self, tensors: Sequence[torch.Tensor], op: ReduceOp,
                             ranks: tuple[int, ...]) -> Callable[[], None]:
        """Start reducing contiguous tensors of one dtype in place over the set, as one
        allreduce of their concatenation; returns the wait. Only where
        :meth:`allreduces_in_place` says so.

        Raises:
            NotImplementedError: this backend reduces one flat tensor at a time there.
        """

    def allgather(self, output: torch.Tensor, tensor: torch.Tensor,
                  ranks: tuple[int, ...]) -> None:
        """Gather equal-shaped tensors into ``output`` (first dim = members × rows)."""

    def broadcast_(self, tensor: torch.Tensor, root: int, ranks: tuple[int, ...]) -> None:
        """Copy global rank ``root``'s tensor to every member, in place."""

    def alltoall(self, output: torch.Tensor, tensor: torch.Tensor, output_splits: Sequence[int],
                 input_splits: Sequence[int], ranks: tuple[int, ...]) -> None:
        """Scatter rows of ``tensor`` to members and gather theirs into ``output``."""

    def reducescatter(self, output: torch.Tensor, tensor: torch.Tensor, op: ReduceOp,
                      ranks: tuple[int, ...]) -> None:
        """Reduce ``tensor`` over the set; member i receives the i-th equal slice."""

    def close(self) -> None:
        """Release every communicator."""
