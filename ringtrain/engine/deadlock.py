"""Deadlock detection: operations that can never complete because every rank they wait for is
itself blocked (docs/engine.md, "Deadlocks").

An operation can still complete only if every member that has not submitted it may still do so:
a rank that is not blocked, or a blocked rank one of whose awaited operations can itself still
complete. The ranks left over (the greatest fixpoint) wait forever, and every operation they
wait for fails with :class:`~ringtrain.errors.DeadlockError`.

Pure: every rank runs :func:`find` on the same gathered metas and gets the same responses. A
rank waiting in ``join`` counts as blocked from the first round that sees it wait there (it
submits nothing more), so that a join waiting for ranks found deadlocked fails with them even
when it began waiting between the two rounds that prove the others blocked.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from ringtrain.engine.negotiation import Decision, Response
from ringtrain.engine.request import RequestMeta
from ringtrain.errors import DeadlockError
from ringtrain.op_types import OpType

#: The message lists at most this many ranks, and this many pending operations of each.
_MAX_RANKS_LISTED = 16
_MAX_OPS_LISTED = 8


def find(metas_by_rank: Sequence[Sequence[RequestMeta]], decision: Decision,
         blocked: Collection[int]) -> list[Response]:
    """The operations to fail because they can never complete.

    Args:
        metas_by_rank: for each global rank, the metas of its pending requests (``waited`` set on
            those a thread of that rank is blocked on).
        decision: this round's decision from the same metas (what runs now cannot deadlock).
        blocked: the ranks known to be blocked (see the module docstring).

    Returns:
        An error response for every operation a deadlocked rank waits for, in name order (then
        process set); empty when no rank is deadlocked.
    """
    world = len(metas_by_rank)
    blocked = set(blocked) | {r for r, metas in enumerate(metas_by_rank)
                              if any(m.op is OpType.JOIN and m.waited for m in metas)}
    if not blocked or decision.join_done is not None:
        return []
    decided = {response.key for response in decision.responses}
    joined = {r for r, metas in enumerate(metas_by_rank)
              if any(m.op is OpType.JOIN for m in metas)}
    awaited = {r: [m for m in metas_by_rank[r] if m.waited] for r in blocked}

    def missing(meta: RequestMeta) -> set[int]:
        if meta.op is OpType.JOIN:
            return set(range(world)) - joined
        if meta.key in decided:
            return set()
        waiting = decision.waiting.get(meta.key)
        return set(waiting.missing) if waiting is not None else set()

    live = set(range(world)) - set(blocked)
    changed = True
    while changed:
        changed = False
        for rank in sorted(set(blocked) - live):
            if any(missing(m) <= live for m in awaited[rank]):
                live.add(rank)
                changed = True
    stuck = sorted(set(blocked) - live)
    if not stuck:
        return []
    message = _report(metas_by_rank, stuck, missing)
    keys = sorted({m.key for rank in stuck for m in awaited[rank]})
    responses = []
    for key in keys:
        subs = {r: m for r, metas in enumerate(metas_by_rank) for m in metas if m.key == key}
        first = subs[min(subs)]
        responses.append(Response(key.name, first.op, subs, error=message,
                                  failure=DeadlockError))
    return responses


def _report(metas_by_rank: Sequence[Sequence[RequestMeta]], stuck: list[int],
            missing) -> str:
    lines = []
    for rank in stuck[:_MAX_RANKS_LISTED]:
        metas = sorted(metas_by_rank[rank], key=lambda m: (not m.waited, m.name))
        waits = "; ".join(f"{_describe(m)} (not submitted by rank(s) {sorted(missing(m))})"
                          for m in metas if m.waited)
        pending = ", ".join(_describe(m) for m in metas[:_MAX_OPS_LISTED])
        if len(metas) > _MAX_OPS_LISTED:
            pending += f", and {len(metas) - _MAX_OPS_LISTED} more"
        lines.append(f"  rank {rank} waits for {waits}; its pending operations: {pending}")
    if len(stuck) > _MAX_RANKS_LISTED:
        lines.append(f"  and {len(stuck) - _MAX_RANKS_LISTED} more ranks")
    return (f"deadlock: rank(s) {stuck} wait for operations that can never complete, each one "
            "missing on ranks that themselves wait for another of them (the ranks' programs "
            "diverged: they submit different operations, or the same ones under different names "
            "or in another order). Every awaited operation of these ranks failed on every rank "
            "that submitted it:\n" + "\n".join(lines))


def _describe(meta: RequestMeta) -> str:
    return "join()" if meta.op is OpType.JOIN else f"{meta.op.value} {meta.name!r}"
