"""Handles: the engine's leftover work and the frontend's finish run in the waiting thread."""

from __future__ import annotations

import threading

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


def test_a_blocking_waiter_is_announced_once_the_result_is_not_there():
    blocked = []
    handle = Handle("h")
    handle.on_block(lambda: blocked.append(True))
    threading.Timer(0.05, handle.set_result, args=(3,)).start()
    assert handle.wait(5) == 3
    assert blocked == [True]
    assert handle.wait(5) == 3 and blocked == [True]  # done: nobody blocks any more
