"""The spin policy: long spins only while every runnable thread has a core."""

from __future__ import annotations

import threading

from ringtrain.backends import spin
from ringtrain.backends.spin import IDLE_SPIN_S, LOADED_SPIN_S, RECHECK_S, SpinPolicy


class _Machine:
    def __init__(self, runnable: int | None, cores: int):
        self.runnable, self.cores, self.now, self.reads = runnable, cores, 0.0, 0

    def read(self) -> int | None:
        self.reads += 1
        return self.runnable

    def policy(self) -> SpinPolicy:
        return SpinPolicy(self.read, lambda: self.cores, lambda: self.now)


def test_spins_long_while_every_runnable_thread_has_a_core() -> None:
    machine = _Machine(runnable=2, cores=2)
    assert machine.policy().spin_s() == IDLE_SPIN_S


def test_barely_spins_on_a_loaded_machine_or_one_that_does_not_say() -> None:
    assert _Machine(runnable=3, cores=2).policy().spin_s() == LOADED_SPIN_S
    assert _Machine(runnable=None, cores=64).policy().spin_s() == LOADED_SPIN_S


def test_reads_the_load_at_most_once_per_recheck_period() -> None:
    machine = _Machine(runnable=1, cores=2)
    policy = machine.policy()
    assert policy.spin_s() == IDLE_SPIN_S
    machine.runnable = 5  # the machine gets loaded
    machine.now += RECHECK_S / 2
    assert policy.spin_s() == IDLE_SPIN_S  # not read again yet
    assert machine.reads == 1
    machine.now += RECHECK_S
    assert policy.spin_s() == LOADED_SPIN_S
    assert machine.reads == 2


def test_the_process_policy_reads_this_machine() -> None:
    assert 0 < spin.spin_s() <= IDLE_SPIN_S
    assert spin._runnable() is None or spin._runnable() >= 1


def test_a_thread_that_limits_itself_spins_no_longer_than_its_cap() -> None:
    seen: list[float] = []

    def engine_like() -> None:
        spin.limit_this_thread(spin.BESIDE_PYTHON_SPIN_S)
        seen.append(spin.spin_s())

    thread = threading.Thread(target=engine_like)
    thread.start()
    thread.join(10.0)
    assert seen and seen[0] <= spin.BESIDE_PYTHON_SPIN_S
    assert getattr(spin._THREAD, "cap", None) is None  # other threads keep the policy's spins
