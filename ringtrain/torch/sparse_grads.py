"""Sparse gradients in ``DistributedOptimizer``: each reduced on its own, outside the buckets,
as Horovod does (``sparse_allreduce_async``: only the rows a step touched travel).

Whether a gradient is sparse shows only when backward produces it, after the buckets were
planned: a parameter found sparse during a step keeps its slot in its bucket for that step
(carrying zeros, as on every rank), and the buckets are planned again without it for the next.
Every rank finds the same parameters sparse in the same step, so the buckets stay alike.
"""

from __future__ import annotations

import torch

from ringtrain.op_types import ReduceOp
from ringtrain.torch import ops
from ringtrain.torch.process_sets import ProcessSet


class SparseGradients:
    """The parameters whose gradients are sparse, and this step's reductions of them.

    Args:
        names: each parameter's allreduce name (its gradient travels as ``<name>.indices`` and
            ``<name>.values``).
        op: ``Average`` or ``Sum``.
        process_set: the ranks to reduce over.
    """

    def __init__(self, names: dict, op: ReduceOp, process_set: ProcessSet):
        self._names = names
        self._op = op
        self._process_set = process_set
        self.params: set[torch.nn.Parameter] = set()  # found sparse: no bucket holds them
        self._sparse_dims: dict[torch.nn.Parameter, int] = {}
        self._new = False  # found one this step: the buckets must be planned again
        self._inflight: dict[torch.nn.Parameter, ops.SparseAllreduceHandle] = {}

    def found(self, p: torch.nn.Parameter) -> None:
        """``p``'s gradient turned out sparse: reduce it now, and leave the buckets from the
        next step on."""
        self.params.add(p)
        assert p.grad is not None  # it was found sparse on its gradient
        self._sparse_dims[p] = p.grad.sparse_dim()
        self._new = True
        self.submit(p)

    def submit(self, p: torch.nn.Parameter) -> None:
        """Start reducing ``p``'s gradient (an empty one if this rank has none this step: the
        peers' allgathers need this rank's part)."""
        grad = p.grad
        if grad is None:
            dim = self._sparse_dims[p]
            grad = torch.sparse_coo_tensor(
                torch.empty((dim, 0), dtype=torch.int64, device=p.device),
                torch.empty((0, *p.shape[dim:]), dtype=p.dtype, device=p.device), p.shape,
                check_invariants=True)
        self._inflight[p] = ops.sparse_allreduce_async(grad, name=self._names[p], op=self._op,
                                                       process_set=self._process_set)

    def submit_missing(self) -> None:
        """Submit the sparse parameters whose hooks did not fire this step."""
        for p in self.params - self._inflight.keys():
            self.submit(p)

    def finish(self) -> None:
        """Wait for this step's reductions and make them the gradients."""
        for p, handle in self._inflight.items():
            p.grad = handle()

    def forget_step(self, wait: bool = True) -> bool:
        """Drop this step's reductions (waiting for them first: their names must be free for
        the next step; ``wait=False`` where their engine is gone). Returns whether the buckets
        must be planned again."""
        for handle in self._inflight.values() if wait else ():
            try:
                handle.wait()
            except RuntimeError:
                pass  # the step failed (a peer died, a mismatch); nothing of it is used
        self._inflight.clear()
        replan, self._new = self._new, False
        return replan
