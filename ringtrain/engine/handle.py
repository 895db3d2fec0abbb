"""Handles: operations in flight, completed by the engine's background thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

#: A waiting thread wakes this often, so that a Python signal handler (Ctrl-C, pytest-timeout's
#: SIGALRM, a job's SIGTERM) runs within a fraction of a second on every platform, however long
#: the operation takes.
WAIT_SLICE_S = 0.2
#: Orders a handle's completion with the making of the event a blocked thread sleeps on.
_EVENTS_LOCK = threading.Lock()


class WaitObserver(Protocol):
    """Told when a thread starts and stops waiting for a handle (the engine: it stops gathering
    once its submitter blocks, and tracks blocked threads for deadlock detection)."""

    def waiting(self, handle: Handle, untimed: bool) -> None:
        """A thread is about to block on ``handle`` (``untimed``: with no timeout)."""

    def done_waiting(self, handle: Handle, untimed: bool) -> None:
        """That thread stopped waiting (the result came, the timeout passed, or a signal
        handler raised)."""


class Handle:
    """An asynchronous operation submitted to the engine.

    The engine calls :meth:`set_result` or :meth:`set_error` exactly once; :meth:`wait` returns
    the result (after the engine's ``then`` work and the optional ``finish`` callback, which the
    frontend uses to post-process the raw result, both in the caller's thread) or raises the
    error.
    """

    __slots__ = ("_done", "_error", "_event", "_finish", "_finished", "_observer", "_result",
                 "_then", "name")

    def __init__(self, name: str, finish: Callable[[Any], Any] | None = None):
        self.name = name
        self._done = False
        # Made by the first thread that must block: most handles are done before anyone waits
        # (a synchronous call's round runs in its caller), and an Event costs a lock and a
        # condition per operation.
        self._event: threading.Event | None = None
        self._result: Any = None
        self._error: BaseException | None = None
        self._then: Callable[[], None] | None = None
        self._finish = finish
        self._finished = False
        self._observer: WaitObserver | None = None

    def done(self) -> bool:
        """Whether the operation has finished (successfully or not)."""
        return self._done

    def _complete(self) -> None:
        self._done = True
        with _EVENTS_LOCK:
            event = self._event
        if event is not None:
            event.set()

    def _blocking_event(self) -> threading.Event:
        """The event a blocking wait sleeps on (set already if the handle is done)."""
        with _EVENTS_LOCK:
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        if self._done:  # completed before the event existed: nobody will set it
            event.set()
        return event

    def observe(self, observer: WaitObserver) -> None:
        """Tell ``observer`` whenever a thread blocks waiting for this handle."""
        self._observer = observer

    def set_result(self, result: Any, then: Callable[[], None] | None = None) -> None:
        """Complete the operation; ``then`` is work on the result left to the waiting thread,
        which has the rank's cores (the engine's thread has no intra-op team: see
        :mod:`ringtrain.engine.intraop`)."""
        self._result = result
        self._then = then
        self._complete()

    def set_error(self, error: BaseException) -> None:
        self._error = error
        self._complete()

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the operation finishes and return its result (waking every
        :data:`WAIT_SLICE_S`, so a signal handler that raises ends the wait promptly).

        Raises:
            TimeoutError: ``timeout`` seconds passed first.
            RuntimeError: the collective failed (mismatch, peer failure, stall shutdown,
                deadlock).
        """
        if not self._done:
            self._block(timeout)
        if self._error is not None:
            raise self._error
        if not self._finished:
            if self._then is not None:
                self._then()
            if self._finish is not None:
                self._result = self._finish(self._result)
            self._finished = True
        return self._result

    def _block(self, timeout: float | None) -> None:
        untimed = timeout is None
        observer = self._observer
        try:
            # inside the try: a signal handler that raises in the observer still ends the wait
            if observer is not None:
                observer.waiting(self, untimed)
            deadline = None if timeout is None else time.monotonic() + timeout
            event = self._blocking_event()
            while True:
                slice_s = WAIT_SLICE_S
                if deadline is not None:
                    slice_s = min(slice_s, deadline - time.monotonic())
                    if slice_s <= 0:
                        if self._done:
                            return
                        raise TimeoutError(
                            f"operation {self.name!r} did not finish within {timeout} s")
                if event.wait(slice_s):
                    return
        finally:
            if observer is not None:
                observer.done_waiting(self, untimed)

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<Handle {self.name!r} {state}>"


class DerivedHandle(Handle):
    """A handle computed from other handles: done when they are, result built by ``finish``."""

    __slots__ = ("_parts",)

    def __init__(self, name: str, parts: list[Handle], finish: Callable[[Any], Any]):
        super().__init__(name, finish)
        self._parts = parts
        self.set_result(None)

    def done(self) -> bool:
        return all(p.done() for p in self._parts)
