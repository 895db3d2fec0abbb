"""What the engine tests do to engines: submit as the frontend would, and read handles with
every wait bounded."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import pytest
import torch

from ringtrain.engine.engine import Engine
from ringtrain.engine.handle import Handle
from ringtrain.engine.request import Request, RequestMeta, TensorMeta
from ringtrain.op_types import OpType, ReduceOp

WAIT_S = 5.0


def request(rank: int, ranks: tuple[int, ...], name: str,
            tensor: torch.Tensor | Sequence[torch.Tensor] | None = None,
            op: OpType = OpType.ALLREDUCE, reduce_op: ReduceOp | None = ReduceOp.SUM,
            root_rank: int = -1, splits: Sequence[int] | None = None) -> Request:
    """Rank ``rank``'s request of one operation over ``ranks``, as the frontend makes it; a list
    of tensors is a grouped operation."""
    grouped = isinstance(tensor, (list, tuple))
    given = list(tensor) if grouped else [] if tensor is None else [tensor]
    tensors = [t.clone() for t in given]
    meta = RequestMeta(name=name, op=op, rank=rank, set_ranks=ranks,
                       tensors=tuple(TensorMeta(tuple(t.shape), str(t.dtype), t.device.type)
                                     for t in tensors),
                       reduce_op=reduce_op if op in (OpType.ALLREDUCE, OpType.REDUCESCATTER)
                       else None,
                       root_rank=root_rank, splits=None if splits is None else tuple(splits))
    return Request(meta=meta, outputs=tensors, handle=Handle(name), grouped=grouped)


def submit(engine: Engine, name: str, tensor: torch.Tensor | Sequence[torch.Tensor] | None = None,
           op: OpType = OpType.ALLREDUCE, reduce_op: ReduceOp | None = ReduceOp.SUM,
           root_rank: int = -1, ranks: tuple[int, ...] | None = None,
           splits: Sequence[int] | None = None, synchronous: bool = False) -> Handle:
    """Submit one operation on ``engine`` over ``ranks`` (the world by default), as the
    frontend would. ``synchronous``: as ``hvd.allreduce_`` submits, its caller waiting for the
    result at once."""
    ranks = tuple(range(engine.size)) if ranks is None else ranks
    made = request(engine.rank, ranks, name, tensor, op, reduce_op, root_rank, splits)
    engine.submit(made, synchronous=synchronous)
    return made.handle


def join(engine: Engine) -> Handle:
    return submit(engine, "join", op=OpType.JOIN)


def results(handles: list[Handle]) -> list:
    """Each handle's result, as (lists of) lists for tensors."""
    return [_plain(handle.wait(WAIT_S)) for handle in handles]


def sum_ones(engines: list[Engine], names: Sequence[str]) -> None:
    """Every engine allreduces ones under each of ``names`` in turn; each sums to the number of
    engines everywhere (the first time negotiates a name, later times run it from the cache)."""
    for name in names:
        assert results([submit(e, name, torch.ones(1)) for e in engines]) == (
            [[float(len(engines))]] * len(engines)), name


def _plain(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def errors(handles: list[Handle]) -> list[BaseException]:
    """Each handle's error; fails the test if one succeeded."""
    out = []
    for handle in handles:
        with pytest.raises(RuntimeError) as info:
            handle.wait(WAIT_S)
        out.append(info.value)
    return out


def count_looks(engines: Sequence[Engine]) -> list[int]:
    """How many times each engine's pending watch looks at its backlog from now on, by rank."""
    looks = [0] * (max(e.rank for e in engines) + 1)
    for engine in engines:
        def counting(_look=engine._watch.look, _rank=engine.rank) -> bool:
            looks[_rank] += 1
            return _look()

        engine._watch.look = counting  # type: ignore[method-assign]
    return looks


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.002)


def step(engines: list[Engine], names: tuple[str, ...], value: Callable[[int], float],
         ranks: tuple[int, ...] | None = None) -> list:
    """Every engine given submits ``names`` as one unit (a gradient bucket); the reduced
    values."""
    handles = []
    for engine in engines:
        with engine.one_round():
            handles += [submit(engine, n, torch.full((2,), float(value(engine.rank))),
                               ranks=ranks) for n in names]
    return results(handles)
