"""Handles: the engine's leftover work and the frontend's finish run in the waiting thread."""

from __future__ import annotations

import signal
import threading

import pytest

from ringtrain.engine.handle import Handle


def test_then_runs_once_in_the_waiting_thread_before_finish():
    calls = []
    handle = Handle("h", finish=lambda result: calls.append(("finish", result)) or result + 1)
    handle.set_result(1, then=lambda: calls.append(("then", threading.current_thread().name)))
    assert calls == []  # nothing ran in the completing thread

    results = []
    waiter = threading.Thread(target=lambda: results.append(handle.wait(5)), name="waiter")
    waiter.start()
    waiter.join(5)
    assert results == [2]
    assert handle.wait(5) == 2
    assert calls == [("then", "waiter"), ("finish", 1)]


class _Observer:
    def __init__(self):
        self.calls = []

    def waiting(self, handle, untimed):
        self.calls.append(("waiting", handle.name, untimed))

    def done_waiting(self, handle, untimed):
        self.calls.append(("done", handle.name, untimed))


def test_a_blocking_waiter_is_announced_once_the_result_is_not_there():
    observer = _Observer()
    handle = Handle("h")
    handle.observe(observer)
    threading.Timer(0.05, handle.set_result, args=(3,)).start()
    assert handle.wait(5) == 3
    assert observer.calls == [("waiting", "h", False), ("done", "h", False)]
    assert handle.wait(5) == 3 and len(observer.calls) == 2  # done: nobody blocks any more

    untimed = Handle("u")
    untimed.observe(observer)
    threading.Timer(0.05, untimed.set_error, args=(RuntimeError("failed"),)).start()
    with pytest.raises(RuntimeError, match="failed"):
        untimed.wait()
    assert observer.calls[2:] == [("waiting", "u", True), ("done", "u", True)]


def test_a_wait_that_times_out_says_so_and_stops_waiting():
    observer = _Observer()
    handle = Handle("slow")
    handle.observe(observer)
    with pytest.raises(TimeoutError, match="'slow' did not finish within 0.3 s"):
        handle.wait(0.3)
    assert observer.calls == [("waiting", "slow", False), ("done", "slow", False)]


def test_a_signal_handler_that_raises_ends_an_untimed_wait():
    # The wait wakes in slices, so the handler runs even if lock waits were not interruptible.
    observer = _Observer()
    handle = Handle("never")
    handle.observe(observer)

    class Interrupted(Exception):
        pass

    def handler(signum, frame):
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        with pytest.raises(Interrupted):
            handle.wait()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert observer.calls == [("waiting", "never", True), ("done", "never", True)]
