"""Executing negotiated responses: fusion buffers, collectives, scaling, completing handles.

Every rank runs the same responses in the same order (allreduce batches first, then the rest in
response order); a rank outside an operation's process set skips it, and a joined rank takes
part in allreduces with zeros (docs/engine.md, "Join" and "Execution").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ringtrain.backends.base import CollectiveBackend
from ringtrain.engine import adasum, fusion
from ringtrain.engine.negotiation import Response
from ringtrain.engine.request import OpKey, Request, RequestMeta, TensorMeta
from ringtrain.engine.timeline import Timeline
from ringtrain.op_types import OpType, ReduceOp

#: Fusion plans kept: a training loop's rounds alternate between a few lists of responses (the
#: first tensor of a burst run alone or with the rest, the last ones left to the next round).
_PLANS_KEPT = 8


@dataclass
class _Inflight:
    """An allreduce batch whose collective has started."""

    batch: list[Response]
    tensors: list[torch.Tensor]
    buf: torch.Tensor | None  # the fusion buffer; None: reduced where they lie
    wait: Callable[[], None]
    start: float
    copied_in: float


class Executor:
    """Runs one round's responses on this rank."""

    def __init__(self, backend: CollectiveBackend, fusion_threshold: int, timeline: Timeline,
                 backend_name: str = "GLOO"):
        self._backend = backend
        self._rank = backend.rank
        self._threshold = fusion_threshold
        self._buffers = fusion.FusionBuffers()
        self._timeline = timeline
        self._backend_name = backend_name
        #: rounds' fusion plans: the responses and their batches, by the ids of the
        #: responses in order
        self._plans: dict[tuple[int, ...], tuple[list[Response], list[list[Response]]]] = {}

    def run(self, responses: list[Response], local: dict[OpKey, Request]) -> None:
        """Execute ``responses``; ``local`` maps their keys to this rank's own requests."""
        allreduces: list[Response] = []
        others: list[Response] = []
        for response in responses:
            if response.error:
                request = local.get(response.key)
                if request is not None:
                    request.handle.set_error(response.failure(response.error))
            elif self._rank in response.set_ranks:
                fused = (response.op is OpType.ALLREDUCE
                         and response.meta.reduce_op is not ReduceOp.ADASUM)
                (allreduces if fused else others).append(response)
        if len(allreduces) == 1:  # a lone allreduce (a synchronous call's round): no planning
            self._allreduce_batches([allreduces], local, self._in_place)
        elif allreduces:
            self._allreduce_batches(self._plan(allreduces), local, self._in_place)
        for response in others:
            request = local.get(response.key)
            start = time.monotonic()
            result = _RUNNERS[response.op](self, response, request)
            if request is not None:
                self._trace(response, start)
                request.handle.set_result(result)

    def run_lone_allreduce(self, response: Response, request: Request) -> None:
        """Execute a cached lone allreduce of one CPU tensor of this rank's (the express round):
        what :meth:`run` does for it, without planning, batches or the fusion buffer."""
        meta = response.meta
        tensor = request.outputs[0]
        timeline = self._timeline
        start = time.monotonic() if timeline.active else 0.0
        _scale_(tensor, meta.prescale, 1)
        self._backend.start_allreduce(tensor, _wire_op(meta), meta.set_ranks)()
        if timeline.active:
            done = time.monotonic()
            timeline.span(response.name, "ALLREDUCE", start, done, fused=1)
            timeline.span(response.name, f"{self._backend_name}_ALLREDUCE", start, done)
        _hand_over(request, meta)

    def _plan(self, allreduces: list[Response]) -> list[list[Response]]:
        """The fusion plan of ``allreduces``, made once for the same responses in the same order
        (a training loop's rounds repeat the cached ones), for the last few such lists. Whether
        the backend reduces a batch where it lies is asked again when the batch runs: a plan made
        for another answer stays correct, its batches then going through the fusion buffer."""
        key = tuple(map(id, allreduces))  # the plans hold the responses: ids stay theirs
        known = self._plans.get(key)
        if known is not None:
            return known[1]
        batches = fusion.plan(allreduces, self._threshold, self._in_place)
        if len(self._plans) >= _PLANS_KEPT:
            self._plans.clear()
        self._plans[key] = (allreduces, batches)
        return batches

    def _in_place(self, response: Response) -> bool:
        """Whether the backend reduces ``response``'s tensors where they lie."""
        return self._backend.allreduces_in_place(response.meta.set_ranks,
                                                 response.meta.tensors[0].device)

    # -- allreduce ----------------------------------------------------------------------------

    def _allreduce_batches(self, batches: list[list[Response]], local: dict[OpKey, Request],
                           in_place: Callable[[Response], bool]) -> None:
        """Start every batch's collective, then finish them in order: copying a batch into its
        buffer overlaps the transfer of the batches started before it."""
        started = [self._start_allreduce(batch, local, in_place(batch[0])) for batch in batches]
        for inflight in started:
            self._finish_allreduce(inflight, local)

    def _start_allreduce(self, batch: list[Response], local: dict[OpKey, Request],
                         in_place: bool) -> _Inflight:
        first = batch[0].meta
        start = time.monotonic()
        tensors: list[torch.Tensor] = []
        for response in batch:
            request = local.get(response.key)
            if request is None:  # a joined rank contributes zeros
                tensors += [_zeros(t) for t in response.meta.tensors]
            else:
                _wait_ready(request)
                tensors += request.outputs
        wire_op = _wire_op(first)
        if in_place or len(tensors) == 1:
            # The outputs are this operation's own (a copy, or the caller's in-place tensor):
            # scaling them before the collective is what Horovod's prescale does.
            for t in tensors:
                _scale_(t, first.prescale, 1)
            copied_in = time.monotonic()
            if len(tensors) == 1:
                wait = self._backend.start_allreduce(tensors[0], wire_op, first.set_ranks)
            else:
                wait = self._backend.start_allreduce_list(tensors, wire_op, first.set_ranks)
            return _Inflight(batch, tensors, None, wait, start, copied_in)
        total = sum(t.numel() for t in tensors)
        buf = self._buffers.acquire(tensors[0].dtype, tensors[0].device, total)
        torch.cat([t.reshape(-1) for t in tensors], out=buf)
        copied_in = time.monotonic()
        _scale_(buf, first.prescale, 1)
        wait = self._backend.start_allreduce(buf, wire_op, first.set_ranks)
        return _Inflight(batch, tensors, buf, wait, start, copied_in)

    def _finish_allreduce(self, inflight: _Inflight, local: dict[OpKey, Request]) -> None:
        batch, tensors, buf = inflight.batch, inflight.tensors, inflight.buf
        first = batch[0].meta
        inflight.wait()
        reduced = time.monotonic()
        if buf is not None:
            torch.split_with_sizes_copy(buf, [t.numel() for t in tensors],
                                        out=[t.view(-1) for t in tensors])
            self._buffers.release(buf)
        done = time.monotonic()
        for response in batch:
            request = local.get(response.key)
            if request is None:
                continue
            if self._timeline.active:
                row = response.name
                self._timeline.span(row, "ALLREDUCE", inflight.start, done, fused=len(batch))
                if buf is not None:
                    self._timeline.span(row, "MEMCPY_IN_FUSION_BUFFER", inflight.start,
                                        inflight.copied_in)
                    self._timeline.span(row, "MEMCPY_OUT_FUSION_BUFFER", reduced, done)
                self._timeline.span(row, f"{self._backend_name}_ALLREDUCE", inflight.copied_in,
                                    reduced)
            _hand_over(request, first)

    def _adasum(self, response: Response, request: Request | None) -> torch.Tensor:
        if request is None:  # joined: zeros, which Adasum adds as nothing
            tensor = _zeros(response.meta.tensors[0])
        else:
            _wait_ready(request)
            tensor = request.outputs[0]
        n = len(response.set_ranks)
        _scale_(tensor, response.meta.prescale, 1)
        gathered = torch.empty((n * tensor.numel(),), dtype=tensor.dtype, device=tensor.device)
        self._backend.allgather(gathered, tensor.reshape(-1), response.set_ranks)
        tensor.copy_(adasum.reduce(list(gathered.view(n, *tensor.shape))))
        _scale_(tensor, response.meta.postscale, 1)
        return tensor

    # -- the other collectives ------------------------------------------------------------------

    def _allgather(self, response: Response, request: Request | None):
        assert request is not None  # negotiation fails an allgather that needs a joined rank
        _wait_ready(request)
        ranks = response.set_ranks
        results = []
        for i, mine in enumerate(request.outputs):
            rows = [response.metas[r].tensors[i].shape[0] for r in ranks]
            longest = max(rows)
            padded = mine
            if mine.shape[0] < longest:
                padded = torch.zeros((longest, *mine.shape[1:]), dtype=mine.dtype,
                                     device=mine.device)
                padded[:mine.shape[0]] = mine
            out = torch.empty((len(ranks) * longest, *mine.shape[1:]), dtype=mine.dtype,
                              device=mine.device)
            self._backend.allgather(out, padded.contiguous(), ranks)
            if any(r != longest for r in rows):
                out = torch.cat([out[j * longest:j * longest + r] for j, r in enumerate(rows)])
            results.append(out)
        return results if _grouped(request) else results[0]

    def _broadcast(self, response: Response, request: Request | None) -> torch.Tensor:
        assert request is not None
        _wait_ready(request)
        tensor = request.outputs[0]
        self._backend.broadcast_(tensor, response.meta.root_rank, response.set_ranks)
        return tensor

    def _alltoall(self, response: Response, request: Request | None):
        assert request is not None
        _wait_ready(request)
        ranks = response.set_ranks
        me = ranks.index(self._rank)
        tensor = request.outputs[0]
        send = response.metas[self._rank].splits or ()
        recv = [(response.metas[r].splits or ())[me] for r in ranks]
        out = torch.empty((sum(recv), *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
        self._backend.alltoall(out, tensor, recv, send, ranks)
        return out, torch.tensor(recv, dtype=torch.int32)

    def _reducescatter(self, response: Response, request: Request | None):
        assert request is not None
        _wait_ready(request)
        ranks = response.set_ranks
        n, me = len(ranks), ranks.index(self._rank)
        meta = response.meta
        divisor = n if meta.reduce_op is ReduceOp.AVERAGE else 1
        assert meta.reduce_op is not None  # every reducescatter carries its op
        wire_op = ReduceOp.SUM if meta.reduce_op is ReduceOp.AVERAGE else meta.reduce_op
        results = []
        for tensor in request.outputs:
            rows = split_rows(tensor.shape[0], n)
            longest = rows[0]
            if all(r == longest for r in rows):
                padded = tensor
            else:
                padded = torch.zeros((n * longest, *tensor.shape[1:]), dtype=tensor.dtype,
                                     device=tensor.device)
                offset = 0
                for j, r in enumerate(rows):
                    padded[j * longest:j * longest + r] = tensor[offset:offset + r]
                    offset += r
            _scale_(padded, meta.prescale, 1)
            out = torch.empty((longest, *tensor.shape[1:]), dtype=tensor.dtype,
                              device=tensor.device)
            self._backend.reducescatter(out, padded.contiguous(), wire_op, ranks)
            out = out[:rows[me]]
            _scale_(out, meta.postscale, divisor)
            results.append(out)
        return results if _grouped(request) else results[0]

    def _barrier(self, response: Response, request: Request | None) -> None:
        # Negotiation declared it ready only once every member had submitted it: that is the
        # barrier already, no data needs to move.
        return None

    def _trace(self, response: Response, start: float) -> None:
        if self._timeline.active:
            op = response.op.value.upper()
            self._timeline.span(response.name, op, start, time.monotonic())
            self._timeline.span(response.name, f"{self._backend_name}_{op}", start,
                                time.monotonic())


_RUNNERS = {
    OpType.ALLREDUCE: Executor._adasum,  # other allreduces are fused before this table
    OpType.ALLGATHER: Executor._allgather,
    OpType.BROADCAST: Executor._broadcast,
    OpType.ALLTOALL: Executor._alltoall,
    OpType.REDUCESCATTER: Executor._reducescatter,
    OpType.BARRIER: Executor._barrier,
}


def split_rows(rows: int, parts: int) -> list[int]:
    """Horovod's reducescatter split: the first ``rows % parts`` members get one extra row."""
    base, extra = divmod(rows, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _wire_op(meta: RequestMeta) -> ReduceOp:
    """The reduction an allreduce's collective runs: a sum for an average, divided after."""
    assert meta.reduce_op is not None  # every allreduce carries its op
    return ReduceOp.SUM if meta.reduce_op is ReduceOp.AVERAGE else meta.reduce_op


def _hand_over(request: Request, meta: RequestMeta) -> None:
    """Complete an allreduced request: its tensor or list, and the postscale and average's
    division left to the thread that synchronizes it."""
    outs = request.outputs
    divisor = len(meta.set_ranks) if meta.reduce_op is ReduceOp.AVERAGE else 1
    request.handle.set_result(outs if len(outs) > 1 or _grouped(request) else outs[0],
                              then=_scaling(outs, meta.postscale, divisor))


def _grouped(request: Request) -> bool:
    return request.grouped or len(request.outputs) > 1


def _zeros(meta: TensorMeta) -> torch.Tensor:
    shape = meta.shape
    device = torch.device("cuda", torch.cuda.current_device()) if meta.device == "cuda" else "cpu"
    return torch.zeros(shape, dtype=getattr(torch, meta.dtype.removeprefix("torch.")),
                       device=device)


def _wait_ready(request: Request) -> None:
    if request.ready_event is not None:
        request.ready_event.synchronize()


def _scaling(tensors: list[torch.Tensor], factor: float,
             divisor: int) -> Callable[[], None] | None:
    """The scaling of a reduced result, run by the thread that synchronizes it: a full pass over
    the data, which that thread's intra-op team does fastest (see Handle.set_result)."""
    if factor == 1 and divisor == 1:
        return None

    def scale() -> None:
        for t in tensors:
            _scale_(t, factor, divisor)
    return scale


def _scale_(tensor: torch.Tensor, factor: float, divisor: int) -> None:
    """Multiply by ``factor / divisor`` in place; integers are truncated, as in Horovod."""
    if factor == 1 and divisor == 1:
        return
    if tensor.dtype.is_floating_point:
        tensor.mul_(factor / divisor)
    else:
        # The frontend refuses to scale booleans before submission: failing here, on one rank
        # after negotiation, would leave the peers waiting.
        assert tensor.dtype is not torch.bool
        tensor.copy_(torch.div(tensor.double() * factor, divisor).trunc())
