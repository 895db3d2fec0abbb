"""The gate in front of every route: the Host header first, then the bearer token.

A plain ASGI middleware rather than a FastAPI dependency, so that it also covers what no router
declares (``/openapi.json``, ``/docs``, unknown paths) and streams pass through untouched. The
token is compared in constant time.

A browser cannot send a bearer header, so, as Jupyter does, a ``GET`` with ``?token=TOKEN``
(the link ``ringtrain server start`` prints) is answered with a redirect to the same page
without it, setting an ``HttpOnly``, ``SameSite=Strict`` cookie that holds the token. The cookie
is accepted for reading only (``GET``/``HEAD``): what changes state still needs the header.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Any
from urllib.parse import parse_qsl, urlencode

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

COOKIE = "ringtrain_token"
_READS = ("GET", "HEAD")


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
        self.token = token.encode()
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
        if hmac.compare_digest(headers.get(b"authorization", b""), self.expected):
            await self.app(scope, receive, send)
            return
        if scope["method"] in _READS:
            query = parse_qsl(scope.get("query_string", b"").decode("latin-1"))
            given = [v for k, v in query if k == "token"]
            if given and hmac.compare_digest(given[-1].encode(), self.token):
                await _set_cookie_and_return(send, scope, [(k, v) for k, v in query
                                                           if k != "token"], self.token)
                return
            if hmac.compare_digest(_cookie(headers.get(b"cookie", b"")), self.token):
                await self.app(scope, receive, send)
                return
        await _refuse(send, 401, "missing or wrong token: send `Authorization: Bearer "
                                 "<token>` (the CLI does: it reads RINGTRAIN_HOME/token, "
                                 "or takes --token / RINGTRAIN_TOKEN; a browser: open "
                                 "/docs?token=<token> once)",
                      [(b"www-authenticate", b"Bearer")])


def _cookie(header: bytes) -> bytes:
    """The value of the token cookie in a ``Cookie`` header (``b""``: none)."""
    for part in header.split(b";"):
        name, _, value = part.strip().partition(b"=")
        if name == COOKIE.encode():
            return value
    return b""


async def _set_cookie_and_return(send: Send, scope: Scope, query: list[tuple[str, str]],
                                 token: bytes) -> None:
    """Redirect to the page asked for, without the token in its URL, setting the cookie."""
    location = scope.get("root_path", "") + scope["path"] + (f"?{urlencode(query)}" if query
                                                             else "")
    cookie = COOKIE.encode() + b"=" + token + b"; Path=/; HttpOnly; SameSite=Strict"
    await send({"type": "http.response.start", "status": 303,
                "headers": [(b"location", location.encode("latin-1")),
                            (b"set-cookie", cookie), (b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})


async def _refuse(send: Send, status: int, detail: str,
                  extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"detail": detail, "errors": []}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *(extra or [])]})
    await send({"type": "http.response.body", "body": body})
