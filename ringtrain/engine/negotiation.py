"""Negotiation: from every rank's pending requests, decide which operations run now.

A pure function of the metas gathered from all ranks, so every rank computes the same responses
in the same order without a coordinator. An operation is a name within a process set
(:class:`~ringtrain.engine.request.OpKey`); it is ready when every member of its process set has
submitted it (a joined rank stands in for allreduces); ready operations whose ranks
disagree become error responses that fail that one operation on every rank.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ringtrain.engine.request import OpKey, RequestMeta
from ringtrain.errors import TensorMismatchError
from ringtrain.op_types import OpType

#: Operations that proceed with joined ranks contributing zeros: allreduce (and Adasum). The
#: others fail on every submitting rank, as in Horovod 0.28.1 (docs/engine.md, "Join").
JOINABLE_OPS = frozenset({OpType.ALLREDUCE})


@dataclass(frozen=True)
class Response:
    """A decision for one named operation, identical on every rank.

    Attributes:
        metas: the meta of every rank that submitted it, by global rank.
        joined: members that had joined and take part contributing zeros (allreduce only).
        error: set when the operation must fail on every rank instead of running.
        failure: the exception class its handles then raise with ``error``.
    """

    name: str
    op: OpType
    metas: dict[int, RequestMeta]
    joined: tuple[int, ...] = ()
    error: str | None = None
    failure: type[RuntimeError] = TensorMismatchError

    @functools.cached_property
    def meta(self) -> RequestMeta:
        """The meta of the lowest submitting rank: the agreed description when no error.
        (Computed once: a cached response runs again and again.)"""
        return self.metas[min(self.metas)]

    @property
    def set_ranks(self) -> tuple[int, ...]:
        return self.meta.set_ranks

    @property
    def key(self) -> OpKey:
        return self.meta.key


@dataclass(frozen=True)
class Waiting:
    """An operation some members of its process set have not submitted yet."""

    submitted: tuple[int, ...]
    missing: tuple[int, ...]
    age_s: float  # how long the longest-waiting submitter has waited


@dataclass
class Decision:
    """The outcome of one negotiation round."""

    responses: list[Response] = field(default_factory=list)
    #: operations still waiting for some members, for stall reports
    waiting: dict[OpKey, Waiting] = field(default_factory=dict)
    #: set when every rank has joined: the rank that joined last
    join_done: int | None = None


def decide(metas_by_rank: Sequence[Sequence[RequestMeta]]) -> Decision:
    """Decide which pending operations are ready everywhere.

    Args:
        metas_by_rank: for each global rank, the metas of all requests pending there.

    Returns:
        The responses to execute (in a deterministic order), the operations still waiting, and
        whether the global join completed.
    """
    world = len(metas_by_rank)
    by_key: dict[OpKey, dict[int, RequestMeta]] = {}
    joins: dict[int, RequestMeta] = {}
    for rank, metas in enumerate(metas_by_rank):
        for m in metas:
            if m.op is OpType.JOIN:
                joins[rank] = m
            else:
                by_key.setdefault(m.key, {})[rank] = m

    decision = Decision()
    joined = frozenset(joins)
    for key in sorted(by_key):
        name, subs = key.name, by_key[key]
        first = subs[min(subs)]
        members = first.set_ranks
        stand_ins = (joined & set(members)) - set(subs) if first.op in JOINABLE_OPS else set()
        missing = tuple(r for r in members if r not in subs and r not in stand_ins)
        if missing:
            blocked_by_join = [r for r in missing if r in joined]
            if blocked_by_join:
                root = " (the root)" if first.root_rank in blocked_by_join else ""
                hint = (" If this is a sparse gradient of DistributedOptimizer, pass "
                        "sparse_as_dense=True to reduce it with an allreduce."
                        if first.op is OpType.ALLGATHER else "")
                decision.responses.append(Response(name, first.op, subs, error=(
                    f"{first.op.value} {name!r} cannot run: rank(s) {blocked_by_join}{root} "
                    f"have already called join(), and {first.op.value} needs every member "
                    f"(only allreduce goes on with joined ranks, as in Horovod).{hint}")))
            else:
                decision.waiting[key] = Waiting(tuple(sorted(subs)), missing,
                                                max(m.age_s for m in subs.values()))
            continue
        error = _disagreement(name, subs)
        decision.responses.append(
            Response(name, first.op, dict(subs), joined=tuple(sorted(stand_ins)), error=error))

    if joins and len(joins) == world:
        # The last join offered joined last: a rank that joined while another still trained
        # offered its join rounds earlier. Joins offered in one round are simultaneous: the one
        # that waited least, then the higher rank (ages come from different clocks).
        decision.join_done = max(joins, key=lambda r: (joins[r].offered_round, -joins[r].age_s, r))
    return decision


def _disagreement(name: str, subs: dict[int, RequestMeta]) -> str | None:
    """Why the ranks' requests for ``name`` (in one process set: that is part of what an
    operation is) cannot run together, or None if they agree."""
    first = subs[min(subs)]
    op = first.op.value
    checks: list[tuple[str, Callable[[RequestMeta], object]]] = [
        ("operation", lambda m: m.op.value),
        ("number of tensors", lambda m: len(m.tensors)),
        ("dtype", lambda m: [t.dtype.removeprefix("torch.") for t in m.tensors]),
        ("device", lambda m: [t.device for t in m.tensors]),
    ]
    if first.op in (OpType.ALLGATHER, OpType.ALLTOALL):
        checks.append(("trailing dimensions", lambda m: [list(t.shape[1:]) for t in m.tensors]))
        checks.append(("rank (number of dimensions)", lambda m: [len(t.shape) for t in m.tensors]))
    elif first.op is not OpType.BARRIER:
        checks.append(("shape", lambda m: [list(t.shape) for t in m.tensors]))
    if first.op in (OpType.ALLREDUCE, OpType.REDUCESCATTER):
        checks.append(("reduction op", lambda m: repr(m.reduce_op)))
        checks.append(("prescale/postscale factors", lambda m: (m.prescale, m.postscale)))
    if first.op is OpType.BROADCAST:
        checks.append(("root rank", lambda m: m.root_rank))
    for what, get in checks:
        values = {r: _unwrap(get(m)) for r, m in sorted(subs.items())}
        if len({repr(v) for v in values.values()}) > 1:
            per_rank = "; ".join(f"rank {r}: {v}" for r, v in values.items())
            return (f"{op} {name!r}: ranks disagree on the {what} ({per_rank}). The operation "
                    f"was cancelled on every rank; submit the same {what} on all ranks.")
    if first.op is OpType.BROADCAST and first.root_rank not in first.set_ranks:
        return (f"broadcast {name!r}: root rank {first.root_rank} is not a member of the process "
                f"set {list(first.set_ranks)}")
    if first.op is OpType.ALLTOALL:
        return _alltoall_disagreement(name, subs)
    return None


def _alltoall_disagreement(name: str, subs: dict[int, RequestMeta]) -> str | None:
    for r, m in sorted(subs.items()):
        splits = m.splits or ()
        rows = m.tensors[0].shape[0] if m.tensors[0].shape else 1
        if len(splits) != len(m.set_ranks) or sum(splits) != rows or min(splits) < 0:
            return (f"alltoall {name!r}: rank {r} gave splits {list(splits)} for a tensor of "
                    f"{rows} rows; splits need one non-negative entry per member "
                    f"({len(m.set_ranks)}) summing to the first dimension")
    return None


def _unwrap(value: object) -> object:
    """Show a one-tensor request's value without the list around it."""
    return value[0] if isinstance(value, list) and len(value) == 1 else value
