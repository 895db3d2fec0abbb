"""Doorbells: the first ring of a round decides its bell, for every rank that reads it; on a real
TCPStore on loopback and on the in-process doorbell."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch.distributed as dist

from ringtrain.engine.doorbell import NEGOTIATE, LocalDoorbell, StoreDoorbell


def _store_doorbell(server: dist.TCPStore) -> StoreDoorbell:
    def client() -> dist.Store:
        tcp = dist.TCPStore("127.0.0.1", server.port, is_master=False,
                            timeout=timedelta(seconds=10))
        return dist.PrefixStore("bell/", tcp)

    return StoreDoorbell(wait_store=client(), ring_store=client())


@pytest.fixture(params=["store", "local"])
def bells(request):
    """Two ranks' doorbells on the same bells."""
    if request.param == "local":
        local = LocalDoorbell()
        yield local, local
        return
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=10))
    yield _store_doorbell(server), _store_doorbell(server)
    del server  # the server lives as long as its clients are used


def test_the_first_ring_of_a_round_decides_its_bell(bells):
    first, second = bells
    assert first.ring(3, b"unit@1") == b"unit@1"
    assert second.ring(3, NEGOTIATE) == b"unit@1"  # taken: the ringer must try a later round
    assert second.wait(3, 1.0) == first.wait(3, 1.0) == b"unit@1"
    assert second.ring(4, NEGOTIATE) == NEGOTIATE


def test_a_waiter_wakes_on_the_ring_and_times_out_without_one(bells):
    first, second = bells
    assert first.wait(0, 0.05) is None
    woke: list[bytes | None] = []
    waiter = threading.Thread(target=lambda: woke.append(first.wait(0, 10.0)))
    waiter.start()
    second.ring(0, NEGOTIATE)
    waiter.join(10.0)
    assert woke == [NEGOTIATE]


def test_a_forgotten_round_no_longer_holds_its_bell(bells):
    first, second = bells
    first.ring(7, NEGOTIATE)
    second.forget(7)
    assert first.wait(7, 0.05) is None


def test_counters_are_shared(bells):
    first, second = bells
    assert [first.count("k"), second.count("k"), first.count("j")] == [1, 2, 1]
