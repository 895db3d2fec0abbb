"""Connection limits for ringtrain's uvicorn servers: nginx's ``client_header_timeout``,
``limit_conn`` per address, ``worker_connections`` and ``deferred`` accept, for the job service
and the model server.

Without them (issue 35), a connection that never finished its request header stayed open for
ever (uvicorn times out idle kept-alive connections only), and 20,000 of them used up the
process's file descriptors: health checks went unanswered, and asyncio's accept loop, which
retries once per queued connection, logged 407,550 tracebacks in 45 s. Here:

* a connection must complete a request header within ``header_timeout_s`` of opening, or of its
  previous answer when kept alive; else it is closed (checked by a sweep, about 4 times a
  timeout);
* at most ``max_connections`` are open, fewer than ``RLIMIT_NOFILE`` by a headroom left for the
  server's own files (its database, logs, the job folders it reads), and at most
  ``per_address`` from one client address.

A connection over a cap takes the place of the oldest one still waiting for a request header,
of its own address first, as nginx reuses its idle connections when ``worker_connections`` run
out: a client that sends its request at once, as a health check does, gets in through any flood
of connections that send nothing, even from its own address (all local clients come from
127.0.0.1). Only when every connection under the cap holds a request does a new one get 503
with ``Retry-After`` at once, and is closed, before any descriptor runs out.

The cost of a flood is kept off the event loop: the kernel hands over a connection only once it
sent something, and one over a cap that sent part of a header and not the rest is closed as it
is accepted, before asyncio makes it a transport (:class:`ScreeningSocket`). What the limits
did is logged once per sweep as counts, never a line per connection.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import math
import resource
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ringtrain.errors import ConfigError
from ringtrain.web.log_repeats import install_repeat_filter

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger(__name__)

#: Descriptors kept free of connections: a quarter of the limit, at least this many.
MIN_HEADROOM = 64
#: Connections one address may hold at most by default (fewer where a quarter of the cap is
#: less): as many as the model server's queue takes requests, more than a proxy's pool (httpx:
#: 100) or a browser (6). Each costs a transport and a protocol, so a flood's first connections,
#: up to this many, are its dear ones.
PER_ADDRESS = 256
#: Most connections asyncio accepts in one go: each holds a descriptor for a few turns of the
#: event loop before the caps see it, so the bursts of those turns must fit in the headroom.
MAX_ACCEPT_BATCH = 256
#: Connections the kernel queues for the server to accept (twice uvicorn's default; Linux caps
#: it at ``net.core.somaxconn``): a burst that overflows it has its connections retried by
#: their clients a second or more later, health checks included.
LISTEN_BACKLOG = 4096
#: Most connections turned away in one call of ``accept`` before the event loop runs again.
SCREEN_BATCH = 1024
#: What is read of a connection over a cap to see whether it sent a whole request header: as
#: much as uvicorn's h11 takes before answering 400.
HEADER_PEEK_BYTES = 16 * 1024 + 4
#: ``Retry-After`` of a connection refused because every one holds a request.
RETRY_AFTER_S = 1


@dataclass(frozen=True)
class ConnectionLimits:
    """How many connections a server holds, and how long one may take to send its header.

    Attributes:
        header_timeout_s: Seconds a connection may take to complete a request header, from its
            opening or its previous answer.
        max_connections: Connections open at most; ``None``: the soft ``RLIMIT_NOFILE`` less a
            quarter of it (at least :data:`MIN_HEADROOM`) for the server's own files.
        per_address: Connections open at most from one client address; ``None``:
            :data:`PER_ADDRESS`, or a quarter of ``max_connections`` if less.
    """

    header_timeout_s: float = 10.0
    max_connections: int | None = None
    per_address: int | None = None

    def __post_init__(self) -> None:
        if not self.header_timeout_s > 0:
            raise ConfigError(f"header timeout {self.header_timeout_s} s must be positive")
        for name in ("max_connections", "per_address"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} {value} must be at least 1")

    def resolved(self, open_files: int | None = None) -> Budget:
        """The numbers for a process that may open ``open_files`` descriptors (default: its soft
        ``RLIMIT_NOFILE``).

        Raises:
            ConfigError: ``max_connections`` leaves fewer than :data:`MIN_HEADROOM` descriptors
                for the server's own files.
        """
        if open_files is None:
            open_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            if open_files == resource.RLIM_INFINITY:
                open_files = 1 << 20
        headroom = max(MIN_HEADROOM, open_files // 4)
        most = self.max_connections or max(1, open_files - headroom)
        if most > open_files - MIN_HEADROOM:
            raise ConfigError(f"max_connections {most} leaves fewer than {MIN_HEADROOM} of the "
                              f"{open_files} open files allowed (ulimit -n) for the server's own "
                              "files: lower it, or raise the limit")
        batch = max(1, min(MAX_ACCEPT_BATCH, (open_files - most) // 8))
        per_address = self.per_address or max(1, min(PER_ADDRESS, most // 4))
        return Budget(most, min(most, per_address), batch, self.header_timeout_s)


@dataclass(frozen=True)
class Budget:
    """:class:`ConnectionLimits` worked out for one process's descriptor limit.

    ``accept_batch``: connections accepted in one go (an eighth of the headroom: about four
    such bursts hold descriptors before the caps act on the first).
    """

    max_connections: int
    per_address: int
    accept_batch: int
    header_timeout_s: float


@dataclass
class _Peer:
    """One client address: its connections open, and those waiting for a header, oldest
    first."""

    open: int = 0
    waiting: OrderedDict[Hashable, None] = field(default_factory=OrderedDict)


class ConnectionTable:
    """The connections of one server (used from its event loop): which wait for a request
    header and since when, how many each address holds; closes those over a cap or past the
    header timeout through the ``close`` each was opened with.

    Args:
        budget: The caps and the timeout.
        clock: Monotonic seconds (injectable for tests).
    """

    def __init__(self, budget: Budget, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget = budget
        self._clock = clock
        self._address: dict[Hashable, str] = {}
        self._close: dict[Hashable, Callable[[], None]] = {}
        self._peers: dict[str, _Peer] = {}
        # Every waiting connection, by the time it began waiting: the oldest first.
        self._waiting: OrderedDict[Hashable, float] = OrderedDict()
        self.counts = {"replaced": 0, "turned away": 0, "timed out": 0, "refused": 0}
        # Peers (address, port) whose whole request header was there when they were accepted:
        # taken busy, so that a burst of connections cannot replace them before it is read.
        self.arrived_whole: set[tuple[str, int]] = set()
        self._sweeper: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._address)

    def open_from(self, address: str) -> int:
        """Connections open from ``address``."""
        peer = self._peers.get(address)
        return 0 if peer is None else peer.open

    def full_for(self, address: str) -> bool:
        """Whether a new connection from ``address`` is over a cap (and must take the place of
        a waiting one)."""
        peer = self._peers.get(address)
        return len(self._address) >= self.budget.max_connections or (
            peer is not None and peer.open >= self.budget.per_address)

    def opened(self, conn: Hashable, address: str, close: Callable[[], None],
               busy: bool = False) -> bool:
        """Take a new connection from ``address``, waiting for its header (``busy``: it already
        sent a whole one); over a cap, close the oldest waiting one (of ``address`` first) to
        make room.

        Returns:
            False, and the connection is not taken, when every connection in the way holds a
            request: the caller answers 503 and closes it.
        """
        peer = self._peers.get(address)
        if peer is not None and peer.open >= self.budget.per_address:
            if not peer.waiting:
                return self._refuse()
            self._replace(next(iter(peer.waiting)))
        if len(self._address) >= self.budget.max_connections:
            if not self._waiting:
                return self._refuse()
            self._replace(next(iter(self._waiting)))
        peer = self._peers.setdefault(address, _Peer())
        peer.open += 1
        self._address[conn] = address
        self._close[conn] = close
        if not busy:
            self.waiting(conn)
        return True

    def waiting(self, conn: Hashable) -> None:
        """``conn`` waits for a request header (again): it may be replaced, and times out."""
        address = self._address.get(conn)
        if address is not None:
            self._waiting[conn] = self._clock()
            self._waiting.move_to_end(conn)
            self._peers[address].waiting[conn] = None
            self._peers[address].waiting.move_to_end(conn)

    def busy(self, conn: Hashable) -> None:
        """``conn`` sent a whole request header: it holds a request until its answer."""
        address = self._address.get(conn)
        if address is not None:
            self._waiting.pop(conn, None)
            self._peers[address].waiting.pop(conn, None)

    def closed(self, conn: Hashable) -> None:
        """``conn`` is gone (a no-op for one already dropped)."""
        address = self._address.pop(conn, None)
        if address is None:
            return
        del self._close[conn]
        self._waiting.pop(conn, None)
        peer = self._peers[address]
        peer.waiting.pop(conn, None)
        peer.open -= 1
        if not peer.open:
            del self._peers[address]

    def expire(self) -> None:
        """Close the connections that waited longer than the header timeout for a header."""
        deadline = self._clock() - self.budget.header_timeout_s
        while self._waiting:
            conn, since = next(iter(self._waiting.items()))
            if since > deadline:
                break
            self._drop(conn)
            self.counts["timed out"] += 1

    def report(self) -> None:
        """Log what the caps and the timeout did since the last report, in one line (none if
        nothing)."""
        if not any(self.counts.values()):
            return
        done = ", ".join(f"{n:,} {what}" for what, n in self.counts.items() if n)
        log.warning("connection limits: %s (%d open; at most %d, %d per address; a header "
                    "within %g s)", done, len(self), self.budget.max_connections,
                    self.budget.per_address, self.budget.header_timeout_s)
        self.counts = dict.fromkeys(self.counts, 0)

    def _refuse(self) -> bool:
        self.counts["refused"] += 1
        return False

    def _replace(self, conn: Hashable) -> None:
        self._drop(conn)
        self.counts["replaced"] += 1

    def _drop(self, conn: Hashable) -> None:
        close = self._close[conn]
        self.closed(conn)
        close()

    def start_sweeping(self) -> None:
        """On the event loop: from now on, about four times per header timeout (at most every
        second), close the connections past it and report; until no connection is left."""
        if self._sweeper is None:
            every = min(1.0, self.budget.header_timeout_s / 4)
            self._sweeper = asyncio.get_running_loop().call_later(every, self._sweep, every)

    def _sweep(self, every: float) -> None:
        self.expire()
        self.report()
        # Stops with the last connection (a server that stopped leaves no timer behind).
        self._sweeper = None if not self._address else \
            asyncio.get_running_loop().call_later(every, self._sweep, every)


def limited_protocol(table: ConnectionTable) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol, with each connection kept in ``table``."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class LimitedH11Protocol(H11Protocol):
        _seen: object = None  # the request-response cycle last reported busy

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)  # type: ignore[arg-type]
            peer = self.client or ("", 0)
            whole = peer in table.arrived_whole
            table.arrived_whole.discard(peer)
            if table.opened(self, peer[0], self.transport.close, busy=whole):
                table.start_sweeping()
            else:
                _refuse(self.transport)

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and self.cycle is not self._seen:
                self._seen = self.cycle  # a new request's header is complete
                table.busy(self)

        def on_response_complete(self) -> None:
            table.waiting(self)  # before: a pipelined request may start in there
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            table.closed(self)
            super().connection_lost(exc)

    return LimitedH11Protocol


def _refuse(transport: asyncio.Transport) -> None:
    """Answer 503 before any request and close: every connection the caps allow holds one."""
    message = ("the server holds as many connections as it may, each with a request under way; "
               "try again shortly")
    body = json.dumps({"error": message, "detail": message}).encode()
    transport.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                    b"retry-after: %d\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
                    % (RETRY_AFTER_S, len(body), body))
    transport.close()


class ScreeningSocket(socket.socket):
    """A listening socket whose ``accept`` looks at what each connection sent (without taking
    it): one over a cap that sent part of a request header and not the rest is closed at once,
    before asyncio sees it, so that of a flood of such only what is kept costs a transport and a
    protocol (about 100 us each in asyncio, where this costs about a tenth); one that sent a
    whole header is marked in the table's ``arrived_whole``. One that sent nothing yet, or a
    TLS handshake (unreadable here), is accepted, to wait. Set ``table``.
    """

    table: ConnectionTable

    def accept(self) -> tuple[socket.socket, Any]:
        for _ in range(SCREEN_BATCH):
            conn, peer = super().accept()
            try:
                head = conn.recv(HEADER_PEEK_BYTES, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except OSError:  # nothing sent yet, or gone
                head = b""
            if head[:1] != b"\x16" and b"\r\n\r\n" in head:
                self.table.arrived_whole.add(peer)
            elif head and head[:1] != b"\x16" and self.table.full_for(peer[0]):
                conn.close()
                self.table.counts["turned away"] += 1
                continue
            return conn, peer
        # asyncio takes this as "none left": it calls again on its next turn, in between
        # running everything else.
        raise BlockingIOError(errno.EAGAIN, "screened a batch of connections")


def limited_server(app: Any, budget: Budget, **options: Any) -> uvicorn.Server:
    """A uvicorn server of ``app`` (``options``: the rest of ``uvicorn.Config``'s arguments)
    held to ``budget``, whose repeated log records are cut
    (:func:`~ringtrain.web.log_repeats.install_repeat_filter`). Serve it with ``sockets``: they
    are taken over (the objects given are left detached).
    """
    import uvicorn

    table = ConnectionTable(budget)

    class LimitedServer(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            screening: list[socket.socket] = [_screening(sock, table) for sock in sockets or []]
            await super().startup(screening or None)
            # asyncio listens with its accept batch as the kernel's queue too; a longer queue
            # lets a burst wait there rather than see its connections dropped.
            for sock in screening:
                sock.listen(LISTEN_BACKLOG)

    config = uvicorn.Config(app, http=limited_protocol(table), backlog=budget.accept_batch,
                            **options)
    install_repeat_filter()  # after uvicorn.Config, which configures uvicorn's loggers
    return LimitedServer(config)


def _screening(sock: socket.socket, table: ConnectionTable) -> ScreeningSocket:
    """``sock`` as a :class:`ScreeningSocket` of ``table``, which the kernel hands connections
    once they sent something (``TCP_DEFER_ACCEPT``, nginx's ``deferred``: one that sends
    nothing waits in the kernel, up to the header timeout, holding no descriptor)."""
    screening = ScreeningSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
    screening.table = table
    if hasattr(socket, "TCP_DEFER_ACCEPT"):
        screening.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT,
                             max(1, math.ceil(table.budget.header_timeout_s)))
    return screening
