"""Dynamic batching: inputs of concurrent requests run through the model together.

Requests put their inputs on a bounded queue and get an ``asyncio.Future`` each. One worker
thread (inference never runs on the event loop) takes every waiting input, and waits up to
``max_wait_s`` for more only while more are on their way (:meth:`DynamicBatcher.incoming`): a
lone input runs at once, so batching costs it nothing. A batch's results reach the loop in one
``call_soon_threadsafe`` (one wake-up per batch, not per input). A full queue refuses at once
(:class:`QueueFullError`, answered 503) rather than grow; an input whose request timed out or
went away is skipped, not run.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ringtrain.errors import RingtrainError

log = logging.getLogger(__name__)


class QueueFullError(RingtrainError):
    """The queue holds as many inputs as it may: the server is saturated, try again shortly."""


class ClosedError(RingtrainError):
    """The batcher is draining for shutdown and takes no new input."""


@dataclass
class _Pending:
    item: Any
    future: asyncio.Future
    deadline: float


def _settle(outcomes: list[tuple[asyncio.Future, Any, BaseException | None]]) -> None:
    """On the event loop: complete the futures of one batch (those still waited for)."""
    for future, result, error in outcomes:
        if future.done():  # its request gave up meanwhile
            continue
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)


def _hand_over(outcomes: list[tuple[asyncio.Future, Any, BaseException | None]]) -> None:
    """From the worker: one call onto each loop that waits for some of ``outcomes``."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for outcome in outcomes:
        by_loop.setdefault(outcome[0].get_loop(), []).append(outcome)
    for loop, part in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle, part)
        except RuntimeError:  # that loop is closed: nobody waits for these any more
            log.debug("dropped %d results for a closed event loop", len(part))


class DynamicBatcher:
    """Groups inputs into batches for ``run_batch`` on a worker thread.

    Args:
        run_batch: Takes a list of inputs, returns one result per input, in order.
        max_batch_size: Most inputs per batch (1: no batching).
        max_wait_s: How long a batch's first input waits for others on their way.
        queue_size: Inputs waiting at most.
        on_batch: Called after each batch with its size and run time in seconds (metrics).
        clock: Monotonic seconds (injectable for tests).
    """

    def __init__(self, run_batch: Callable[[list[Any]], list[Any]], max_batch_size: int,
                 max_wait_s: float, queue_size: int,
                 on_batch: Callable[[int, float], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._run_batch = run_batch
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self._queue: queue.Queue[_Pending] = queue.Queue(maxsize=queue_size)
        self._on_batch = on_batch
        self._clock = clock
        self._closing = threading.Event()
        # Written on the event loop only; the worker reads it (a stale read costs one wait).
        self._incoming = 0
        self._thread = threading.Thread(target=self._work, name="batcher", daemon=True)

    @property
    def depth(self) -> int:
        """Inputs waiting now."""
        return self._queue.qsize()

    @property
    def accepting(self) -> bool:
        """False once :meth:`close` began."""
        return not self._closing.is_set()

    @contextmanager
    def incoming(self) -> Iterator[None]:
        """Around reading and parsing a request whose inputs will be submitted: while any is
        inside, a forming batch waits (up to ``max_wait_s``) for them; use it on the loop."""
        self._incoming += 1
        try:
            yield
        finally:
            self._incoming -= 1

    def start(self) -> None:
        """Start the worker thread."""
        self._thread.start()

    def submit(self, item: Any, timeout_s: float) -> asyncio.Future:
        """Queue one input, worth running for ``timeout_s``; call it on the event loop that
        will await the result.

        Returns:
            A future of its result (an exception if the batch failed or it timed out first);
            cancel it to have the input skipped if it has not run yet.

        Raises:
            QueueFullError: The queue is full.
            ClosedError: The batcher is draining.
            RuntimeError: No event loop runs in this thread.
        """
        if self._closing.is_set():
            raise ClosedError("the server is shutting down and takes no new requests")
        pending = _Pending(item, asyncio.get_running_loop().create_future(),
                           self._clock() + timeout_s)
        try:
            self._queue.put_nowait(pending)
        except queue.Full:
            raise QueueFullError(f"the queue holds {self._queue.maxsize} inputs; try again "
                                 "shortly") from None
        return pending.future

    async def run(self, items: Sequence[Any], timeout_s: float) -> list[Any]:
        """Queue ``items`` (one request's inputs) and wait up to ``timeout_s`` for their results,
        in order.

        Raises:
            QueueFullError: The queue has no room for all of them (those already queued are
                withdrawn: the worker skips them).
            ClosedError: The batcher is draining.
            TimeoutError: Not all ran within ``timeout_s`` (those not begun are skipped).
            Exception: What the model raised on their batch.
        """
        futures: list[asyncio.Future] = []
        try:
            for item in items:
                futures.append(self.submit(item, timeout_s))
            if len(futures) == 1:  # the usual case, without gather's task
                return [await asyncio.wait_for(futures[0], timeout_s)]
            return await asyncio.wait_for(asyncio.gather(*futures), timeout_s)
        finally:
            for f in futures:
                f.cancel()  # a no-op on those done; the worker skips the others

    def close(self, timeout_s: float) -> bool:
        """Stop taking input, let the worker finish what is queued, wait for it.

        Returns:
            Whether the worker finished within ``timeout_s`` (else what is left fails).
        """
        self._closing.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        finished = not self._thread.is_alive()
        left: list[tuple[asyncio.Future, Any, BaseException | None]] = []
        while True:  # anything the worker did not reach
            try:
                pending = self._queue.get_nowait()
            except queue.Empty:
                break
            left.append((pending.future, None, ClosedError("the server stopped before this ran")))
        _hand_over(left)
        return finished

    def _next_batch(self) -> list[_Pending]:
        try:
            first = self._queue.get(timeout=0.05)
        except queue.Empty:
            return []
        batch = [first]
        until = self._clock() + self.max_wait_s
        while len(batch) < self.max_batch_size:
            left = until - self._clock()
            try:
                if left > 0 and self._incoming and self._queue.empty():
                    batch.append(self._queue.get(timeout=left))
                else:
                    batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _work(self) -> None:
        while not (self._closing.is_set() and self._queue.empty()):
            batch = self._next_batch()
            now = self._clock()
            expired: list[tuple[asyncio.Future, Any, BaseException | None]] = [
                (p.future, None, TimeoutError("timed out waiting in the queue"))
                for p in batch if now > p.deadline and not p.future.done()]
            # A done future here was cancelled: its request gave up (timeout, client gone).
            live = [p for p in batch if now <= p.deadline and not p.future.done()]
            if not live:
                _hand_over(expired)
                continue
            started = self._clock()
            try:
                results = self._run_batch([p.item for p in live])
            except Exception as e:
                log.exception("inference failed on a batch of %d", len(live))
                _hand_over(expired + [(p.future, None, e) for p in live])
                continue
            if self._on_batch is not None:
                self._on_batch(len(live), self._clock() - started)
            _hand_over(expired + [(p.future, r, None) for p, r in zip(live, results)])
