"""How long each request took: one ASGI middleware for both servers' ``/metrics``.

The job service and the model server each observe every HTTP request by method, route template
(``/v1/jobs/{job_id}``, never the raw path, so that ids do not make a series each) and status,
timed from its arrival to the start of its response: a followed log or an event stream counts
for its set-up, not for the hours it stays open. What the numbers go into is the server's own
(its Prometheus registry); this module imports no metrics library.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Called once per HTTP request with its method, route template, status and seconds.
RequestObserver = Callable[[str, str, int, float], None]


class RequestTiming:
    """ASGI middleware: reports each HTTP request to ``observe`` as its response starts.

    A request whose application fails before it answers is reported as a 500 (what the client
    gets), timed to the failure. Plain ASGI rather than Starlette's ``BaseHTTPMiddleware``,
    which runs every request in a task group of its own with streams between the two (a large
    share of a small request).
    """

    def __init__(self, app: ASGIApp, observe: RequestObserver) -> None:
        self.app = app
        self.observe = observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        answered = False

        async def timed_send(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.start" and not answered:
                answered = True
                self._report(scope, message["status"], start)
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            if not answered:
                self._report(scope, 500, start)

    def _report(self, scope: Scope, status: int, start: float) -> None:
        route = getattr(scope.get("route"), "path", "unmatched")
        self.observe(scope["method"], route, status, time.perf_counter() - start)
