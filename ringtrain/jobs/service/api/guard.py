"""The gate in front of every route: the Host header first, then the token.

A plain ASGI middleware rather than a FastAPI dependency, so that it also covers what no router
declares (``/openapi.json``, ``/docs``, unknown paths) and streams pass through untouched. The
admin token is compared in constant time; a scoped token is recognised by its record
(:mod:`ringtrain.jobs.service.tokens`), which a revoke changes at once. The caller it finds goes
into the request's scope (:mod:`ringtrain.jobs.service.api.caller`), for the scope check
(:mod:`ringtrain.jobs.service.api.scope_guard`) and the routes.

Programs send ``Authorization: Bearer <token>`` (the scheme's name in any case). A browser
cannot put a header on a page load, an ``<a href>`` download or an ``EventSource``, so the
dashboard (or ``/docs``) is entered once with ``?token=...`` in its URL, as Jupyter does: the
guard answers with a redirect that drops the token from the URL (and so from the history) and
sets an HttpOnly, ``SameSite=Strict`` cookie derived from it, which the browser then sends on
its own. A browser the CLI starts gets a single-use code instead (``/dashboard/login?code=...``,
:mod:`.login_codes`): a command line is readable by every local account, a used or expired code
is worth nothing.

Cookies are shared by every port of a host, so a page of another local port counts as the same
site; it could make the browser send a form with the cookie, but never a custom header without a
CORS preflight, which this server does not answer. A request authenticated by the cookie that
changes something must therefore carry ``X-Ringtrain-Request``.

A scoped token signs in the same way; its cookie is its id with a MAC keyed by the admin token,
which only this server can make, and its record is read again on each request (a revoked token's
cookie stops working at once). The cookie's name is the server's, whichever token signed in, so
signing in with another token replaces the browser's identity rather than adding one.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Collection
from http.cookies import SimpleCookie
from urllib.parse import parse_qsl, urlencode

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from ringtrain.jobs.errors import AuthError
from ringtrain.jobs.models.tokens import TOKEN_PREFIX
from ringtrain.jobs.service.api.caller import ADMIN, CALLER_KEY, Caller
from ringtrain.jobs.service.api.login_codes import LOGIN_CODE_TTL_S, LoginCodes
from ringtrain.jobs.service.tokens import Tokens
from ringtrain.web.exposure import bearer_credentials

#: The dashboard's page; its URL with ``?token=`` is what ``ringtrain dashboard`` prints.
DASHBOARD_PATH = "/dashboard"
#: Where a single-use login code signs a browser in (``?code=``), to the dashboard.
LOGIN_PATH = DASHBOARD_PATH + "/login"
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


def scoped_cookie_value(server_token: str, token_id: str) -> str:
    """The dashboard cookie's value for a scoped token: its id and a MAC of it keyed by the
    server's (admin) token, so that only this server can make one and the token's text is not
    needed to check it (the service keeps only its hash)."""
    mac = hmac.new(server_token.encode(), b"ringtrain scoped cookie " + token_id.encode(),
                   hashlib.sha256).hexdigest()
    return f"{token_id}.{mac}"


_WWW_AUTHENTICATE = [(b"www-authenticate", b"Bearer")]
_NO_TOKEN = ("missing or wrong token: send `Authorization: Bearer <token>` (the CLI does: it "
             "reads RINGTRAIN_HOME/token, or takes --token / RINGTRAIN_TOKEN); in a browser, open "
             "the URL `ringtrain dashboard` prints (or /docs?token=<token>)")
# A page, not JSON: a person followed the link. Static text, nothing of the request in it.
_STALE_CODE_PAGE = (
    "<!doctype html><html><head><meta charset=\"utf-8\"><title>ringtrain: sign-in link not "
    "valid</title></head><body><h1>This sign-in link is no longer valid</h1><p>It was already "
    f"used, or it is more than {LOGIN_CODE_TTL_S:.0f} seconds old: a link opened by "
    "<code>ringtrain dashboard --open</code> works once, within a minute.</p><p>Run "
    "<code>ringtrain dashboard --open</code> again, or open the URL that "
    "<code>ringtrain dashboard</code> prints.</p></body></html>").encode()


class RequestGuard:
    """Refuse requests for another Host (403) or without a valid token (401), and leave the
    caller in the request's scope for the rest.

    Args:
        token: the admin token (header, or the dashboard's cookie); it also keys the scoped
            tokens' cookies.
        allowed_hosts: the lowercase ``name:port`` values of the Host header to answer;
            ``None`` answers any (an in-process app, which no browser can reach).
        tokens: the scoped tokens accepted besides; ``None``: the admin token only.
        login_codes: the codes ``/dashboard/login`` redeems; ``None``: that page is refused.
    """

    def __init__(self, app: ASGIApp, token: str, allowed_hosts: Collection[str] | None = None,
                 tokens: Tokens | None = None, login_codes: LoginCodes | None = None):
        self.app = app
        self.token = token
        self.cookie = cookie_name(token)
        self.cookie_value = cookie_value(token).encode()
        self.allowed_hosts = None if allowed_hosts is None else frozenset(allowed_hosts)
        self.tokens = tokens
        self.login_codes = login_codes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])  # lowercase names; the last of repeated ones
        host = headers.get(b"host", b"").decode("latin-1").lower()
        if self.allowed_hosts is not None and host not in self.allowed_hosts:
            await refuse(send, 403, f"Host header {host!r} is not a name of this server; "
                                    f"use one of: {', '.join(sorted(self.allowed_hosts))}")
            return
        if scope["method"] == "GET" and scope["path"] == LOGIN_PATH:
            await self._login(send, scope)
            return
        try:
            caller = await self._bearer(headers.get(b"authorization", b""))
            if caller is None and scope["method"] == "GET" and scope["path"] in SIGN_IN_PAGES:
                query = parse_qsl(scope.get("query_string", b"").decode("latin-1"))
                given = [v for k, v in query if k == "token"]
                value = await self._sign_in(given[-1]) if given else None
                if value is not None:
                    rest = [(k, v) for k, v in query if k != "token"]
                    await self._enter(send, scope, value, scope["path"] + (
                        f"?{urlencode(rest)}" if rest else ""))
                    return
            by_cookie = caller is None
            if caller is None:
                caller = await self._from_cookie(headers)
        except AuthError as e:  # a scoped token, revoked or expired: say so
            await refuse(send, 401, str(e), _WWW_AUTHENTICATE)
            return
        if caller is None:
            await refuse(send, 401, _NO_TOKEN, _WWW_AUTHENTICATE)
            return
        if by_cookie and scope["method"] not in _SAFE_METHODS and CSRF_HEADER not in headers:
            await refuse(send, 403, "a request authenticated by the dashboard's cookie must "
                                    f"carry the header {CSRF_HEADER.decode()}")
            return
        scope[CALLER_KEY] = caller
        await self.app(scope, receive, send)

    async def _bearer(self, header: bytes) -> Caller | None:
        """The caller an ``Authorization`` header proves, or ``None``.

        Raises:
            AuthError: a scoped token, revoked or expired.
        """
        given = bearer_credentials(header)
        if given is None:
            return None
        if hmac.compare_digest(given, self.token.encode()):
            return ADMIN
        if self.tokens is None or not given.startswith(TOKEN_PREFIX.encode()):
            return None
        # The store is read (and "last used" written) in a worker thread: never on the loop.
        info = await run_in_threadpool(self.tokens.authenticate, given.decode("latin-1"))
        return None if info is None else Caller(info)

    async def _sign_in(self, given: str) -> str | None:
        """The cookie value for a token given in a sign-in page's query, or ``None``."""
        if hmac.compare_digest(given.encode(), self.token.encode()):
            return self.cookie_value.decode()
        if self.tokens is None or not given.startswith(TOKEN_PREFIX):
            return None
        info = await run_in_threadpool(self.tokens.authenticate, given)
        return None if info is None else scoped_cookie_value(self.token, info.id)

    async def _from_cookie(self, headers: dict[bytes, bytes]) -> Caller | None:
        value = self._cookie(headers)
        if hmac.compare_digest(value, self.cookie_value):
            return ADMIN
        token_id, dot, _ = value.partition(b".")
        if self.tokens is None or not dot:
            return None
        expected = scoped_cookie_value(self.token, token_id.decode("latin-1")).encode()
        if not hmac.compare_digest(value, expected):
            return None
        info = await run_in_threadpool(self.tokens.active, token_id.decode("latin-1"))
        return None if info is None else Caller(info)

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

    async def _login(self, send: Send, scope: Scope) -> None:
        """Redeem a login code: the caller's cookie and the dashboard, or a page that says
        the link is used up (it is never worth a second try, so no 401 challenge)."""
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"))
        given = [v for k, v in query if k == "code"]
        grant = None
        if given and self.login_codes is not None:
            grant = self.login_codes.redeem(given[-1])
        if grant is None:
            await send({"type": "http.response.start", "status": 403, "headers": [
                (b"content-type", b"text/html; charset=utf-8"),
                (b"content-length", str(len(_STALE_CODE_PAGE)).encode()),
                (b"cache-control", b"no-store"), (b"referrer-policy", b"no-referrer"),
                (b"content-security-policy", b"default-src 'none'")]})
            await send({"type": "http.response.body", "body": _STALE_CODE_PAGE})
            return
        value = (self.cookie_value.decode() if grant.token_id is None
                 else scoped_cookie_value(self.token, grant.token_id))
        await self._enter(send, scope, value, DASHBOARD_PATH)

    async def _enter(self, send: Send, scope: Scope, value: str, path: str) -> None:
        """Set the cookie and send the browser to ``path`` (with its query): the page it asked
        for, without the token or code."""
        cookie = f"{self.cookie}={value}; Path=/; HttpOnly; SameSite=Strict"
        if scope.get("scheme") == "https":  # never sent back over plain HTTP
            cookie += "; Secure"
        location = scope.get("root_path", "") + path
        await send({"type": "http.response.start", "status": 303,
                    "headers": [(b"location", location.encode("latin-1")),
                                (b"set-cookie", cookie.encode()),
                                (b"cache-control", b"no-store"),
                                (b"referrer-policy", b"no-referrer"),
                                (b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})


async def refuse(send: Send, status: int, detail: str,
                 extra: list[tuple[bytes, bytes]] | None = None) -> None:
    """Answer ``status`` with the API's error body, ``{"detail", "errors"}``."""
    body = json.dumps({"detail": detail, "errors": []}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *(extra or [])]})
    await send({"type": "http.response.body", "body": body})
