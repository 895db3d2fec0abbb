"""The single-process backend: a world of one, where every collective is a local copy.

Used when a script runs without a launcher, so that ``hvd.init()`` needs no sockets and a
single-device script wrapped for ringtrain runs unchanged at full speed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ringtrain.op_types import ReduceOp


class LocalBackend:
    """Collectives over a world of size one."""

    rank = 0
    size = 1

    def add_set(self, ranks: tuple[int, ...]) -> None:
        pass

    def remove_set(self, ranks: tuple[int, ...]) -> None:
        pass

    def control_allreduce(self, counts: torch.Tensor) -> None:
        pass

    def control_allgather(self, obj: Any) -> list[Any]:
        return [obj]

    def start_allreduce(self, tensor: torch.Tensor, op: ReduceOp,
                        ranks: tuple[int, ...]) -> Callable[[], None]:
        return _done

    def allreduces_in_place(self, ranks: tuple[int, ...], device: str) -> bool:
        return False  # as on Gloo: the engine packs batches into its fusion buffer

    def start_allreduce_list(self, tensors: Sequence[torch.Tensor], op: ReduceOp,
                             ranks: tuple[int, ...]) -> Callable[[], None]:
        return _done

    def allgather(self, output: torch.Tensor, tensor: torch.Tensor,
                  ranks: tuple[int, ...]) -> None:
        output.copy_(tensor.reshape(output.shape))

    def broadcast_(self, tensor: torch.Tensor, root: int, ranks: tuple[int, ...]) -> None:
        pass

    def alltoall(self, output: torch.Tensor, tensor: torch.Tensor, output_splits: Sequence[int],
                 input_splits: Sequence[int], ranks: tuple[int, ...]) -> None:
        output.copy_(tensor)

    def reducescatter(self, output: torch.Tensor, tensor: torch.Tensor, op: ReduceOp,
                      ranks: tuple[int, ...]) -> None:
        output.copy_(tensor)

    def close(self) -> None:
        pass


def _done() -> None:
    pass
