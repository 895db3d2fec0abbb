"""How the model server answers what went wrong: a status, a message that names the problem,
and the JSON body every error shares (``{"error", "detail"}``, as :class:`ErrorBody` describes).

Both the FastAPI routes and the lean inference route (:mod:`ringtrain.serve.infer_route`) answer
through here, so a client sees one error format whichever route it called.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from ringtrain.errors import RingtrainError
from ringtrain.serve.batching import ClosedError, QueueFullError
from ringtrain.serve.config import ServeConfig
from ringtrain.serve.predictor import InputError
from ringtrain.web.exposure import bearer_matches

#: Seconds a client refused with 503 is told to wait.
RETRY_AFTER_S = "1"


class HTTPProblem(RingtrainError):
    """A request the server answers with HTTP ``status``, a ``message`` (what was wrong and
    what to do) and extra ``headers`` (``Retry-After``)."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = dict(headers or {})


def error_json(message: str) -> bytes:
    """The body of every error answer."""
    return json.dumps({"error": message, "detail": message}).encode()


def validation_message(errors: Iterable[Mapping[str, Any]]) -> str:
    """Pydantic's validation errors as one line (the first ten)."""
    problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
                         for err in list(errors)[:10])
    return f"invalid request: {problems}"


def check_token(config: ServeConfig, authorization: str) -> None:
    """401 unless the ``Authorization`` header carries the server's token (if it has one)."""
    if config.token and not bearer_matches(authorization, config.token):
        raise HTTPProblem(401, "this server requires `Authorization: Bearer <token>`")


def check_model(config: ServeConfig, name: str) -> None:
    """404 unless ``name`` is the model this server serves."""
    if name != config.model_name:
        raise HTTPProblem(404, f"no model {name!r}; this server serves {config.model_name!r}")


def problem_of(error: Exception, timeout_s: float) -> HTTPProblem:
    """The answer to what :meth:`~ringtrain.serve.batching.DynamicBatcher.run` or a request's
    own checks raised: 400 for bad input, 503 with ``Retry-After`` for a full or draining queue
    and for a request not answered within ``timeout_s`` (a last resort: admission refuses at
    once what it forecasts to end later), 500 if the model failed (that request fails, not the
    server)."""
    if isinstance(error, HTTPProblem):
        return error
    if isinstance(error, InputError):
        return HTTPProblem(400, str(error))
    if isinstance(error, (QueueFullError, ClosedError)):
        return HTTPProblem(503, str(error), {"Retry-After": RETRY_AFTER_S})
    if isinstance(error, TimeoutError):
        return HTTPProblem(503, f"not answered within the {timeout_s:g} s timeout: the server "
                                "is overloaded; try again shortly",
                           {"Retry-After": RETRY_AFTER_S})
    return HTTPProblem(500, f"inference failed: {type(error).__name__}: {error}")
