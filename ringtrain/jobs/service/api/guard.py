"""The gate in front of every route: the Host header first, then the token.

A plain ASGI middleware rather than a FastAPI dependency, so that it also covers what no router
declares (``/openapi.json``, ``/docs``, unknown paths) and streams pass through untouched. The
token is compared in constant time.

Programs send ``Authorization: Bearer <token>``. A browser cannot put a header on a page load,
an ``<a href>`` download or an ``EventSource``, so the dashboard (or ``/docs``) is entered once
with ``?token=...`` in its URL, as Jupyter does: the guard answers with a redirect that drops
the token from the URL (and so from the history) and sets an HttpOnly, ``SameSite=Strict``
cookie derived from it, which the browser then sends on its own. Cookies are shared by every
port of a host, so a page of another local port counts as the same site; it could make the
browser send a form with the cookie, but never a custom header without a CORS preflight, which
this server does not answer. A request authenticated by the cookie that changes something must
therefore carry ``X-Ringtrain-Request``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Collection
from http.cookies import SimpleCookie
from urllib.parse import parse_qsl, urlencode

from starlette.types import ASGIApp, Receive, Scope, Send

#: The dashboard's page; its URL with ``?token=`` is what ``ringtrain dashboard`` prints.
DASHBOARD_PATH = "/dashboard"
#: The pages that take the token in their query (and nothing else does: an API URL with the
#: token in it would end up in logs and histories).
SIGN_IN_PAGES = (DASHBOARD_PATH, "/docs")
#: The header a cookie-authenticated request must carry to change anything (see the module).
CSRF_HEADER = b"x-ringtrain-request"
_SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def cookie_name(token: str) -> str:
    """The dashboard cookie's name for one server's token: derived from it so that the servers
    of several homes on one host, whose cookies a browser keeps side by side, never overwrite
    each other's."""
    return "ringtrain_" + hashlib.sha256(token.encode()).hexdigest()[:12]


def cookie_value(token: str) -> str:
    """The dashboard cookie's value: a key derived from the token, not the token itself (the
    cookie also goes to other ports of the host), in hex, so that any token makes a valid
    cookie."""
    return hmac.new(token.encode(), b"ringtrain dashboard cookie", hashlib.sha256).hexdigest()


class RequestGuard:
    """Refuse requests for another Host (403) or without the token (401).

    Args:
        token: the token every request must carry (header, or the dashboard's cookie).
        allowed_hosts: the lowercase ``name:port`` values of the Host header to answer;
            ``None`` answers any (an in-process app, which no browser can reach).
    """

    def __init__(self, app: ASGIApp, token: str, allowed_hosts: Collection[str] | None = None):
        self.app = app
        self.token = token.encode()
        self.expected = b"Bearer " + self.token
        self.cookie = cookie_name(token)
        self.cookie_value = cookie_value(token).encode()
        self.allowed_hosts = None if allowed_hosts is None else frozenset(allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])  # lowercase names; the last of repeated ones
        host = headers.get(b"host", b"").decode("latin-1").lower()
        if self.allowed_hosts is not None and host not in self.allowed_hosts:
            await _refuse(send, 403, f"Host header {host!r} is not a name of this server; "
                                     f"use one of: {', '.join(sorted(self.allowed_hosts))}")
            return
        if hmac.compare_digest(headers.get(b"authorization", b""), self.expected):
            await self.app(scope, receive, send)
            return
        if scope["method"] == "GET" and scope["path"] in SIGN_IN_PAGES:
            query = parse_qsl(scope.get("query_string", b"").decode("latin-1"))
            given = [v for k, v in query if k == "token"]
            if given and hmac.compare_digest(given[-1].encode(), self.token):
                await self._enter(send, scope, [(k, v) for k, v in query if k != "token"])
                return
        if hmac.compare_digest(self._cookie(headers), self.cookie_value):
            if scope["method"] in _SAFE_METHODS or CSRF_HEADER in headers:
                await self.app(scope, receive, send)
                return
            await _refuse(send, 403, "a request authenticated by the dashboard's cookie must "
                                     f"carry the header {CSRF_HEADER.decode()}")
            return
        await _refuse(send, 401, "missing or wrong token: send `Authorization: Bearer "
                                 "<token>` (the CLI does: it reads RINGTRAIN_HOME/token, "
                                 "or takes --token / RINGTRAIN_TOKEN); in a browser, open the "
                                 "URL `ringtrain dashboard` prints (or /docs?token=<token>)",
                      [(b"www-authenticate", b"Bearer")])

    def _cookie(self, headers: dict[bytes, bytes]) -> bytes:
        raw = headers.get(b"cookie")
        if not raw:
            return b""
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(raw.decode("latin-1"))
        except Exception:  # noqa: BLE001 - a malformed Cookie header authenticates nobody
            return b""
        morsel = jar.get(self.cookie)
        return b"" if morsel is None else morsel.value.encode("latin-1", "replace")

    async def _enter(self, send: Send, scope: Scope, query: list[tuple[str, str]]) -> None:
        """Set the cookie and send the browser to the page it asked for, without the token."""
        cookie = f"{self.cookie}={self.cookie_value.decode()}; Path=/; HttpOnly; SameSite=Strict"
        location = scope.get("root_path", "") + scope["path"] + (f"?{urlencode(query)}"
                                                                 if query else "")
        await send({"type": "http.response.start", "status": 303,
                    "headers": [(b"location", location.encode("latin-1")),
                                (b"set-cookie", cookie.encode()),
                                (b"cache-control", b"no-store"),
                                (b"referrer-policy", b"no-referrer"),
                                (b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})


async def _refuse(send: Send, status: int, detail: str,
                  extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"detail": detail, "errors": []}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *(extra or [])]})
    await send({"type": "http.response.body", "body": body})
