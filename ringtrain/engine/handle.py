"""Handles: operations in flight, completed by the engine's background thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Handle:
    """An asynchronous operation submitted to the engine.

    The engine calls :meth:`set_result` or :meth:`set_error` exactly once; :meth:`wait` returns
    the result (after the engine's ``then`` work and the optional ``finish`` callback, which the
    frontend uses to post-process the raw result, both in the caller's thread) or raises the
    error.
    """

    __slots__ = ("name", "_event", "_result", "_error", "_then", "_finish", "_finished",
                 "_on_block")

    def __init__(self, name: str, finish: Callable[[Any], Any] | None = None):
        self.name = name
        self._event = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None
        self._then: Callable[[], None] | None = None
        self._finish = finish
        self._finished = False
        self._on_block: Callable[[], None] | None = None

    def done(self) -> bool:
        """Whether the operation has finished (successfully or not)."""
        return self._event.is_set()

    def on_block(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when a thread is about to block waiting for this handle."""
        self._on_block = callback

    def set_result(self, result: Any, then: Callable[[], None] | None = None) -> None:
        """Complete the operation; ``then`` is work on the result left to the waiting thread.

        Why leave work: tensor kernels run on the engine's thread without an intra-op team (see
        :mod:`ringtrain.engine.intraop`); the thread that synchronizes has the rank's cores.
        """
        self._result = result
        self._then = then
        self._event.set()

    def set_error(self, error: BaseException) -> None:
        self._error = error
        self._event.set()

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the operation finishes and return its result.

        Raises:
            TimeoutError: ``timeout`` seconds passed first.
            RuntimeError: the collective failed (mismatch, peer failure, stall shutdown).
        """
        if not self._event.is_set() and self._on_block is not None:
            self._on_block()
        if not self._event.wait(timeout):
            raise TimeoutError(f"operation {self.name!r} did not finish within {timeout} s")
        if self._error is not None:
            raise self._error
        if not self._finished:
            if self._then is not None:
                self._then()
            if self._finish is not None:
                self._result = self._finish(self._result)
            self._finished = True
        return self._result

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
