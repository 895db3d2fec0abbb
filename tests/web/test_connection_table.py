"""The connection table's rules, with stand-in connections and a fake clock: the caps, which
connection makes room, the header timeout, the budget worked out from the descriptor limit, and
one counted line per report; and what the listening socket does with a connection over a cap,
by what it sent."""

from __future__ import annotations

import logging
import socket

import pytest

from ringtrain.errors import ConfigError
from ringtrain.web.connection_limits import (
    Budget,
    ConnectionLimits,
    ConnectionTable,
    ScreeningSocket,
)
from tests.clock import FakeClock

pytestmark = pytest.mark.fast


class Conns:
    """Stand-in connections: names, and the order the table closed them in."""

    def __init__(self, table: ConnectionTable) -> None:
        self.table = table
        self.closed: list[str] = []

    def open(self, name: str, address: str = "10.0.0.1") -> bool:
        return self.table.opened(name, address, lambda: self.closed.append(name))


def _table(most: int = 4, per_address: int = 2, timeout_s: float = 10.0,
           clock: FakeClock | None = None) -> ConnectionTable:
    return ConnectionTable(Budget(most, per_address, 8, timeout_s), clock or FakeClock())


def test_an_address_at_its_cap_gives_up_its_own_oldest_waiting_connection() -> None:
    conns = Conns(_table(most=10, per_address=2))
    assert conns.open("a1") and conns.open("a2") and conns.open("b1", "10.0.0.2")
    assert conns.open("a3")
    assert conns.closed == ["a1"] and conns.table.open_from("10.0.0.1") == 2
    assert conns.table.counts["replaced"] == 1


def test_a_connection_holding_a_request_is_never_replaced_and_the_new_one_is_refused() -> None:
    conns = Conns(_table(most=10, per_address=2))
    conns.open("a1")
    conns.open("a2")
    conns.table.busy("a1")
    assert conns.open("a3") and conns.closed == ["a2"]  # the waiting one, though newer
    conns.table.busy("a3")
    assert not conns.open("a4")  # both hold requests
    assert conns.table.counts["refused"] == 1 and len(conns.table) == 2
    conns.table.waiting("a1")  # answered, kept alive: waits again, so it may be replaced
    assert conns.open("a5") and conns.closed == ["a2", "a1"]


def test_the_overall_cap_replaces_the_oldest_waiting_connection_of_any_address() -> None:
    conns = Conns(_table(most=3, per_address=3))
    conns.open("a1")
    conns.open("b1", "10.0.0.2")
    conns.open("c1", "10.0.0.3")
    conns.table.busy("a1")
    assert conns.open("d1", "10.0.0.4") and conns.closed == ["b1"]
    assert len(conns.table) == 3 and conns.table.open_from("10.0.0.2") == 0


def test_connections_waiting_past_the_header_timeout_are_closed_oldest_first() -> None:
    clock = FakeClock()
    conns = Conns(_table(most=10, per_address=10, timeout_s=10, clock=clock))
    conns.open("old")
    clock.advance(4)
    conns.open("new")
    conns.open("busy")
    conns.table.busy("busy")
    clock.advance(6)
    conns.table.expire()
    assert conns.closed == ["old"]
    clock.advance(4)
    conns.table.expire()
    assert conns.closed == ["old", "new"] and len(conns.table) == 1
    assert conns.table.counts["timed out"] == 2


def test_closed_connections_leave_no_trace() -> None:
    conns = Conns(_table())
    conns.open("a1")
    conns.table.closed("a1")
    conns.table.closed("a1")  # twice: a no-op
    conns.table.closed("never")
    assert len(conns.table) == 0 and conns.table.open_from("10.0.0.1") == 0
    conns.table.expire()
    assert conns.closed == []


def test_what_the_limits_did_is_reported_in_one_counted_line(caplog: pytest.LogCaptureFixture
                                                              ) -> None:
    conns = Conns(_table(most=100, per_address=1))
    for i in range(50):
        conns.open(f"c{i}")
    with caplog.at_level(logging.WARNING, "ringtrain.web.connection_limits"):
        conns.table.report()
        conns.table.report()  # nothing new: nothing logged
    (line,) = caplog.messages
    assert "49 replaced" in line and "1 per address" in line


def test_the_budget_leaves_a_quarter_of_the_descriptors_to_the_server() -> None:
    budget = ConnectionLimits().resolved(20_000)
    assert (budget.max_connections, budget.per_address) == (15_000, 256)
    assert budget.accept_batch * 4 <= 20_000 - budget.max_connections
    small = ConnectionLimits(per_address=500).resolved(256)
    assert (small.max_connections, small.per_address, small.accept_batch) == (192, 192, 8)
    assert ConnectionLimits().resolved(1024).per_address == 192  # a quarter of 768
    with pytest.raises(ConfigError, match="leaves fewer than 64 of the 1024 open files"):
        ConnectionLimits(max_connections=1000).resolved(1024)
    with pytest.raises(ConfigError, match="header timeout"):
        ConnectionLimits(header_timeout_s=0)


def test_over_a_cap_a_part_of_a_header_is_turned_away_at_accept_and_a_whole_one_marked() -> None:
    table = _table(most=10, per_address=1)
    table.opened("held", "127.0.0.1", lambda: None)  # the address is at its cap
    with ScreeningSocket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.table = table
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        sent = [b"GET / HTTP/1.1\r\nHost: x\r\n", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
                b"\x16\x03\x01\x02\x00", b""]  # part of a header, a whole one, TLS, nothing
        clients = [socket.create_connection(listener.getsockname(), timeout=10) for _ in sent]
        for client, data in zip(clients, sent):
            client.sendall(data)
        accepted = []
        try:
            while True:
                accepted.append(listener.accept())
        except BlockingIOError:
            pass
        try:
            peers = [peer for _, peer in accepted]
            assert peers == [c.getsockname() for c in clients[1:]]
            assert table.arrived_whole == {clients[1].getsockname()}
            assert table.counts["turned away"] == 1
            with pytest.raises(ConnectionResetError):  # closed with its bytes unread
                clients[0].recv(1)
        finally:
            for conn, _ in accepted:
                conn.close()
            for client in clients:
                client.close()
