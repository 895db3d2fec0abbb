"""Admission before work: a request takes a place, its decoding memory and its time before it
is decoded.

Without it, 20 clients posting one 115 KB PNG of 6300x6300 pixels each took the server from
263 MB to 4.9 GB (issue 22): every image was decoded, ~300 MB each, in up to 40 threads before
the batcher's queue could refuse any of them, and most then timed out (504). Here a request
passes four gates, each answering 503 with ``Retry-After`` at once when shut:

1. a **place**: at most ``queue_size`` requests between arrival and answer (what the batcher
   would queue anyway), taken before the body is read;
2. **memory**: what decoding will allocate, estimated from the image's header (or the body's
   size) before any pixel is decoded, must fit in ``max_memory_bytes`` with what the admitted
   requests hold; a request that could never fit gets 413;
3. **time**: the decodes and the inputs ahead of it, and its own, at the rates this server
   measured (:mod:`ringtrain.serve.service_times`), must end before its deadline; else it is
   refused now rather than left to time out (issue 35: with the memory gate alone, 7 of 40
   such images were answered 504 at load 12). A decode whose turn comes too late to finish in
   time is skipped with the same answer;
4. a **decoder**: decoding runs on a pool of one thread per core, not the default executor's.

What a request holds is given back when it is answered.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

from ringtrain.runner.threads import usable_cores
from ringtrain.serve.batching import QueueFullError
from ringtrain.serve.problems import HTTPProblem
from ringtrain.serve.service_times import ServiceTimes

T = TypeVar("T")

#: How much longer than forecast a request may take and still be answered in time: the rates
#: are averages, and one decode may be slower than the last few.
MARGIN = 1.25


class MemoryBudgetError(QueueFullError):
    """Decoding this request now would take the server past its memory budget (503)."""


class Admission:
    """The gates in front of decoding; one per server, used from its event loop: at most
    ``places`` requests (the server's queue size) holding ``max_memory_bytes`` decoded, each
    forecast to be answered before its deadline, and ``decoders`` threads that decode
    (default: the usable cores).

    Args:
        queued: The inputs waiting in the batcher now.
        clock: ``time.perf_counter`` unless a test injects one: deadlines are in its seconds.
    """

    def __init__(self, places: int, max_memory_bytes: int, decoders: int | None = None,
                 queued: Callable[[], int] = lambda: 0,
                 clock: Callable[[], float] = time.perf_counter):
        self.places = places
        self.max_memory_bytes = max_memory_bytes
        self.decoders = decoders or usable_cores()
        self.times = ServiceTimes()
        self._queued = queued
        self._clock = clock
        self._admitted = 0
        self._reserved = 0
        # Decodes given to the pool and not done, and the seconds they were forecast to take.
        self._decoding = 0
        self._decoding_s = 0.0
        self._lock = threading.Lock()  # reservations are resized from decoder threads too
        self._pool = ThreadPoolExecutor(self.decoders, thread_name_prefix="decode")

    @property
    def reserved_bytes(self) -> int:
        """The memory admitted requests hold now."""
        return self._reserved

    @contextmanager
    def place(self) -> Iterator[Ticket]:
        """Hold one of the places for a request's whole life.

        Raises:
            QueueFullError: every place is taken (503).
        """
        with self._lock:
            if self._admitted >= self.places:
                raise QueueFullError(f"the server holds {self.places} requests (--queue-size); "
                                     "try again shortly")
            self._admitted += 1
        ticket = Ticket(self)
        try:
            yield ticket
        finally:
            ticket.release()
            with self._lock:
                self._admitted -= 1

    def _reserve(self, nbytes: int) -> None:
        if nbytes > self.max_memory_bytes:
            raise HTTPProblem(413, f"decoding this request takes about {_mib(nbytes)}, more than "
                                   f"the server's memory budget of {_mib(self.max_memory_bytes)} "
                                   "(--max-memory-mib): send a smaller image or batch")
        with self._lock:
            if self._reserved + nbytes > self.max_memory_bytes:
                raise MemoryBudgetError(
                    f"the requests admitted hold {_mib(self._reserved)} of the "
                    f"{_mib(self.max_memory_bytes)} memory budget; this one needs "
                    f"{_mib(nbytes)}: try again shortly")
            self._reserved += nbytes

    def _give_back(self, nbytes: int) -> None:
        with self._lock:
            self._reserved -= nbytes

    def check_time(self, deadline: float, inputs: int, decode_s: float = 0.0) -> None:
        """Refuse a request whose ``inputs``, after the work ahead of them (and ``decode_s`` of
        its own decoding on the pool), are forecast to be answered after ``deadline``, unless
        no work is ahead of it.

        Raises:
            HTTPProblem: 503 with ``Retry-After``: the seconds of work ahead, at least 1.
        """
        with self._lock:
            decoding, decoding_s = self._decoding, self._decoding_s
        pool_wait = decoding_s / self.decoders if decode_s and decoding >= self.decoders else 0.0
        ahead = pool_wait + (self._queued() + decoding) * self.times.item_s
        needed = ahead + decode_s + inputs * self.times.item_s
        left = deadline - self._clock()
        # With nothing ahead, waiting would not help: it is tried (and answered 503 should it
        # still run out of time), which also measures the rates a wrong forecast came from.
        if ahead > 0 and needed * MARGIN > left:
            retry = max(1, math.ceil(ahead))
            raise HTTPProblem(503, f"the server is too busy to answer this request in time: "
                                   f"about {needed:.1f} s of work is ahead of and for it, and "
                                   f"{max(left, 0):.1f} s of its timeout is left; try again in "
                                   f"{retry} s", {"Retry-After": str(retry)})

    async def decode(self, work: Callable[[], T], kind: str, cost: int, deadline: float) -> T:
        """Run ``work``, a decode of ``kind`` (``"image"``, ``"tensor"``) of ``cost`` bytes
        (what its ticket reserved), on the decode pool, if it can be answered by ``deadline``.

        Raises:
            HTTPProblem: 503 with ``Retry-After``, as :meth:`check_time`, now or when its turn
                comes too late.
        """
        forecast = self.times.decode_s(kind, cost)
        self.check_time(deadline, 1, forecast)
        with self._lock:
            queued = self._decoding >= self.decoders  # it waits for a decoder
            self._decoding += 1
            self._decoding_s += forecast

        def timed() -> T:
            begun = self._clock()
            try:
                # The decodes ahead took longer than forecast: its own would end too late. (One
                # that did not wait always runs, as check_time lets it: its time is measured.)
                if queued and begun + forecast > deadline:
                    raise HTTPProblem(503, "the server is too busy to answer this request in "
                                           "time: its decoding would end past its timeout; "
                                           "try again shortly", {"Retry-After": "1"})
                result = work()
            finally:
                with self._lock:
                    self._decoding -= 1
                    self._decoding_s -= forecast
            self.times.observe_decode(kind, cost, self._clock() - begun)
            return result

        return await asyncio.get_running_loop().run_in_executor(self._pool, timed)

    def close(self) -> None:
        """Stop the decode pool (after the decodes under way)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


class Ticket:
    """What one admitted request holds of the memory budget."""

    def __init__(self, admission: Admission):
        self._admission = admission
        self.bytes = 0

    def reserve(self, nbytes: int) -> None:
        """Hold ``nbytes`` more (before decoding).

        Raises:
            MemoryBudgetError: the budget is used up by others for now (503).
            HTTPProblem: 413, ``nbytes`` alone exceeds the budget.
        """
        self._admission._reserve(nbytes)
        self.bytes += nbytes

    def shrink_to(self, nbytes: int) -> None:
        """Hold only ``nbytes`` once decoded (what the decoded input keeps until answered)."""
        if nbytes < self.bytes:
            self._admission._give_back(self.bytes - nbytes)
            self.bytes = nbytes

    def release(self) -> None:
        """Give everything back."""
        self.shrink_to(0)


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):,.0f} MiB"
