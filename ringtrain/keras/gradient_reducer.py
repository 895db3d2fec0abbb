"""One step's gradients of Keras variables, averaged across ranks in a few flat buckets.

The gradients are copied into :class:`~ringtrain.torch.grad_bucket.GradBucket` flat tensors (the
torch frontend's buckets, cut the same way) and each bucket is one named in-place allreduce;
explicit ``groups`` are units of their own, each one grouped allreduce (docs/keras.md). Ranks
pair variables by position, as Horovod does: buckets are named after the positions of their
variables, not after Keras' generated paths, which differ between a rank that loaded a
checkpoint and one that built its model afresh.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ringtrain.engine.config import DEFAULT_BUCKET_BYTES
from ringtrain.keras.collectives import check_same_variables
from ringtrain.keras.handoff import Handoff
from ringtrain.op_types import ReduceOp
from ringtrain.torch import ops, runtime
from ringtrain.torch.grad_bucket import GradBucket, by_kind, plan_buckets
from ringtrain.torch.process_sets import ProcessSet


def split_list(items: list, parts: int) -> list[list]:
    """``items`` in ``parts`` consecutive groups whose sizes differ by at most one (Horovod's
    ``split_list``, used for ``groups=N``)."""
    d, r = divmod(len(items), parts)
    return [items[i * d + min(i, r):(i + 1) * d + min(i + 1, r)] for i in range(parts)]


class GradientReducer:
    """Reduces the gradients of one list of variables across the ranks of a process set, with
    :func:`~ringtrain.keras.optimizer.DistributedOptimizer`'s arguments (``prefix``: its
    allreduces' names start with it, alike on every rank)."""

    def __init__(self, prefix: str, compression: Any, op: ReduceOp,
                 gradient_predivide_factor: float, groups: int | list | None,
                 process_set: ProcessSet, handoff: Handoff):
        self._prefix = prefix
        self._compression = compression
        self._op = op
        self._prescale = 1.0 / gradient_predivide_factor if op is ReduceOp.AVERAGE else 1.0
        self._postscale = gradient_predivide_factor if op is ReduceOp.AVERAGE else 1.0
        self._groups = groups
        self._process_set = process_set
        self._handoff = handoff
        self._key: tuple[int, ...] | None = None
        self._world: runtime.Runtime | None = None  # the world the plan was checked in
        self._units: list[list[tuple[GradBucket, list[int]]]] = []
        self._params: list[torch.Tensor] = []

    def _plan(self, variables: Sequence[Any]) -> None:
        """Cut the variables into units of buckets; every rank cuts the same list alike.

        Raises:
            TensorMismatchError: the ranks' variables differ in number, shape or dtype.
        """
        check_same_variables(variables, f"{self._prefix}.variables", self._process_set)
        # Torch tensors of the variables' shapes and dtypes: the buckets' keys and sizes (the
        # variables themselves hold TensorFlow or JAX values on those backends).
        self._params = [self._handoff.stand_in(v) for v in variables]
        # Per-variable rows of this rank's timeline only: the paths may differ between ranks.
        names = {p: f"allreduce.{v.path}" for p, v in zip(self._params, variables)}
        index = {id(p): i for i, p in enumerate(self._params)}
        explicit: list[list[int]] = []
        if isinstance(self._groups, int) and self._groups > 0:
            explicit = [g for g in split_list(list(range(len(variables))), self._groups) if g]
        elif isinstance(self._groups, list):
            by_id = {id(v): i for i, v in enumerate(variables)}
            seen: set[int] = set()
            for group in self._groups:
                members = [by_id[id(v)] for v in group
                           if id(v) in by_id and by_id[id(v)] not in seen]
                seen.update(members)
                if members:
                    explicit.append(members)
        grouped = {i for g in explicit for i in g}
        units = [[[index[id(p)] for p in kind] for kind in by_kind([self._params[i] for i in g])]
                 for g in explicit]
        rest = [p for i, p in enumerate(self._params) if i not in grouped]
        units += [[[index[id(p)] for p in bucket]]
                  for bucket in plan_buckets(rest, DEFAULT_BUCKET_BYTES)]
        self._units = []
        for unit in units:
            buckets = []
            for members in unit:
                params = [self._params[i] for i in members]
                first, last = members[0], members[-1]
                name = f"{self._prefix}.{first}" + (f"..{last}" if len(members) > 1 else "")
                buckets.append((GradBucket(name, params, names), members))
            self._units.append(buckets)

    def reduce(self, grads: Sequence[Any], variables: Sequence[Any]) -> list[torch.Tensor]:
        """Return the reduced gradients, in the order of ``variables``.

        A ``None`` gradient (a variable this rank did not use) travels as zeros, since peers may
        have used it, and comes back reduced like the others, so that every rank applies the
        same update (as the torch frontend's optimizer does). The returned tensors are views of
        the buckets, valid until the next call.

        Raises:
            ValueError: ``grads`` and ``variables`` differ in length.
            TensorMismatchError: the ranks' variables differ in number, shape or dtype.
            HorovodInternalError: a peer failed.
        """
        if len(grads) != len(variables):
            raise ValueError(f"got {len(grads)} gradients for {len(variables)} variables")
        key = tuple(id(v) for v in variables)
        world = runtime.current()
        # A new world (an elastic reset) plans again, so that survivors and newcomers run the
        # plan's check together.
        if key != self._key or world is not self._world:
            self._plan(variables)
            self._key, self._world = key, world
        engine = world.engine
        inflight = []
        for unit in self._units:
            for bucket, members in unit:
                for i in members:
                    g = grads[i]
                    if g is not None and not isinstance(g, torch.Tensor):
                        g = torch.as_tensor(g)
                    bucket.put(self._params[i], g, self._prescale, engine.timeline)
            with engine.one_round():
                for bucket, members in unit:
                    wire, ctx = self._compression.compress(bucket.flat())
                    handle = ops.allreduce_async_(wire, name=bucket.name, op=self._op,
                                                  postscale_factor=self._postscale,
                                                  process_set=self._process_set)
                    inflight.append((bucket, members, handle, ctx))
        out: list[torch.Tensor] = [torch.empty(0)] * len(grads)
        try:
            for bucket, members, handle, ctx in inflight:
                reduced = self._compression.decompress(ops.synchronize(handle), ctx)
                for i, view in zip(members, bucket.views(reduced)):
                    out[i] = view
        except BaseException:
            # Leave nothing in flight under these names: the next step (after an elastic
            # restore, say) submits them again.
            for _, _, handle, _ in inflight:
                try:
                    ops.synchronize(handle)
                except Exception:  # noqa: BLE001, S110 - the failure being raised already says why
                    pass
            raise
        return out
