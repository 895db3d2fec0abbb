"""One URL for a deployment's replicas: a small round-robin HTTP front with health checks.

The job service runs one on its own port for each deployment of several replicas
(:mod:`ringtrain.jobs.service.deployment_fronts`); ``ringtrain deployment front ID`` runs one
in the foreground wherever the CLI runs. Each request goes to the next replica that answered its
last health check (``GET /v2/health/ready``, every ``health_every_s``): one that fails a check is
taken out, and put back when it passes one again. A replica that fails a request (refuses the
connection, or drops it: it died with the request in flight) is taken out at once and the request
goes to the next one: every route of ``ringtrain serve`` is idempotent (inference changes
nothing), so sending it again is safe, as a client retrying it would. A replica that is only slow
(a timeout) is not tried again: the request may still be running there. The replicas' URLs are
read again every ``refresh_s``, so replicas that moved (a restarted deployment) or that stopped
serving (their keeper restarts them) are followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ringtrain.jobs.errors import JobsError

log = logging.getLogger(__name__)

HEALTH_PATH = "/v2/health/ready"
#: Hop-by-hop headers (RFC 9110 7.6.1) and those the proxy sets itself.
_DROPPED = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
            "trailer", "transfer-encoding", "upgrade", "host", "content-length"}


class Backends:
    """The replicas' URLs, which of them are healthy, and whose turn is next (thread-safe)."""

    def __init__(self, urls: Sequence[str] = ()) -> None:
        self._lock = threading.Lock()
        self._urls: list[str] = []
        self._healthy: set[str] = set()
        self._turn = 0
        self.set_urls(urls)

    def set_urls(self, urls: Sequence[str]) -> None:
        """Replace the replicas (new ones count as healthy until a check says otherwise)."""
        with self._lock:
            new = [u.rstrip("/") for u in urls]
            self._healthy = {u for u in new if u in self._healthy or u not in self._urls}
            self._urls = new

    def urls(self) -> list[str]:
        """Every replica, healthy or not."""
        with self._lock:
            return list(self._urls)

    def out_urls(self) -> list[str]:
        """The replicas taken out of the turns: they failed their last check or a request."""
        with self._lock:
            return [u for u in self._urls if u not in self._healthy]

    def mark(self, url: str, healthy: bool) -> None:
        """Record a health check's or a request's outcome for ``url``."""
        with self._lock:
            if healthy and url in self._urls:
                self._healthy.add(url)
            else:
                self._healthy.discard(url)

    def pick(self, exclude: set[str]) -> str | None:
        """The next healthy replica not in ``exclude`` (``None``: there is none)."""
        with self._lock:
            for _ in range(len(self._urls)):
                url = self._urls[self._turn % len(self._urls)]
                self._turn += 1
                if url in self._healthy and url not in exclude:
                    return url
            return None


def create_front(backends: Backends, *, refresh: Callable[[], Sequence[str]] | None = None,
                 health_every_s: float = 2.0, refresh_s: float = 5.0,
                 timeout_s: float = 120.0) -> Starlette:
    """The front's ASGI app.

    Args:
        refresh: Returns the replicas' URLs now (called in a thread every ``refresh_s``);
            ``None``: they do not change.
        health_every_s: Seconds between two health checks of every replica.
        refresh_s: Seconds between two calls of ``refresh``.
        timeout_s: The most a request may take at a replica.
    """
    state: dict[str, httpx.AsyncClient] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            state["client"] = client
            task = asyncio.create_task(_watch(backends, client, refresh, health_every_s,
                                              refresh_s))
            try:
                yield
            finally:
                task.cancel()

    refreshed = {"at": float("-inf")}

    async def proxy(request: Request) -> Response:
        # A front started before its replicas listened knows none: read them at once rather
        # than answer 503 until the next refresh (at most once a second, however many ask).
        now = asyncio.get_running_loop().time()
        if refresh is not None and not backends.urls() and now - refreshed["at"] >= 1.0:
            refreshed["at"] = now
            await _read_replicas(backends, refresh)
        return await _proxy(request, backends, state["client"])

    methods = ["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"]
    return Starlette(routes=[Route("/{path:path}", proxy, methods=methods)], lifespan=lifespan)


async def _read_replicas(backends: Backends, refresh: Callable[[], Sequence[str]]) -> None:
    """Give ``backends`` the replicas ``refresh`` reads now (in a thread: it reads the store);
    if the service cannot say, keep those known and go on."""
    try:
        backends.set_urls(await asyncio.to_thread(refresh))
    except (JobsError, httpx.HTTPError, OSError) as e:
        log.warning("front: could not read the replicas: %s", e)


async def _watch(backends: Backends, client: httpx.AsyncClient,
                 refresh: Callable[[], Sequence[str]] | None, health_every_s: float,
                 refresh_s: float) -> None:
    """Check every replica's health every ``health_every_s``, and read the replicas again
    every ``refresh_s``, until cancelled."""
    loop = asyncio.get_running_loop()
    last_refresh = loop.time()
    while True:
        try:
            for url in backends.urls():
                try:
                    ok = (await client.get(url + HEALTH_PATH, timeout=2.0)).status_code == 200
                except httpx.HTTPError:
                    ok = False
                backends.mark(url, ok)
            if refresh is not None and loop.time() - last_refresh >= refresh_s:
                last_refresh = loop.time()
                await _read_replicas(backends, refresh)
        except Exception:  # a task that died would leave the replicas unchecked, silently
            log.exception("front: a round of health checks failed; the next one follows")
        await asyncio.sleep(health_every_s)


#: How a replica fails a request when it is down: not listening, or gone mid-request (the
#: connection reset, or closed without an answer). Not a timeout, where it may be working on it.
_REPLICA_DOWN = (httpx.NetworkError, httpx.RemoteProtocolError, httpx.ConnectTimeout)


def _last_resort(backends: Backends, tried: set[str]) -> str | None:
    """With no healthy replica left to try, one taken out and not tried yet, as nginx tries its
    servers marked down when all are: a replica out since its last check (taken out while it
    started, or restarted since) may serve again, and a refused connection costs little."""
    return next((u for u in backends.out_urls() if u not in tried), None)


async def _proxy(request: Request, backends: Backends, client: httpx.AsyncClient) -> Response:
    """Send ``request`` to the next healthy replica (the one after, if that one is down: see
    the module's docstring)."""
    body = await request.body()
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROPPED}
    tried: set[str] = set()
    while (url := backends.pick(tried) or _last_resort(backends, tried)) is not None:
        try:
            answer = await client.request(request.method, url + request.url.path,
                                          params=request.url.query, content=body, headers=headers)
        except _REPLICA_DOWN as e:
            log.warning("front: replica %s failed a request (%r); it is out, the request goes "
                        "to the next one", url, e)
            backends.mark(url, False)
            tried.add(url)
            continue
        except httpx.HTTPError as e:
            return JSONResponse({"error": f"replica {url} did not answer: {e!r}"}, 502)
        if answer.status_code < 500:  # a replica taken out that answers is back
            backends.mark(url, True)
        kept = {k: v for k, v in answer.headers.items() if k.lower() not in _DROPPED
                and k.lower() != "content-encoding"}
        return Response(answer.content, answer.status_code, kept)
    log.warning("front: no replica to send a request to (replicas: %s; out of the turns: %s; "
                "failed it: %s): answered 503", backends.urls() or "none known",
                backends.out_urls() or "none", sorted(tried) or "none")
    return JSONResponse({"error": "no replica is healthy: see `ringtrain deployment show`"},
                        503, {"Retry-After": "2"})
