"""A bound on request bodies, enforced before anything parses them.

FastAPI decodes and validates a body on the event loop, so one huge body would stall every other
request, health checks included. A larger body than the server takes is answered 413 without
being read to its end.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyLimit:
    """ASGI middleware: 413 for a body over ``max_bytes``, declared or streamed (chunked).

    The body (at most ``max_bytes``) is read before the app runs and handed to it as it came;
    later ``receive`` calls (a streaming response waiting for a disconnect) go to the server.
    ``hint`` is what the refusal adds after the limit (what a body should hold instead).
    """

    def __init__(self, app: ASGIApp, max_bytes: int, hint: str = "") -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.hint = hint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await self._refuse(send)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send) -> None:
        mib = self.max_bytes / (1 << 20)
        limit = f"{mib:g} MiB" if mib >= 1 else f"{self.max_bytes} bytes"
        detail = f"request body larger than {limit}" + (f"; {self.hint}" if self.hint else "")
        body = json.dumps({"detail": detail,
                           "errors": [{"field": "(body)", "message": f"at most {limit}"}]}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
