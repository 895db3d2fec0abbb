"""The error hierarchy shared by every part of ringtrain.

Every error ringtrain raises on purpose derives from :class:`RingtrainError`, so callers can
catch "anything ringtrain refused" in one clause. Bad user input is a ``ValueError`` subclass;
failures of a collective are ``RuntimeError`` subclasses, as Horovod scripts expect.
"""

from __future__ import annotations


class RingtrainError(Exception):
    """Base class of every error ringtrain raises deliberately."""


class HorovodInternalError(RingtrainError, RuntimeError):
    """A collective failed because a peer failed or the engine stopped.

    Named as in Horovod so that elastic training code that catches it keeps working.
    """


class UnsupportedOperationError(HorovodInternalError, ValueError):
    """A collective was asked for something it cannot do, e.g. a reducescatter with Adasum.

    Horovod's core refuses these with ``HorovodInternalError``; it is also a ``ValueError``,
    since the input is what is wrong, and elastic training does not retry it.
    """


class TensorMismatchError(RingtrainError, RuntimeError):
    """Ranks submitted the same tensor name with disagreeing shape, dtype, device or root."""


class DeadlockError(RingtrainError, RuntimeError):
    """Every rank an operation waits for is itself blocked waiting for another operation, so
    none of them can ever complete (the ranks' programs diverged).

    Not a ``HorovodInternalError``: no peer failed and the engine goes on (the next collective
    works), and elastic training must not take it for a lost host and retry the same code path.
    """


class StallError(HorovodInternalError):
    """Some ranks waited past the stall shutdown time for tensors other ranks never submitted."""


class ConfigError(RingtrainError, ValueError):
    """A setting (flag, YAML key, environment variable) has a value that cannot be used."""
