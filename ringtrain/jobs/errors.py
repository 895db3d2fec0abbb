"""Errors of the job service; each maps to one HTTP status and one CLI exit code."""

from __future__ import annotations

import reprlib

from ringtrain.errors import RingtrainError


class JobsError(RingtrainError):
    """Base of the job service's errors. ``http_status`` is what the REST API answers with."""

    http_status = 500


class NotFoundError(JobsError, LookupError):
    """No cluster or job has the given name or id."""

    http_status = 404


class ConflictError(JobsError, RuntimeError):
    """The operation does not fit the current state (a name taken, a job still running...)."""

    http_status = 409


class InvalidTransitionError(ConflictError):
    """A job or node was asked to move to a state its transition table does not allow."""


class InvalidRequestError(JobsError, ValueError):
    """A request is malformed: a path outside the job folder, a rank out of range..."""

    http_status = 400


class SpecError(JobsError, ValueError):
    """A job or cluster spec failed validation.

    Args:
        errors: one ``{"field": ..., "message": ...}`` per bad field.
        source: where the spec came from (a file name), for the message.
    """

    http_status = 422

    def __init__(self, errors: list[dict[str, str]], source: str = "job spec"):
        self.errors = errors
        self.source = source
        lines = [f"invalid {source}:"] + [f"  {e['field']}: {e['message']}" for e in errors]
        super().__init__("\n".join(lines))


class ServiceUnavailableError(JobsError, ConnectionError):
    """The job service could not be reached or started."""

    http_status = 503


class BusyError(JobsError):
    """The service runs as much of this kind of work as it takes; ask again later."""

    http_status = 503

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        #: seconds the client should wait (the ``Retry-After`` header)
        self.retry_after_s = retry_after_s


class DiskFullError(JobsError):
    """A write the service could not make, or refused, because a disk it writes to is full (or
    below the free space new jobs need); the message names the disk's path and its free space.
    As in PostgreSQL, nothing of the write is kept and the service goes on: the same request
    succeeds once space is freed (:mod:`ringtrain.jobs.disk_space`)."""

    http_status = 507  # Insufficient Storage (RFC 4918)


class AuthError(JobsError, PermissionError):
    """A request lacked a valid token: none, a wrong one, or a scoped one that was revoked or
    has expired (the message says which)."""

    http_status = 401


class ForbiddenError(JobsError, PermissionError):
    """The caller's token is valid but its scope does not allow the request (the message names
    the scope and what it allows)."""

    http_status = 403


class CertificateError(JobsError):
    """An https server's certificate is not one this client trusts: not the pinned one (the
    message names both fingerprints), or, without a pin, none that a CA vouches for."""


class RecordError(JobsError, ValueError):
    """A record that one ringtrain process left for another (a launch or status file,
    ``server.json``, a stored launch handle) is missing, unreadable or lacks a field it needs."""


_BRIEF = reprlib.Repr()  # bounded while it is built: a million items cost no more than eight
_BRIEF.maxstring = _BRIEF.maxother = 200
_BRIEF.maxlist = _BRIEF.maxtuple = _BRIEF.maxdict = _BRIEF.maxset = 8
_BRIEF.maxlevel = 3


def brief(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to about ``limit`` characters, for echoing user input in messages."""
    text = _BRIEF.repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}..." + (f" ({len(value)} characters)" if isinstance(value, str) else "")
