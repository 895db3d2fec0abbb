"""The spin policy: long spins only while every thread that can run has a core."""

from __future__ import annotations

import threading

from ringtrain.backends import spin
from ringtrain.backends.spin import (
    IDLE_SPIN_S,
    LOADED_SPIN_S,
    RECHECK_S,
    STALL_LIMIT,
    SpinPolicy,
)


class _Machine:
    """A machine whose kernel either keeps a stall total (``stalled_us``) or does not (None)."""

    def __init__(self, runnable: int | None, cores: int, stalled_us: int | None = None):
        self.runnable, self.cores, self.now, self.reads = runnable, cores, 0.0, 0
        self.stalled_us = stalled_us

    def read(self) -> int | None:
        self.reads += 1
        return self.runnable

    def policy(self) -> SpinPolicy:
        return SpinPolicy(lambda: self.stalled_us, self.read, lambda: self.cores,
                          lambda: self.now)

    def wait_a_window(self, stalled_share: float) -> None:
        """One recheck period passes, during which threads waited for a core this share of it."""
        self.now += RECHECK_S
        assert self.stalled_us is not None
        self.stalled_us += round(stalled_share * RECHECK_S * 1e6)


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


def test_after_the_first_window_the_time_threads_waited_for_a_core_decides() -> None:
    machine = _Machine(runnable=5, cores=2, stalled_us=10**9)
    policy = machine.policy()
    assert policy.spin_s() == LOADED_SPIN_S  # the first window: the runnable count at the instant
    machine.runnable = 9  # a count taken at a bad instant no longer matters
    machine.wait_a_window(stalled_share=STALL_LIMIT / 10)  # a kernel worker's moment
    assert policy.spin_s() == IDLE_SPIN_S
    machine.wait_a_window(stalled_share=0.5)  # a core short for half the window
    assert policy.spin_s() == LOADED_SPIN_S
    machine.wait_a_window(stalled_share=0.0)
    assert policy.spin_s() == IDLE_SPIN_S
    assert machine.reads == 1


def test_a_long_quiet_gap_between_waits_is_judged_over_the_whole_gap() -> None:
    machine = _Machine(runnable=2, cores=2, stalled_us=0)
    policy = machine.policy()
    assert policy.spin_s() == IDLE_SPIN_S
    machine.now += 100 * RECHECK_S
    machine.stalled_us = round(STALL_LIMIT * 50 * RECHECK_S * 1e6)  # half the limit
    assert policy.spin_s() == IDLE_SPIN_S


def test_the_process_policy_reads_this_machine() -> None:
    assert 0 < spin.spin_s() <= IDLE_SPIN_S
    assert spin._runnable() is None or spin._runnable() >= 1
    first = spin._stalled_us()
    if first is not None:  # Linux 4.20 and later with PSI on (this VM has it)
        second = spin._stalled_us()
        assert second is not None and 0 <= first <= second


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
