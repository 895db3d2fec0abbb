"""The dynamic batcher on its worker thread: batch formation, refusal, expiry, failure, drain."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest

from ringtrain.serve.batching import ClosedError, DynamicBatcher, QueueFullError


class Recorder:
    """A model stand-in that records its batches; ``gate`` holds it until the test releases it."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, items: list[int]) -> list[int]:
        assert self.gate.wait(10)
        if -1 in items:
            raise RuntimeError("bad batch")
        self.batches.append(items)
        return [i * 10 for i in items]


def _results(futures: list[Future]) -> list[int]:
    return [f.result(timeout=10) for f in futures]


def test_waiting_inputs_join_one_batch_up_to_the_maximum() -> None:
    model = Recorder()
    batcher = DynamicBatcher(model, max_batch_size=4, max_wait_s=0.5, queue_size=16)
    futures = [batcher.submit(i, timeout_s=10) for i in range(6)]  # queued before the start
    batcher.start()
    assert _results(futures) == [0, 10, 20, 30, 40, 50]
    assert model.batches[0] == [0, 1, 2, 3] and [i for b in model.batches for i in b] == list(range(6))
    assert batcher.close(5)


def test_batch_size_one_runs_inputs_alone() -> None:
    model = Recorder()
    batcher = DynamicBatcher(model, max_batch_size=1, max_wait_s=0.5, queue_size=16)
    futures = [batcher.submit(i, timeout_s=10) for i in range(3)]
    batcher.start()
    assert _results(futures) == [0, 10, 20] and model.batches == [[0], [1], [2]]
    batcher.close(5)


def test_a_full_queue_refuses_at_once() -> None:
    batcher = DynamicBatcher(Recorder(), max_batch_size=1, max_wait_s=0, queue_size=2)
    batcher.submit(1, 10)
    batcher.submit(2, 10)
    with pytest.raises(QueueFullError, match="holds 2 inputs"):
        batcher.submit(3, 10)
    batcher.start()
    batcher.close(5)


def test_expired_and_cancelled_inputs_are_not_run() -> None:
    model = Recorder()
    batcher = DynamicBatcher(model, max_batch_size=8, max_wait_s=0, queue_size=8)
    expired = batcher.submit(1, timeout_s=-1)
    cancelled = batcher.submit(2, timeout_s=10)
    assert cancelled.cancel()
    kept = batcher.submit(3, timeout_s=10)
    batcher.start()
    assert kept.result(10) == 30
    with pytest.raises(TimeoutError):
        expired.result(10)
    assert model.batches == [[3]]
    batcher.close(5)


def test_a_failing_batch_fails_its_inputs_and_the_worker_goes_on() -> None:
    model = Recorder()
    batcher = DynamicBatcher(model, max_batch_size=2, max_wait_s=0, queue_size=8)
    bad = [batcher.submit(-1, 10), batcher.submit(5, 10)]
    batcher.start()
    for f in bad:
        with pytest.raises(RuntimeError, match="bad batch"):
            f.result(10)
    assert batcher.submit(7, 10).result(10) == 70
    batcher.close(5)


def test_close_runs_what_is_queued_and_then_refuses() -> None:
    model = Recorder()
    model.gate.clear()
    sizes: list[int] = []
    batcher = DynamicBatcher(model, max_batch_size=1, max_wait_s=0, queue_size=8,
                             on_batch=lambda n, s: sizes.append(n))
    batcher.start()
    futures = [batcher.submit(i, 10) for i in range(3)]
    closer = threading.Thread(target=batcher.close, args=(10,))
    closer.start()
    closer.join(0.2)
    with pytest.raises(ClosedError):
        batcher.submit(9, 10)
    model.gate.set()
    closer.join(10)
    assert _results(futures) == [0, 10, 20] and sizes == [1, 1, 1]
    assert not batcher.accepting
