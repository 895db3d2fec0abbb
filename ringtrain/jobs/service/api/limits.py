"""The job service's bound on request bodies (see :mod:`ringtrain.web.body_limit`).

Bodies are small (the largest is a job spec, itself bounded by ``MAX_SPEC_BYTES``).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from ringtrain.jobs.models.schemas import API_PREFIX
from ringtrain.jobs.models.spec import MAX_SPEC_BYTES
from ringtrain.web import body_limit

# A spec's JSON is a little larger than its YAML (escapes), and the body wraps it.
MAX_BODY_BYTES = 2 * MAX_SPEC_BYTES


class BodyLimit(body_limit.BodyLimit):
    """413 for a body over ``max_bytes`` (default :data:`MAX_BODY_BYTES`)."""

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        super().__init__(app, max_bytes, hint="a job spec names files, it does not hold them")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # An upload's body is streamed to disk and bounded by the upload's own limit.
        if (scope["type"] == "http" and scope["method"] == "PUT"
                and scope["path"].startswith(API_PREFIX + "/uploads/")):
            await self.app(scope, receive, send)
            return
        await super().__call__(scope, receive, send)
