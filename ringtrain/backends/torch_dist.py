"""The torch.distributed backend: Gloo for CPU tensors, NCCL for CUDA tensors.

Each process set gets its own communicators, separate from torch.distributed's default group, so
that user code may use torch.distributed beside ringtrain without its operations interleaving
with the engine's. Dtypes a library cannot reduce are widened on the wire and narrowed back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ringtrain.op_types import ReduceOp

_DIST_OPS = {
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
}
# Neither Gloo nor NCCL reduces int16; NCCL has no bool. Booleans reduce as uint8, where Sum/Max
# mean "any" and Min/Product mean "all".
_WIDEN = {torch.int16: torch.int32, torch.bool: torch.uint8}
_BOOL_OPS = {ReduceOp.SUM: ReduceOp.MAX, ReduceOp.MAX: ReduceOp.MAX,
             ReduceOp.MIN: ReduceOp.MIN, ReduceOp.PRODUCT: ReduceOp.MIN}


class TorchDistributedBackend:
    """Collectives on torch.distributed process groups, one pair (CPU, CUDA) per process set.

    Must be constructed after ``torch.distributed`` is initialised, on every rank.
    """

    def __init__(self, use_nccl: bool):
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()
        self._use_nccl = use_nccl
        world = tuple(range(self.size))
        # Negotiation has its own communicator so it never queues behind bulk data.
        self._control = dist.new_group(list(world), backend="gloo")
        self._groups: dict[tuple[int, ...], dict[str, Any]] = {}
        self.add_set(world)

    def add_set(self, ranks: tuple[int, ...]) -> None:
        groups = {"cpu": dist.new_group(list(ranks), backend="gloo")}
        if self._use_nccl:
            groups["cuda"] = dist.new_group(list(ranks), backend="nccl")
        if self.rank in ranks:
            self._groups[ranks] = groups

    def remove_set(self, ranks: tuple[int, ...]) -> None:
        groups = self._groups.pop(ranks, None)
        for group in (groups or {}).values():
            dist.destroy_process_group(group)

    def control_allreduce(self, counts: torch.Tensor) -> None:
        dist.all_reduce(counts, group=self._control)

    def control_allgather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self._control)
        return out

    def _group(self, tensor: torch.Tensor, ranks: tuple[int, ...]):
        groups = self._groups[ranks]
        if tensor.is_cuda:
            if "cuda" not in groups:
                raise RuntimeError("a CUDA tensor was submitted but NCCL is not available in this "
                                   "build of torch; move the tensor to the CPU")
            return groups["cuda"]
        return groups["cpu"]

    def start_allreduce(self, tensor: torch.Tensor, op: ReduceOp,
                        ranks: tuple[int, ...]) -> Callable[[], None]:
        return start_allreduce_on(self._group(tensor, ranks), tensor, op)

    def allreduces_in_place(self, ranks: tuple[int, ...], device: str) -> bool:
        return False  # Gloo and NCCL reduce one flat tensor: the engine fuses into a buffer

    def start_allreduce_list(self, tensors: Sequence[torch.Tensor], op: ReduceOp,
                             ranks: tuple[int, ...]) -> Callable[[], None]:
        raise NotImplementedError("torch.distributed reduces one flat tensor at a time: pack "
                                  "the tensors into a fusion buffer and call start_allreduce")

    def allgather(self, output: torch.Tensor, tensor: torch.Tensor,
                  ranks: tuple[int, ...]) -> None:
        allgather_on(self._group(tensor, ranks), output, tensor)

    def broadcast_(self, tensor: torch.Tensor, root: int, ranks: tuple[int, ...]) -> None:
        wire = _widen(tensor)
        dist.broadcast(wire, src=root, group=self._group(tensor, ranks))
        if wire is not tensor:
            tensor.copy_(wire)

    def alltoall(self, output: torch.Tensor, tensor: torch.Tensor, output_splits: Sequence[int],
                 input_splits: Sequence[int], ranks: tuple[int, ...]) -> None:
        wire_out, wire_in = _widen(output), _widen(tensor)
        dist.all_to_all_single(wire_out, wire_in, output_split_sizes=list(output_splits),
                               input_split_sizes=list(input_splits),
                               group=self._group(tensor, ranks))
        if wire_out is not output:
            output.copy_(wire_out)

    def reducescatter(self, output: torch.Tensor, tensor: torch.Tensor, op: ReduceOp,
                      ranks: tuple[int, ...]) -> None:
        wire_out, wire_in = _widen(output), _widen(tensor)
        if tensor.dtype is torch.bool:
            op = _BOOL_OPS[op]
        dist.reduce_scatter_single(wire_out, wire_in, op=_DIST_OPS[op],
                                   group=self._group(tensor, ranks))
        if wire_out is not output:
            output.copy_(wire_out)

    def close(self) -> None:
        for ranks in list(self._groups):
            self.remove_set(ranks)
        dist.destroy_process_group(self._control)


def start_allreduce_on(group: Any, tensor: torch.Tensor, op: ReduceOp) -> Callable[[], None]:
    """Start reducing contiguous ``tensor`` (any dtype the engine supports) in place over a
    torch.distributed group (every member calls this in the same order); returns the wait."""
    wire = _widen(tensor)
    if tensor.dtype is torch.bool:
        op = _BOOL_OPS[op]
    work = dist.all_reduce(wire, op=_DIST_OPS[op], group=group, async_op=True)

    def wait() -> None:
        work.wait()
        if wire is not tensor:
            tensor.copy_(wire)

    return wait


def allgather_on(group: Any, output: torch.Tensor, tensor: torch.Tensor) -> None:
    """Gather equal-sized tensors over a torch.distributed group: member j's lands at
    ``output[j]`` (flattened; every member calls this in the same order)."""
    wire_out, wire_in = _widen(output), _widen(tensor)
    dist.all_gather_single(wire_out, wire_in, group=group)
    if wire_out is not output:
        output.copy_(wire_out)


def _widen(tensor: torch.Tensor) -> torch.Tensor:
    wide = _WIDEN.get(tensor.dtype)
    return tensor if wide is None else tensor.to(wide)
