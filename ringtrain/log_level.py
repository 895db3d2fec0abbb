"""``HOROVOD_LOG_LEVEL`` (``ringtrain run --log-level``): the level names, applied by workers.

Horovod's names are accepted in any case: ``trace``, ``debug``, ``info``, ``warning``, ``error``,
``fatal``. The launcher only checks the name; ``hvd.init()`` applies it to ringtrain's own logger
(:func:`apply_log_level`). Nothing is configured at import time, nor when the variable is unset:
the application's logging set-up then stays in charge alone.
"""

from __future__ import annotations

import logging

from ringtrain.errors import ConfigError

#: Horovod's level names -> the logging levels of ringtrain's logger. ringtrain logs nothing
#: finer than debug, so ``trace`` shows what ``debug`` shows.
LOG_LEVELS: dict[str, int] = {
    "TRACE": logging.DEBUG,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "FATAL": logging.CRITICAL,
}

_LOGGER = "ringtrain"
_FORMAT = "[%(asctime)s %(levelname)s %(name)s] %(message)s"


def is_log_level(name: str) -> bool:
    """Whether ``name`` is one of Horovod's level names (any case)."""
    return name.strip().upper() in LOG_LEVELS


def apply_log_level(name: str | None) -> None:
    """Set the level of the ``ringtrain`` logger (and of nothing else) from ``HOROVOD_LOG_LEVEL``.

    Horovod's workers log to stderr; so that the level shows in a script that configured no
    logging, a stderr handler is added to the ``ringtrain`` logger when no handler would receive
    its records (none on it or its ancestors). A script that set up logging before ``init()``
    gets ringtrain's records through its own handlers instead, once, at the level asked for.
    ``name`` ``None`` (the variable unset) leaves logging untouched.

    Raises:
        ConfigError: ``name`` is not one of the level names.
    """
    if name is None:
        return
    if not is_log_level(name):
        raise ConfigError(f"environment variable HOROVOD_LOG_LEVEL={name!r} is not a level: use "
                          f"one of {', '.join(LOG_LEVELS)} (any case), or leave it unset")
    logger = logging.getLogger(_LOGGER)
    logger.setLevel(LOG_LEVELS[name.strip().upper()])
    if not logger.hasHandlers():
        handler = logging.StreamHandler()  # stderr, looked up when each record is written
        handler.setFormatter(logging.Formatter(_FORMAT))
        logger.addHandler(handler)
