"""Doorbells: the first ring of a round decides its bell, for every rank that reads it; on a real
TCPStore on loopback, on a real shared-memory segment and on the in-process doorbell."""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from ringtrain.backends.shm_segment import Member, Segment
from ringtrain.engine import shm_doorbell
from ringtrain.engine.doorbell import NEGOTIATE, LocalDoorbell, StoreDoorbell
from ringtrain.engine.shm_doorbell import ShmDoorbell
from tests.waiting import wait_until


def _store_doorbell(server: dist.TCPStore) -> StoreDoorbell:
    def client() -> dist.Store:
        tcp = dist.TCPStore("127.0.0.1", server.port, is_master=False,
                            timeout=timedelta(seconds=10))
        return dist.PrefixStore("bell/", tcp)

    return StoreDoorbell(wait_store=client(), ring_store=client())


def shm_doorbells(tmp_path, fallback=None) -> tuple[ShmDoorbell, ShmDoorbell]:
    """Two ranks' doorbells on one real segment (each its own mapping and descriptor)."""
    members = [Member(r, os.getpid(), -1) for r in range(2)]
    slot = (shm_doorbell.bytes_needed(2) // 4 + 63) // 64 * 64
    path = tmp_path / "bells"
    first = Segment.create(path, members, slot, 10, keep_fd=True)
    second = Segment.attach(path, members, 1, slot, 10, 10, keep_fd=True)
    path.unlink()
    fallback = fallback or LocalDoorbell()
    return ShmDoorbell(first, fallback), ShmDoorbell(second, fallback)


@pytest.fixture(params=["store", "local", "shm"])
def bells(request, tmp_path):
    """Two ranks' doorbells on the same bells."""
    if request.param == "local":
        local = LocalDoorbell()
        yield local, local
        return
    if request.param == "shm":
        yield shm_doorbells(tmp_path)
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
    if isinstance(first, ShmDoorbell):
        pytest.skip("shared-memory bells are reused by progress, not forgotten (tested below)")
    first.ring(7, NEGOTIATE)
    second.forget(7)
    assert first.wait(7, 0.05) is None


def test_counters_are_shared(bells):
    first, second = bells
    assert [first.count("k"), second.count("k"), first.count("j")] == [1, 2, 1]


def test_a_shared_memory_round_entry_is_reused_only_once_every_engine_is_past_it(tmp_path,
                                                                              monkeypatch):
    monkeypatch.setattr(shm_doorbell, "_REUSE_TIMEOUT_S", 0.2)
    first, second = shm_doorbells(tmp_path)
    later = 5 + shm_doorbell._ROUNDS  # the same entry as round 5
    first.ring(5, b"unit@1")
    assert first.wait(5, 0.0) == second.wait(5, 0.0) == b"unit@1"
    assert first.wait(6, 0.0) is None  # rank 0 waits for round 6: past round 5
    with pytest.raises(Exception, match=r"rank\(s\) \[1\] have not finished round 5"):
        first.ring(later, NEGOTIATE)
    assert second.wait(later, 0.0) is None  # rank 1 is past round 5 too
    assert first.ring(later, NEGOTIATE) == NEGOTIATE
    assert second.wait(later, 1.0) == NEGOTIATE


def test_shared_memory_counters_overflow_into_the_fallback_alike_on_every_rank(tmp_path,
                                                                            monkeypatch):
    monkeypatch.setattr(shm_doorbell, "_COUNTERS_USED_MAX", 2)
    fallback = LocalDoorbell()
    first, second = shm_doorbells(tmp_path, fallback)
    assert [first.count("a"), second.count("b"), second.count("a")] == [1, 1, 2]
    assert [first.count("c"), second.count("c"), first.read("c")] == [1, 2, 2]
    assert fallback.read("c") == 2 and fallback.read("a") == 0  # "c" found the table full
    assert second.read("a") == 2 and first.read("never") == 0


def test_a_waiter_on_shared_memory_sleeps_until_a_ring_wakes_it(tmp_path):
    first, second = shm_doorbells(tmp_path)
    woke: list[bytes | None] = []
    waiter = threading.Thread(target=lambda: woke.append(first.wait(2, 30.0)))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and woke == []  # nothing rang round 2 yet
    second.ring(2, b"unit@7")
    waiter.join(10.0)
    assert woke == [b"unit@7"]


def _recorded_wakes(monkeypatch) -> list[int]:
    """The addresses of the futex wake-up calls the doorbells make from now on."""
    wakes: list[int] = []
    wake = shm_doorbell.futex.wake
    monkeypatch.setattr(shm_doorbell.futex, "wake", lambda address: (wakes.append(address),
                                                                     wake(address))[1])
    return wakes


def _asleep(bell: ShmDoorbell, caller: bool) -> None:
    """Wait until ``bell``'s rank says its caller (or engine) sleeps on its word."""
    flag = 2 * bell._me + (0 if caller else 1)
    wait_until(lambda: bell._sleepers[flag], "the waiter going to sleep", every_s=1e-3)


def _waiting(bell: ShmDoorbell, round_: int, caller: bool = False
             ) -> tuple[threading.Thread, list[bytes | None]]:
    """A thread of ``bell``'s rank asleep waiting for ``round_``, and where its bell will be."""
    woke: list[bytes | None] = []
    waiter = threading.Thread(target=lambda: woke.append(bell.wait(round_, 30.0,
                                                                   claimed=caller)))
    waiter.start()
    _asleep(bell, caller)
    return waiter, woke


def test_rings_in_a_deferring_block_wake_the_engines_once_when_it_ends(tmp_path, monkeypatch):
    first, second = shm_doorbells(tmp_path)
    wakes = _recorded_wakes(monkeypatch)
    waiter, woke = _waiting(first, 1)
    with second.deferring_wakes():
        with second.deferring_wakes():  # nested: still owed to the outermost block
            assert second.ring(0, NEGOTIATE) == NEGOTIATE
            assert second.ring(1, b"unit@1") == b"unit@1"
        assert wakes == []
    assert wakes == [second._word_address]  # once; no caller sleeps on the callers' word
    waiter.join(10.0)
    assert woke == [b"unit@1"]
    waiter, woke = _waiting(first, 2)
    second.ring(2, NEGOTIATE)  # outside a block: at once
    assert wakes == [second._word_address] * 2
    waiter.join(10.0)
    assert woke == [NEGOTIATE]


def test_a_ring_wakes_only_the_words_a_thread_sleeps_on(tmp_path, monkeypatch):
    first, second = shm_doorbells(tmp_path)
    wakes = _recorded_wakes(monkeypatch)
    second.ring(0, NEGOTIATE)
    assert wakes == []  # nobody sleeps: no system call
    caller, woke = _waiting(first, 1, caller=True)
    second.ring(1, NEGOTIATE)
    caller.join(10.0)
    assert woke == [NEGOTIATE] and wakes == [second._callers_address]
    engine, woke = _waiting(second, 2)
    first.ring(2, NEGOTIATE)  # a rank's own engine is woken alike
    engine.join(10.0)
    assert woke == [NEGOTIATE] and wakes[1:] == [first._word_address]


def test_a_waiter_going_to_sleep_as_the_ring_comes_never_misses_it(tmp_path):
    import multiprocessing

    first, second = shm_doorbells(tmp_path)
    rounds = 400

    def ring_each() -> None:  # rank 1, in a process of its own
        for round_ in range(rounds):
            # Around the waiter's switch from spinning to sleeping (20 µs), and well past it.
            until = time.perf_counter() + (round_ % 40) * 2e-6 + (round_ % 7 == 0) * 1e-3
            while time.perf_counter() < until:
                pass
            second.ring(round_, b"u@%d" % round_)
            deadline = time.monotonic() + 20.0
            while second._progress[0] < round_:  # rank 0 took this round's bell
                if time.monotonic() > deadline:
                    os._exit(3)
        os._exit(0)

    bells: list[bytes | None] = []

    def take_each() -> None:  # rank 0: a missed wake-up sleeps for good (the timeout is a day)
        for round_ in range(rounds):
            bells.append(first.wait(round_, 86400.0, claimed=round_ % 2 == 0))

    ringer = multiprocessing.get_context("fork").Process(target=ring_each)
    ringer.start()
    waiter = threading.Thread(target=take_each, daemon=True)
    waiter.start()
    try:
        waiter.join(120.0)  # a bound on a hang: 400 rounds take well under a second
    finally:
        ringer.join(30.0)
        ringer.kill()
    assert not waiter.is_alive(), f"a wake-up was missed: the waiter sleeps in round {len(bells)}"
    assert bells == [b"u@%d" % r for r in range(rounds)]
    assert ringer.exitcode == 0


def test_a_ring_of_a_unit_every_rank_claimed_wakes_only_the_callers(tmp_path, monkeypatch):
    first, second = shm_doorbells(tmp_path)
    wakes = _recorded_wakes(monkeypatch)
    engines, callers = second._word_address, second._callers_address
    first.claim(3, "k")
    second.claim(3, "k")
    engine, _ = _waiting(first, 3)
    caller, woke = _waiting(first, 3, caller=True)
    second.ring(3, b"k@1")
    caller.join(10.0)
    assert woke == [b"k@1"]
    assert wakes == [callers]  # the engines sleep on: their callers run the round
    first.unclaim(wake=False)
    second.unclaim(wake=False)
    caller, _ = _waiting(first, 4, caller=True)
    second.ring(4, b"k@2")  # claimed by nobody
    for thread in (engine, caller):  # woken, the engine finds round 3 rung
        thread.join(10.0)
    assert wakes[1:] == [callers, engines]
    first.claim(5, "k")
    second.claim(5, "other")
    engine, _ = _waiting(first, 5)
    caller, _ = _waiting(first, 5, caller=True)
    second.ring(5, b"k@3")  # rank 1 claimed another unit: its engine must run this round
    assert wakes[3:] == [callers, engines]
    first.unclaim(wake=True)  # a caller that gives its round back wakes the engines
    assert wakes[5:] == [first._word_address]
    for thread in (engine, caller):
        thread.join(10.0)


def test_a_wait_for_a_round_long_past_returns_at_once(tmp_path, monkeypatch):
    first, second = shm_doorbells(tmp_path)
    first.ring(5, b"unit@1")
    assert first.wait(6, 0.0) is None and second.wait(6, 0.0) is None  # both past round 5
    later = 5 + shm_doorbell._ROUNDS  # the same entry as round 5
    assert second.ring(later, NEGOTIATE) == NEGOTIATE

    def never_sleep(*_) -> None:
        raise AssertionError("the wait went to sleep for a round long past")

    monkeypatch.setattr(shm_doorbell.futex, "wait", never_sleep)
    assert first.wait(5, 30.0) is None  # an engine that slept while its callers ran rounds


def test_a_shared_memory_lock_held_too_long_names_its_holder(tmp_path, monkeypatch):
    monkeypatch.setattr(shm_doorbell, "_LOCK_TIMEOUT_S", 0.3)
    first, second = shm_doorbells(tmp_path)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with first._locked:
            held.set()
            release.wait(10.0)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10.0)
    try:
        with pytest.raises(Exception, match=rf"rank 0 \(pid {os.getpid()}\) has held the "
                           r"shared-memory doorbell's lock for \d+ s while rank 1 waited"):
            second.count("k")
    finally:
        release.set()
        holder.join(10.0)
    assert second.count("k") == 1  # free again


def test_a_killed_holder_does_not_block_the_shared_memory_lock(tmp_path):
    import signal
    import subprocess
    import sys

    first, second = shm_doorbells(tmp_path)
    # Another process opens the same (unlinked) file through /proc and takes its flock.
    child = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         f"fd = os.open('/proc/{os.getpid()}/fd/{first._fd}', os.O_RDWR)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "locked"
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        child.kill()
        child.wait(10)
    assert first.ring(0, NEGOTIATE) == NEGOTIATE  # the kernel dropped the dead holder's lock
    assert second.wait(0, 1.0) == NEGOTIATE


def test_a_holding_block_counts_and_rings_under_one_lock_and_wakes_at_its_end(tmp_path,
                                                                               monkeypatch):
    first, second = shm_doorbells(tmp_path)
    wakes = _recorded_wakes(monkeypatch)
    waiter, woke = _waiting(first, 0)
    flocks: list[int] = []
    real_flock = shm_doorbell.fcntl.flock
    monkeypatch.setattr(shm_doorbell.fcntl, "flock",
                        lambda fd, op: (flocks.append(op), real_flock(fd, op))[1])
    with second.holding():
        assert second.count("unit") == 1
        assert second.ring(0, b"unit@1") == b"unit@1"
        assert wakes == []  # the lock is still held: the wake waits for the block's end
    assert wakes == [second._word_address]
    taken = [op for op in flocks if op != shm_doorbell.fcntl.LOCK_UN]
    assert len(taken) == 1  # the count and the ring shared one hold
    waiter.join(10.0)
    assert woke == [b"unit@1"]
    assert first.count("unit") == 2  # the lock was let go: the peer counts


def test_a_ring_that_waits_for_a_lagging_peer_lets_it_in_from_a_holding_block(tmp_path,
                                                                              monkeypatch):
    first, second = shm_doorbells(tmp_path)
    monkeypatch.setattr(shm_doorbell, "_ROUNDS", 2)  # entries reused every other round
    assert first.ring(0, NEGOTIATE) == NEGOTIATE
    assert first.wait(0, 1.0) == second.wait(0, 1.0) == NEGOTIATE
    assert first.wait(1, 0.0) is None  # rank 0 waits for round 1: past round 0
    # Round 2 reuses round 0's entry, which waits for rank 1 to wait for a later round: rank 1
    # must take the lock that rank 0's holding block holds to say so.
    ringer = threading.Thread(target=lambda: _ring_held(first, 2))
    ringer.start()
    time.sleep(0.01)
    assert second.wait(1, 0.01) is None  # under the lock, between the ringer's naps
    ringer.join(10.0)
    assert not ringer.is_alive()
    assert second.wait(2, 1.0) == b"later@1"


def _ring_held(bell: ShmDoorbell, round_: int) -> None:
    with bell.holding():
        bell.ring(round_, b"later@1")
