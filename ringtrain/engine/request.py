"""What a rank asks the engine to do: the request records.

A :class:`Request` lives on the submitting rank and holds the tensors. Its :class:`RequestMeta`
is the picklable description that ranks exchange during negotiation; all agreement checks and
scheduling decisions are made from metas alone, so every rank reaches the same decision.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from ringtrain.op_types import OpType, ReduceOp

if TYPE_CHECKING:
    import torch

    from ringtrain.engine.handle import Handle


class OpKey(NamedTuple):
    """What tells operations apart: a name within a process set (its ranks).

    Names are Horovod's per process set: ranks 0 and 1, each in a set of its own, may both
    submit ``"grad"``, and those are two operations, each complete with its one member. Keyed by
    name alone they met in one negotiation and failed as a disagreement on the process set
    whenever both were pending in the same round. Ordered by name first, so that responses
    still come in name order.
    """

    name: str
    set_ranks: tuple[int, ...]


@dataclass(frozen=True)
class TensorMeta:
    """Shape, dtype and device of one tensor, as exchanged between ranks."""

    shape: tuple[int, ...]
    dtype: str  # str(torch.dtype), e.g. "torch.float32": picklable and readable in errors
    device: str  # "cpu" or "cuda": ranks may use different CUDA indices, not different kinds


@dataclass(frozen=True)
class RequestMeta:
    """One rank's description of a pending request: everything peers must agree on.

    ``set_ranks`` is carried (rather than a process-set id) so that deciding readiness needs no
    rank-local registry, which may lag behind on some ranks; registered sets never share their
    ranks, so the ranks name the set, and with the name they key the operation (:class:`OpKey`).
    """

    name: str
    op: OpType
    rank: int
    set_ranks: tuple[int, ...]
    tensors: tuple[TensorMeta, ...]
    reduce_op: ReduceOp | None = None
    root_rank: int = -1
    prescale: float = 1.0
    postscale: float = 1.0
    splits: tuple[int, ...] | None = None  # alltoall: rows sent to each member of the set
    #: How long the request has waited on its rank, for stall reports; not part of what peers
    #: must agree on, so equality ignores it.
    age_s: float = field(default=0.0, compare=False)
    #: Whether a thread of its rank is blocked waiting for it, for deadlock detection; not part
    #: of what peers must agree on either.
    waited: bool = field(default=False, compare=False)
    #: The round in which its rank first offered it (rounds are counted alike on every rank):
    #: orders joins by cause, where ages measured on different ranks' clocks cannot.
    offered_round: int = field(default=-1, compare=False)

    @functools.cached_property
    def key(self) -> OpKey:
        # Made once: the engine looks a request up by its key several times per operation.
        return OpKey(self.name, self.set_ranks)

    @functools.cached_property
    def on_cuda(self) -> bool:
        """Whether any of its tensors is on a GPU (asked at every submission of the meta)."""
        return any(t.device == "cuda" for t in self.tensors)


@dataclass
class Request:
    """A rank's own submission: the meta, the tensors the engine works in, and its handle."""

    meta: RequestMeta
    outputs: list[torch.Tensor]
    handle: Handle
    submitted_at: float = 0.0  # stamped with the engine's clock when queued (Backlog.add)
    ready_event: torch.cuda.Event | None = None  # a CUDA event recorded on the submitting stream
    grouped: bool = False  # complete with a list even when it holds one tensor
    counted: str | None = None  # the readiness counter this submission was added to, if any
    offered_round: int = -1  # the round that first took it, once one did
    #: ``meta.key``, kept: the engine looks a request up by it several times per operation
    key: OpKey = field(init=False)

    def __post_init__(self) -> None:
        self.key = self.meta.key

    @property
    def name(self) -> str:
        return self.meta.name
