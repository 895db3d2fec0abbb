"""The gate in front of every route: the Host header first, then the bearer token.

A plain ASGI middleware rather than a FastAPI dependency, so that it also covers what no router
declares (``/openapi.json``, ``/docs``, unknown paths) and streams pass through untouched. The
token is compared in constant time.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class RequestGuard:
    """Refuse requests for another Host (400) or without the token (401).

    Args:
        app: the application behind the gate.
        token: the bearer token every request must carry.
        allowed_hosts: the lowercase ``name:port`` values of the Host header to answer;
            ``None`` answers any (an in-process app, which no browser can reach).
    """

    def __init__(self, app: ASGIApp, token: str, allowed_hosts: Collection[str] | None = None):
        self.app = app
        self.expected = f"Bearer {token}".encode()
        self.allowed_hosts = None if allowed_hosts is None else frozenset(allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])  # lowercase names; the last of repeated ones
        host = headers.get(b"host", b"").decode("latin-1").lower()
        if self.allowed_hosts is not None and host not in self.allowed_hosts:
            await _refuse(send, 400, f"Host header {host!r} is not a name of this server; "
                                     f"use one of: {', '.join(sorted(self.allowed_hosts))}")
            return
        if not hmac.compare_digest(headers.get(b"authorization", b""), self.expected):
            await _refuse(send, 401, "missing or wrong token: send `Authorization: Bearer "
                                     "<token>` (the CLI does: it reads RINGTRAIN_HOME/token, "
                                     "or takes --token / RINGTRAIN_TOKEN)",
                          [(b"www-authenticate", b"Bearer")])
            return
        await self.app(scope, receive, send)


async def _refuse(send: Send, status: int, detail: str,
                  extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"detail": detail, "errors": []}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *(extra or [])]})
    await send({"type": "http.response.body", "body": body})
