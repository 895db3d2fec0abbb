"""Collectives among the ranks of one host through a shared-memory segment.

Every operation goes in steps of at most one slot per member (see
:mod:`ringtrain.backends.shm_segment`), so a segment of a few MiB carries tensors of any size. An
allreduce step is a reduce-scatter then an all-gather through the segment; a fused batch runs
the same steps over its tensors' concatenation without forming it; a small allreduce (see
:func:`_one_step`) takes a single wait. Each is described in docs/shared_memory.md.

No member leaves a collective before every member has entered it (an empty tensor still takes a
step, a broadcast's root waits for the others to arrive): the engine counts on a collective of
all ranks meaning that all have read the round's bell (see ``Rounds.forget``).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence

import torch

from ringtrain.backends.shm_segment import Segment
from ringtrain.op_types import ReduceOp

_HALF = (torch.float16, torch.bfloat16)
#: Allreduces up to this size take one wait, every member reducing the whole tensor...
ONE_STEP_BYTES = 64 << 10
#: ...and larger ones too while each member reads at most this much to reduce them all.
ONE_STEP_READ_BYTES = 512 << 10
#: Small allreduces keep the slot views of this many (dtype, buffer, size) at most.
_SMALL_VIEWS = 256
#: Reductions of two tensors into a third.
_OUT_OF_PLACE: dict[ReduceOp, Callable[..., object]] = {
    ReduceOp.SUM: torch.add, ReduceOp.PRODUCT: torch.mul, ReduceOp.MIN: torch.minimum,
    ReduceOp.MAX: torch.maximum}
#: In-place reductions over lists of tensors (one call for all of a member's piece).
_FOREACH: dict[ReduceOp, Callable[[list[torch.Tensor], list[torch.Tensor]], object]] = {
    ReduceOp.SUM: torch._foreach_add_, ReduceOp.PRODUCT: torch._foreach_mul_,
    ReduceOp.MIN: torch._foreach_minimum_, ReduceOp.MAX: torch._foreach_maximum_}


class ShmGroup:
    """The collectives of one segment's members, called in the same order by each.

    Args:
        segment: the mapped segment, as this member sees it.
    """

    def __init__(self, segment: Segment):
        self.segment = segment
        self.n = segment.n
        self.me = segment.me
        self._small: dict[tuple[torch.dtype, int, int], list[torch.Tensor]] = {}
        self._scratches: dict[torch.dtype, torch.Tensor] = {}

    def close(self, aborted: bool = False) -> None:
        self._small.clear()
        self._scratches.clear()
        self.segment.close(aborted)

    def choose_step(self, candidates: Sequence[int], trials: int = 2) -> int:
        """Time an allreduce of one slot's bytes in steps of each candidate size (bytes, each
        at most the slot), and keep the fastest for every later collective. Collective over the
        members, which all keep the same step: the sum of their times decides. Returns it."""
        seg = self.segment
        scratch = torch.zeros(seg.slot_bytes // 4)
        totals = torch.zeros(len(candidates), dtype=torch.float64)
        for trial in range(trials + 1):  # the first round warms every size up, untimed
            for i, step in enumerate(candidates):
                seg.set_step_bytes(step)
                start = time.perf_counter()
                self.allreduce_(scratch, ReduceOp.SUM)
                if trial:
                    totals[i] += time.perf_counter() - start
        self.allreduce_(totals, ReduceOp.SUM)  # one small step: the same bits everywhere
        best = candidates[int(torch.argmin(totals))]
        seg.set_step_bytes(best)
        return best

    def _pieces(self, dtype: torch.dtype, buffer: int, m: int) -> list[torch.Tensor]:
        """The first ``m`` elements of every member's slot of ``buffer``: views kept per size
        (a small allreduce's cost is its Python; the same sizes come again and again)."""
        key = (dtype, buffer, m)
        pieces = self._small.get(key)
        if pieces is None:
            if len(self._small) >= _SMALL_VIEWS:
                self._small.clear()
            pieces = self._small[key] = [s[:m] for s in self.segment.slots(dtype, buffer)]
        return pieces

    def _scratch(self, dtype: torch.dtype, m: int) -> torch.Tensor:
        """``m`` elements of a buffer of this group's own, kept for the next call: a fused
        small allreduce reduces into it before scattering to its tensors, every round (at most
        :data:`ONE_STEP_READ_BYTES`, as a one-wait allreduce is no larger)."""
        scratch = self._scratches.get(dtype)
        if scratch is None or scratch.numel() < m:
            scratch = self._scratches[dtype] = torch.empty(m, dtype=dtype)
        return scratch[:m]

    # -- allreduce and reducescatter -------------------------------------------------------------

    def allreduce_(self, tensor: torch.Tensor, op: ReduceOp) -> None:
        """Reduce a contiguous tensor over the members, in place."""
        seg, n, me = self.segment, self.n, self.me
        flat = tensor if tensor.dim() == 1 else tensor.view(-1)
        cap = seg.step_elements(flat.dtype)
        m = flat.numel()
        if m <= cap and _one_step(m * flat.element_size(), n):
            step, buf = seg.begin("allreduce")
            pieces = self._pieces(flat.dtype, buf, m)
            pieces[me].copy_(flat)
            seg.publish(step, 1)
            seg.wait_all(3 * step + 1, "allreduce")
            _reduce_into(flat, pieces[0], pieces[1:], op)
            seg.publish(step, 3)
            return
        for start in _starts(m, cap):
            chunk = flat[start:start + cap]
            m = chunk.numel()
            bounds = [k * m // n for k in range(n + 1)]
            lo, hi = bounds[me], bounds[me + 1]
            step, buf = seg.begin("allreduce")
            slots = seg.slots(flat.dtype, buf)
            mine = slots[me]
            if lo:
                mine[:lo].copy_(chunk[:lo])
            if hi < m:
                mine[hi:m].copy_(chunk[hi:])
            seg.publish(step, 1)
            seg.wait_all(3 * step + 1, "allreduce")
            _reduce_into(chunk[lo:hi], chunk[lo:hi],
                         [slots[j][lo:hi] for j in range(n) if j != me], op)
            mine[lo:hi].copy_(chunk[lo:hi])
            seg.publish(step, 2)
            seg.wait_all(3 * step + 2, "allreduce")
            for j in range(n):
                if j != me and bounds[j + 1] > bounds[j]:
                    chunk[bounds[j]:bounds[j + 1]].copy_(slots[j][bounds[j]:bounds[j + 1]])
            seg.publish(step, 3)

    def allreduce_list_(self, tensors: Sequence[torch.Tensor], op: ReduceOp) -> None:
        """Reduce contiguous tensors of one dtype over the members, in place, as one allreduce
        of their concatenation (every member passes the same shapes in the same order)."""
        if len(tensors) == 1:
            return self.allreduce_(tensors[0], op)
        seg, n, me = self.segment, self.n, self.me
        flats = _Concatenation([t if t.dim() == 1 else t.view(-1) for t in tensors])
        dtype = tensors[0].dtype
        cap = seg.step_elements(dtype)
        total = flats.numel
        if total <= cap and _one_step(total * tensors[0].element_size(), n):
            step, buf = seg.begin("allreduce")
            slots = seg.slots(dtype, buf)
            if total:
                torch.cat(flats.views(0, total), out=slots[me][:total])
            seg.publish(step, 1)
            seg.wait_all(3 * step + 1, "allreduce")
            reduced = self._scratch(dtype, total)
            _reduce_into(reduced, slots[0][:total], [slot[:total] for slot in slots[1:]], op)
            flats.scatter(reduced, 0)
            seg.publish(step, 3)
            return
        # Each member reduces its own piece where it lies in the tensors (one call over all of
        # them) when torch can (not fp16/bf16, which add up in fp32, nor bool): the piece then
        # never goes through the slot and back. Otherwise the whole chunk goes into the slot.
        combine = None if dtype in _HALF or dtype is torch.bool else _FOREACH.get(op)
        for start in _starts(total, cap):
            m = min(cap, total - start)
            bounds = [k * m // n for k in range(n + 1)]
            lo, hi = bounds[me], bounds[me + 1]
            step, buf = seg.begin("allreduce")
            slots = seg.slots(dtype, buf)
            mine = slots[me]
            if combine is None:
                torch.cat(flats.views(start, start + m), out=mine[:m])
            else:
                for j in range(n):
                    if j != me and bounds[j + 1] > bounds[j]:
                        torch.cat(flats.views(start + bounds[j], start + bounds[j + 1]),
                                  out=mine[bounds[j]:bounds[j + 1]])
            seg.publish(step, 1)
            seg.wait_all(3 * step + 1, "allreduce")
            if combine is None:
                _reduce_into(mine[lo:hi], mine[lo:hi],
                             [slots[j][lo:hi] for j in range(n) if j != me], op)
            elif hi > lo:
                own = flats.views(start + lo, start + hi)
                sizes = [piece.numel() for piece in own]
                for j in range(n):
                    if j != me:
                        combine(own, list(torch.split_with_sizes(slots[j][lo:hi], sizes)))
                torch.cat(own, out=mine[lo:hi])
            seg.publish(step, 2)
            seg.wait_all(3 * step + 2, "allreduce")
            for j in range(n):
                if (j != me or combine is None) and bounds[j + 1] > bounds[j]:
                    flats.scatter(slots[j][bounds[j]:bounds[j + 1]], start + bounds[j])
            seg.publish(step, 3)

    def reducescatter(self, output: torch.Tensor, tensor: torch.Tensor, op: ReduceOp) -> None:
        """Reduce ``tensor`` (n equal pieces) over the members; member i gets piece i."""
        seg, n, me = self.segment, self.n, self.me
        flat = tensor.reshape(-1)
        out = output.view(-1)
        length = out.numel()
        assert flat.numel() == n * length, "reducescatter input must be n equal pieces"
        cap = max(seg.step_elements(flat.dtype) // n, 1)
        for start in _starts(length, cap):
            m = min(cap, length - start)
            step, buf = seg.begin("reducescatter")
            slots = seg.slots(flat.dtype, buf)
            for k in range(n):
                if k != me:
                    slots[me][k * m:(k + 1) * m].copy_(flat[k * length + start:][:m])
            seg.publish(step, 1)
            seg.wait_all(3 * step + 1, "reducescatter")
            _reduce_into(out[start:start + m], flat[me * length + start:][:m],
                         [slots[j][me * m:(me + 1) * m] for j in range(n) if j != me], op)
            seg.publish(step, 3)

    # -- data movement ---------------------------------------------------------------------------

    def allgather(self, output: torch.Tensor, tensor: torch.Tensor) -> None:
        """Gather equal-sized tensors: member j's lands at ``output[j]`` (flattened)."""
        seg, n, me = self.segment, self.n, self.me
        flat = tensor.reshape(-1)
        out = output.view(-1)
        length = flat.numel()
        assert out.numel() == n * length, "allgather output must hold n inputs"
        out[me * length:(me + 1) * length].copy_(flat)
        cap = seg.step_elements(flat.dtype)
        for start in _starts(length, cap):
            m = min(cap, length - start)
            step, buf = seg.begin("allgather")
            slots = seg.slots(flat.dtype, buf)
            slots[me][:m].copy_(flat[start:start + m])
            seg.publish(step, 1)
            seg.wait_all(3 * step + 1, "allgather")
            for j in range(n):
                if j != me:
                    out[j * length + start:][:m].copy_(slots[j][:m])
            seg.publish(step, 3)

    def broadcast_(self, tensor: torch.Tensor, root: int) -> None:
        """Copy member ``root``'s contiguous tensor to every member, in place."""
        seg, me = self.segment, self.me
        flat = tensor.view(-1)
        cap = seg.step_elements(flat.dtype)
        for start in _starts(flat.numel(), cap):
            m = min(cap, flat.numel() - start)
            step, buf = seg.begin("broadcast")
            source = seg.slots(flat.dtype, buf)[root]
            if me == root:
                source[:m].copy_(flat[start:start + m])
                seg.publish(step, 1)
                seg.wait_all(3 * step + 1, "broadcast")  # every member has arrived
            else:
                seg.publish(step, 1)
                seg.wait_one(root, 3 * step + 1, "broadcast")
                flat[start:start + m].copy_(source[:m])
            seg.publish(step, 3)

    def alltoall(self, output: torch.Tensor, tensor: torch.Tensor, output_splits: Sequence[int],
                 input_splits: Sequence[int]) -> None:
        """Send rows ``input_splits[k]`` of ``tensor`` to member k; receive
        ``output_splits[j]`` rows from member j into ``output``, in member order."""
        seg, n, me = self.segment, self.n, self.me
        flat = tensor.reshape(-1)
        out = output.view(-1)
        row = 1
        for d in tensor.shape[1:]:
            row *= d
        # Everyone's row counts, so that each member knows where its rows lie in the others'
        # slots.
        step, buf = seg.begin("alltoall")
        seg.splits[buf, me, :] = list(input_splits)
        seg.publish(step, 1)
        seg.wait_all(3 * step + 1, "alltoall")
        sends = seg.splits[buf].tolist()
        seg.publish(step, 3)
        # Member j's rows for me start at its offset, and go at my output offset for j.
        src = [sum(sends[j][:me]) * row for j in range(n)]
        dst = [sum(output_splits[:j]) * row for j in range(n)]
        count = [sends[j][me] * row for j in range(n)]
        mine = flat[src[me]:src[me] + count[me]]
        out[dst[me]:dst[me] + count[me]].copy_(mine)
        cap = seg.step_elements(flat.dtype)
        total = max(sum(s) * row for s in sends)
        for start in range(0, total, cap):
            end = start + cap
            step, buf = seg.begin("alltoall")
            slots = seg.slots(flat.dtype, buf)
            m = max(min(end, flat.numel()) - start, 0)
            if m:
                slots[me][:m].copy_(flat[start:start + m])
            seg.publish(step, 1)
            seg.wait_all(3 * step + 1, "alltoall")
            for j in range(n):
                a, b = max(src[j], start), min(src[j] + count[j], end)
                if j != me and a < b:
                    out[dst[j] + a - src[j]:dst[j] + b - src[j]].copy_(
                        slots[j][a - start:b - start])
            seg.publish(step, 3)


class _Concatenation:
    """Flat tensors seen as one: the views of any range of their concatenation."""

    def __init__(self, flats: list[torch.Tensor]):
        self._flats = flats
        self._offsets = [0]
        for f in flats:
            self._offsets.append(self._offsets[-1] + f.numel())
        self.numel = self._offsets[-1]

    def views(self, start: int, end: int) -> list[torch.Tensor]:
        """The pieces of the tensors that hold elements ``start:end``, in order: a tensor
        held whole is itself, not a view (a slice costs a tensor object, about a microsecond,
        and a list of small gradients has many)."""
        offsets, flats = self._offsets, self._flats
        i = bisect.bisect_right(offsets, start) - 1
        pieces = []
        while start < end:
            first, last = offsets[i], offsets[i + 1]
            stop = end if end < last else last
            if stop > start:
                whole = start == first and stop == last
                pieces.append(flats[i] if whole else flats[i][start - first:stop - first])
            start = stop
            i += 1
        return pieces

    def scatter(self, source: torch.Tensor, start: int) -> None:
        """Copy flat ``source`` into elements ``start:start + len(source)``."""
        pieces = self.views(start, start + source.numel())
        if not pieces:
            return
        if len(pieces) == 1:
            pieces[0].copy_(source)
        else:
            torch.split_with_sizes_copy(source, [p.numel() for p in pieces], out=pieces)


def _one_step(nbytes: int, n: int) -> bool:
    """Whether an allreduce of ``nbytes`` among ``n`` members takes one wait. Among few members
    a second wait (for the slowest member, woken or scheduled late) costs more than reducing a
    few hundred KiB; among many, each member would read too much."""
    return nbytes <= ONE_STEP_BYTES or nbytes * n <= ONE_STEP_READ_BYTES


def _starts(length: int, cap: int) -> range:
    """Where each step starts: at least one step, even for nothing to move."""
    return range(0, max(length, 1), cap)


def _reduce_into(out: torch.Tensor, own: torch.Tensor, others: list[torch.Tensor],
                 op: ReduceOp) -> None:
    """``out = own op others[0] op ...``; ``out`` may be ``own``. fp16/bf16 add up in fp32."""
    if out.numel() == 0:
        return
    if own.dtype in _HALF and others:
        acc = own.float()
        for other in others:
            _combine_(acc, other.float(), op)
        out.copy_(acc)
        return
    if out.data_ptr() != own.data_ptr():
        if others and out.dtype is not torch.bool and op in _OUT_OF_PLACE:
            _OUT_OF_PLACE[op](own, others[0], out=out)  # one kernel, not a copy and a combine
            others = others[1:]
        else:
            out.copy_(own)
    for other in others:
        _combine_(out, other, op)


def _combine_(acc: torch.Tensor, other: torch.Tensor, op: ReduceOp) -> None:
    if acc.dtype is torch.bool:
        if op in (ReduceOp.SUM, ReduceOp.MAX):
            acc.logical_or_(other)
        else:
            acc.logical_and_(other)
    elif op is ReduceOp.SUM:
        acc.add_(other)
    elif op is ReduceOp.PRODUCT:
        acc.mul_(other)
    elif op is ReduceOp.MIN:
        torch.minimum(acc, other, out=acc)
    elif op is ReduceOp.MAX:
        torch.maximum(acc, other, out=acc)
    else:
        raise ValueError(f"shared-memory collectives cannot reduce with {op}")
