"""Refusing requests that reach a server over plain HTTP from another machine.

A bearer token sent over plain HTTP crosses the network in the clear: anyone on the path reads
it, and with it may start processes as the service's user. The server cannot stop a client from
sending it, but it can refuse to act on it, so that such a set-up fails at once and says why
rather than working until someone else uses the token too. A request counts as local when its
peer is a loopback address, or the very address it connected to (a client of this host that
dialled the host's own network address: the kernel carries that over loopback, and drops packets
from elsewhere that claim a local source address). Over HTTPS, or for local peers, the request
goes on to the app untouched.

A plain ASGI middleware placed before the token check, so that a token that came in the clear is
never even compared.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send

from ringtrain.web.exposure import is_loopback

#: The headers that carry a credential (the token, or a cookie derived from it).
_CREDENTIAL_HEADERS = (b"authorization", b"cookie")


class PlainHttpGuard:
    """Answer 403 to every request from another machine over plain HTTP, saying why.

    Args:
        remedy: what the server's owner does about it (``"start the server with --tls"``).
    """

    def __init__(self, app: ASGIApp, remedy: str):
        self.app = app
        self.remedy = remedy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("scheme") in ("https", "wss") \
                or _from_this_host(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        headers = dict(scope["headers"])
        carried = any(h in headers for h in _CREDENTIAL_HEADERS) \
            or b"token=" in scope.get("query_string", b"")
        why = ("this request came from another machine over plain HTTP, so the token it carries "
               "crossed the network in the clear (anyone on the way can read it); it was not "
               "accepted, and you should treat it as seen" if carried else
               "this server takes requests from other machines over HTTPS only: over plain HTTP "
               "the token they carry would cross the network in the clear")
        body = json.dumps({"detail": f"refused: {why}. Serve over HTTPS: {self.remedy}",
                           "errors": []}).encode()
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def _from_this_host(scope: Scope) -> bool:
    client, server = scope.get("client"), scope.get("server")
    if not client:  # a Unix socket, or an in-process call: no network in between
        return True
    return is_loopback(client[0]) or (server is not None and client[0] == server[0])
