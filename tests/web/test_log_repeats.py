"""Repeated log records: a burst per interval is written, the rest counted on the next one."""

from __future__ import annotations

import io
import logging

import pytest

from ringtrain.web.log_repeats import RepeatFilter, install_repeat_filter
from tests.clock import FakeClock

pytestmark = pytest.mark.fast


def _logger(clock: FakeClock) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RepeatFilter(interval_s=10, burst=2, clock=clock))
    logger = logging.getLogger(f"tests.repeats.{id(out)}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    return logger, out


def test_a_repeated_error_is_written_a_burst_per_interval_then_counted() -> None:
    clock = FakeClock()
    logger, out = _logger(clock)
    for i in range(1000):
        try:
            raise OSError(24, "Too many open files")
        except OSError:
            logger.exception("accept failed on fd %d", i)  # the arguments differ, the kind not
    logger.info("an info line %d", 1)
    logger.info("an info line %d", 2)
    logger.info("an info line %d", 3)  # below WARNING: never cut
    clock.advance(12)
    logger.warning("accept failed on fd %d", 7)  # another kind: no exception
    try:
        raise OSError(24, "Too many open files")
    except OSError:
        logger.exception("accept failed on fd %d", 1000)
    text = out.getvalue()
    assert text.count("Traceback") == 3 and text.count("an info line") == 3
    assert "accept failed on fd 1000 [repeated 998 more times in the last 12 s, not logged]" \
        in text
    assert "accept failed on fd 7\n" in text


def test_installing_twice_gives_each_handler_one_filter() -> None:
    logger = logging.getLogger("tests.repeats.installed")
    handler = logging.StreamHandler(io.StringIO())
    logger.addHandler(handler)
    try:
        install_repeat_filter()
        install_repeat_filter()
        assert sum(isinstance(f, RepeatFilter) for f in handler.filters) == 1
    finally:
        logger.removeHandler(handler)
