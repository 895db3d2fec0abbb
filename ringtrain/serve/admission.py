"""Admission before work: a request takes a place and its decoding memory before it is decoded.

Without it, 20 clients posting one 115 KB PNG of 6300x6300 pixels each took the server from
263 MB to 4.9 GB (issue 22): every image was decoded, ~300 MB each, in up to 40 threads before
the batcher's queue could refuse any of them, and most then timed out (504). Here a request
passes three gates, each answering 503 with ``Retry-After`` at once when shut:

1. a **place**: at most ``queue_size`` requests between arrival and answer (what the batcher
   would queue anyway), taken before the body is read;
2. **memory**: what decoding will allocate, estimated from the image's header (or the body's
   size) before any pixel is decoded, must fit in ``max_memory_bytes`` with what the admitted
   requests hold; a request that could never fit gets 413;
3. a **decoder**: decoding runs on a pool of one thread per core, not the default executor's.

What a request holds is given back when it is answered.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

from ringtrain.runner.threads import usable_cores
from ringtrain.serve.batching import QueueFullError
from ringtrain.serve.problems import HTTPProblem

T = TypeVar("T")


class MemoryBudgetError(QueueFullError):
    """Decoding this request now would take the server past its memory budget (503)."""


class Admission:
    """The gates in front of decoding; one per server, used from its event loop: at most
    ``places`` requests (the server's queue size) holding ``max_memory_bytes`` decoded, and
    ``decoders`` threads that decode (default: the usable cores)."""

    def __init__(self, places: int, max_memory_bytes: int, decoders: int | None = None):
        self.places = places
        self.max_memory_bytes = max_memory_bytes
        self._admitted = 0
        self._reserved = 0
        self._lock = threading.Lock()  # reservations are resized from decoder threads too
        self._pool = ThreadPoolExecutor(decoders or usable_cores(),
                                        thread_name_prefix="decode")

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

    async def decode(self, work: Callable[[], T]) -> T:
        """Run ``work`` on the decode pool."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, work)

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
