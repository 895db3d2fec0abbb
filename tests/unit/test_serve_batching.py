"""The dynamic batcher on its worker thread: batch formation, refusal, expiry, failure, drain,
and results handed to the event loop once per batch."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from ringtrain.serve.batching import ClosedError, DynamicBatcher, QueueFullError


class Recorder:
    """A model stand-in that records its batches; ``gate`` holds it until the test releases it,
    ``called`` says it has been called."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.called = threading.Event()

    def __call__(self, items: list[int]) -> list[int]:
        self.called.set()
        assert self.gate.wait(10)
        if -1 in items:
            raise RuntimeError("bad batch")
        self.batches.append(items)
        return [i * 10 for i in items]


def _on_loop(test: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``test`` on an event loop of its own, within bounded time."""
    async def bounded() -> Any:
        return await asyncio.wait_for(test(), 20)
    return asyncio.run(bounded())


async def _results(futures: list[asyncio.Future]) -> list[Any]:
    return list(await asyncio.wait_for(asyncio.gather(*futures), 10))


def test_waiting_inputs_join_one_batch_up_to_the_maximum() -> None:
    model = Recorder()
    batcher = DynamicBatcher(model, max_batch_size=4, max_wait_s=0.5, queue_size=16)

    async def test() -> None:
        futures = [batcher.submit(i, timeout_s=10) for i in range(6)]  # queued before the start
        batcher.start()
        assert await _results(futures) == [0, 10, 20, 30, 40, 50]
    _on_loop(test)
    assert model.batches[0] == [0, 1, 2, 3]
    assert [i for b in model.batches for i in b] == list(range(6))
    assert batcher.close(5)


def test_an_input_alone_runs_at_once_and_a_batch_waits_only_for_inputs_on_their_way() -> None:
    model = Recorder()
    # A batch that waited for max_wait would outlast _on_loop's bound many times over.
    batcher = DynamicBatcher(model, max_batch_size=2, max_wait_s=3600, queue_size=16)

    async def test() -> None:
        batcher.start()
        assert await batcher.run([1], 10) == [10]
        with batcher.incoming():  # a request being parsed: the batch of 2 waits for it
            first = batcher.submit(2, 10)
            await asyncio.sleep(0.2)
            second = batcher.submit(3, 10)
        assert await _results([first, second]) == [20, 30]
    _on_loop(test)
    assert model.batches == [[1], [2, 3]]
    batcher.close(5)


def test_batch_size_one_runs_inputs_alone() -> None:
    model = Recorder()
    batcher = DynamicBatcher(model, max_batch_size=1, max_wait_s=0.5, queue_size=16)

    async def test() -> None:
        futures = [batcher.submit(i, timeout_s=10) for i in range(3)]
        batcher.start()
        assert await _results(futures) == [0, 10, 20]
    _on_loop(test)
    assert model.batches == [[0], [1], [2]]
    batcher.close(5)


def test_a_full_queue_refuses_at_once_and_run_queues_all_or_nothing() -> None:
    batcher = DynamicBatcher(Recorder(), max_batch_size=1, max_wait_s=0, queue_size=2)

    async def test() -> None:
        batcher.submit(1, 10)
        with pytest.raises(QueueFullError, match="holds 2 inputs"):
            await batcher.run([2, 3], 10)  # the second does not fit: the first is withdrawn
        assert batcher.depth == 2  # 1 and the withdrawn 2, which the worker will skip
        batcher.start()
        assert await batcher.run([4], 10) == [40]
    _on_loop(test)
    batcher.close(5)


def test_expired_and_cancelled_inputs_are_not_run() -> None:
    model = Recorder()
    batcher = DynamicBatcher(model, max_batch_size=8, max_wait_s=0, queue_size=8)

    async def test() -> None:
        expired = batcher.submit(1, timeout_s=-1)
        cancelled = batcher.submit(2, timeout_s=10)
        assert cancelled.cancel()
        kept = batcher.submit(3, timeout_s=10)
        batcher.start()
        assert await asyncio.wait_for(kept, 10) == 30
        with pytest.raises(TimeoutError, match="waiting in the queue"):
            await asyncio.wait_for(expired, 10)
    _on_loop(test)
    assert model.batches == [[3]]
    batcher.close(5)


def test_run_times_out_and_its_input_is_skipped() -> None:
    model = Recorder()
    model.gate.clear()
    batcher = DynamicBatcher(model, max_batch_size=1, max_wait_s=0, queue_size=8)

    async def test() -> None:
        batcher.start()
        first = batcher.submit(1, 10)  # holds the worker until the gate opens
        with pytest.raises(TimeoutError):
            await batcher.run([2], 0.1)
        model.gate.set()
        assert await asyncio.wait_for(first, 10) == 10
        assert await batcher.run([3], 10) == [30]
    _on_loop(test)
    assert model.batches == [[1], [3]]
    batcher.close(5)


def test_a_failing_batch_fails_its_inputs_and_the_worker_goes_on() -> None:
    model = Recorder()
    batcher = DynamicBatcher(model, max_batch_size=2, max_wait_s=0, queue_size=8)

    async def test() -> None:
        bad = [batcher.submit(-1, 10), batcher.submit(5, 10)]
        batcher.start()
        for f in bad:
            with pytest.raises(RuntimeError, match="bad batch"):
                await asyncio.wait_for(f, 10)
        assert await batcher.run([7], 10) == [70]
    _on_loop(test)
    batcher.close(5)


def test_results_of_one_batch_reach_the_loop_in_one_call() -> None:
    model = Recorder()
    model.gate.clear()
    batcher = DynamicBatcher(model, max_batch_size=4, max_wait_s=0.5, queue_size=8)
    done_at: list[int] = []

    async def test() -> None:
        loop = asyncio.get_running_loop()
        futures = [batcher.submit(i, 10) for i in range(4)]
        ticks = 0

        def tick() -> None:  # counts loop iterations while the results arrive
            nonlocal ticks
            ticks += 1
            if not all(f.done() for f in futures):
                loop.call_soon(tick)

        for f in futures:
            f.add_done_callback(lambda _f: done_at.append(ticks))
        batcher.start()
        assert await loop.run_in_executor(None, model.called.wait, 10)  # held at the gate
        model.gate.set()
        loop.call_soon(tick)
        assert await _results(futures) == [0, 10, 20, 30]
    _on_loop(test)
    assert model.batches == [[0, 1, 2, 3]] and len(set(done_at)) == 1, done_at
    batcher.close(5)


def test_close_runs_what_is_queued_and_then_refuses() -> None:
    model = Recorder()
    model.gate.clear()
    sizes: list[int] = []
    batcher = DynamicBatcher(model, max_batch_size=1, max_wait_s=0, queue_size=8,
                             on_batch=lambda n, s: sizes.append(n))

    async def test() -> None:
        batcher.start()
        futures = [batcher.submit(i, 10) for i in range(3)]
        closer = threading.Thread(target=batcher.close, args=(10,))
        closer.start()
        closer.join(0.2)
        with pytest.raises(ClosedError):
            batcher.submit(9, 10)
        model.gate.set()
        await asyncio.to_thread(closer.join, 10)
        assert await _results(futures) == [0, 10, 20]
    _on_loop(test)
    assert sizes == [1, 1, 1] and not batcher.accepting


def test_close_fails_what_the_worker_never_reached() -> None:
    batcher = DynamicBatcher(Recorder(), max_batch_size=1, max_wait_s=0, queue_size=8)

    async def test() -> None:
        future = batcher.submit(1, 10)  # never started: nothing runs it
        await asyncio.to_thread(batcher.close, 1)
        with pytest.raises(ClosedError, match="stopped before this ran"):
            await asyncio.wait_for(future, 10)
    _on_loop(test)
