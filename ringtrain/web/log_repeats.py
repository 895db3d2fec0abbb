"""Repeated log records written once per interval, with a count of those left out.

A failure that repeats once per connection or per request (asyncio's ``socket.accept() out of
system resource`` with its traceback, uvicorn's ``Invalid HTTP request received.``) wrote 171 MB
of a job service's log in 45 s (issue 35). As the kernel's ``printk_ratelimit`` does, the first
``burst`` records of one kind in an interval are written and the rest counted; the first record
of that kind after the interval carries the count. Records of one kind share their logger,
level, message template and exception type (the arguments may differ), so a repeated error is
cut whatever address or count it names. Levels below WARNING pass untouched.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

#: Kinds remembered before those whose interval is over are forgotten.
_MAX_KINDS = 1024


@dataclass
class _Kind:
    start: float
    written: int = 1
    left_out: int = 0


class RepeatFilter(logging.Filter):
    """A handler's filter: at most ``burst`` records of a kind per ``interval_s`` seconds.

    Args:
        interval_s: The interval.
        burst: Records of a kind written per interval.
        clock: Monotonic seconds (injectable for tests).
    """

    def __init__(self, interval_s: float = 10.0, burst: int = 5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.burst = burst
        self._clock = clock
        self._kinds: dict[tuple[object, ...], _Kind] = {}
        self._lock = threading.Lock()  # handlers call filters outside their own lock

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        template = record.msg if isinstance(record.msg, str) else type(record.msg)
        error = record.exc_info[0] if record.exc_info else None
        key = (record.name, record.levelno, template, error)
        now = self._clock()
        with self._lock:
            kind = self._kinds.get(key)
            if kind is not None and now - kind.start < self.interval_s:
                if kind.written < self.burst:
                    kind.written += 1
                    return True
                kind.left_out += 1
                return False
            if len(self._kinds) >= _MAX_KINDS:
                self._forget(now)
            self._kinds[key] = _Kind(now)
        if kind is not None and kind.left_out:
            record.msg = (f"{record.getMessage()} [repeated {kind.left_out:,} more times in "
                          f"the last {now - kind.start:.0f} s, not logged]")
            record.args = None
        return True

    def _forget(self, now: float) -> None:
        """Drop the kinds whose interval is over (their counts, if any, with them)."""
        self._kinds = {k: v for k, v in self._kinds.items() if now - v.start < self.interval_s}


def install_repeat_filter(interval_s: float = 10.0, burst: int = 5) -> None:
    """Give every handler of the root logger, and of the loggers with handlers of their own
    (uvicorn's), a :class:`RepeatFilter` of its own; handlers that have one keep it. Call it
    where a server starts, after logging is configured (``uvicorn.Config`` configures its
    loggers)."""
    loggers = [logging.getLogger(), *(logger for logger in logging.Logger.manager.loggerDict
                                      .values() if isinstance(logger, logging.Logger))]
    for logger in loggers:
        for handler in logger.handlers:
            if not any(isinstance(f, RepeatFilter) for f in handler.filters):
                handler.addFilter(RepeatFilter(interval_s, burst))
