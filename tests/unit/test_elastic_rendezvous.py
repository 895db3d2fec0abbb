"""The elastic rendezvous protocol between the launcher's agent and the workers, on a real
torch.distributed store (in memory), with workers as threads."""

from __future__ import annotations

import threading

import pytest
import torch.distributed as dist

from ringtrain.contract import elastic_rendezvous as rdzv
from ringtrain.contract.slots import SlotInfo

KEYS = rdzv.Keys("run1")


def _slots(*workers: int) -> dict[int, SlotInfo]:
    n = len(workers)
    return {w: SlotInfo("localhost", rank, rank, 0, n, n, 1) for rank, w in enumerate(workers)}


class _Joiner(threading.Thread):
    """A worker joining (or leaving for) a world in the background."""

    def __init__(self, store, worker: int, generation: int, leaving: bool = False,
                 timeout_s: float = 10.0):
        super().__init__(daemon=True)
        self.args = (store, KEYS, worker, generation, leaving, timeout_s)
        self.result: tuple[SlotInfo, int] | None = None
        self.error: Exception | None = None
        self.start()

    def run(self) -> None:
        try:
            self.result = rdzv.join_world(*self.args)
        except Exception as e:  # handed to the test
            self.error = e

    def outcome(self) -> tuple[int, int]:
        """(rank, generation) once joined."""
        self.join(10)
        assert self.error is None and self.result is not None, self.error
        return self.result[0].rank, self.result[1]


def test_a_world_forms_once_every_member_joined():
    store = dist.HashStore()
    rdzv.publish_world(store, KEYS, 1, _slots(0, 1))
    first = _Joiner(store, 0, 1)
    first.join(0.2)
    assert first.is_alive()  # waits for worker 1
    second = _Joiner(store, 1, 1)
    assert (first.outcome(), second.outcome()) == ((0, 1), (1, 1))
    assert rdzv.world_formed(store, KEYS, 1, 2)


def test_a_world_replaced_before_it_formed_sends_its_joiners_on():
    store = dist.HashStore()
    rdzv.publish_world(store, KEYS, 1, _slots(0, 1))
    survivor = _Joiner(store, 0, 1)  # worker 1 dies before joining
    assert not rdzv.world_formed(store, KEYS, 1, 2)
    rdzv.publish_world(store, KEYS, 2, _slots(0))
    rdzv.replace_world(store, KEYS, 1, 2)
    assert survivor.outcome() == (0, 2)


def test_leaving_workers_join_the_next_world_with_the_new_ones():
    store = dist.HashStore()
    rdzv.publish_world(store, KEYS, 1, _slots(0, 1))
    members = [_Joiner(store, w, 1) for w in (0, 1)]
    assert [m.outcome() for m in members] == [(0, 1), (1, 1)]
    rdzv.notify_hosts(store, KEYS, 1, rdzv.HostUpdate.ADDED)
    assert rdzv.host_update(store, KEYS, 1) is rdzv.HostUpdate.ADDED
    assert rdzv.host_update(store, KEYS, 2) is None
    leaving = [_Joiner(store, w, 1, leaving=True) for w in (1, 0)]
    for m in leaving:
        m.join(0.1)
    assert rdzv.ready_workers(store, KEYS, 1, (0, 1, 7)) == {0, 1}
    rdzv.publish_world(store, KEYS, 2, _slots(1, 0, 2))  # worker 2 is new
    rdzv.replace_world(store, KEYS, 1, 2)
    newcomer = _Joiner(store, 2, 2)
    assert [m.outcome() for m in leaving] == [(0, 2), (1, 2)] and newcomer.outcome() == (2, 2)


def test_waits_are_bounded_by_the_elastic_timeout():
    store = dist.HashStore()
    with pytest.raises(rdzv.RendezvousTimeout, match="did not form a new world"):
        rdzv.join_world(store, KEYS, 0, 1, leaving=True, timeout_s=0.2)
    with pytest.raises(rdzv.RendezvousTimeout, match="no place in world 1 for worker 0"):
        rdzv.join_world(store, KEYS, 0, 1, leaving=False, timeout_s=0.2)
    rdzv.publish_world(store, KEYS, 1, _slots(0, 1))
    with pytest.raises(rdzv.RendezvousTimeout, match="world 1 did not form within 0.2 s"):
        rdzv.join_world(store, KEYS, 0, 1, leaving=False, timeout_s=0.2)


def test_host_updates_merge():
    assert rdzv.HostUpdate.ADDED.merge(None) is rdzv.HostUpdate.ADDED
    assert rdzv.HostUpdate.ADDED.merge(rdzv.HostUpdate.ADDED) is rdzv.HostUpdate.ADDED
    assert rdzv.HostUpdate.REMOVED.merge(rdzv.HostUpdate.ADDED) is rdzv.HostUpdate.MIXED
