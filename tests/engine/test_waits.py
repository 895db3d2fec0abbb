"""The wait tracker, without threads: when a rank is blocked, what its wait state says, which
ranks count as blocked from two rounds' states, and when a blocked rank asks for a deadlock
check."""

from __future__ import annotations

from ringtrain.engine.request import OpKey, Request
from ringtrain.engine.waits import DEADLOCK_CHECK_S, WaitTracker
from tests.clock import FakeClock
from tests.engine.calls import request


class _Thread:
    """A thread as the tracker sees one: an id, alive or not."""

    def __init__(self, ident: int, alive: bool = True):
        self.ident = ident
        self.alive = alive

    def is_alive(self) -> bool:
        return self.alive


A, B = OpKey("a", (0, 1)), OpKey("b", (0, 1))


def _pending(*names: str, ranks: tuple[int, ...] = (0, 1)) -> dict[OpKey, Request]:
    return {OpKey(name, ranks): request(0, ranks, name) for name in names}


def test_a_rank_is_blocked_once_every_thread_that_submitted_waits_with_no_timeout():
    tracker = WaitTracker(0, enabled=True, clock=FakeClock())
    pending = _pending("a", "b")
    first, second = _Thread(1), _Thread(2)
    tracker.submitted(first)
    tracker.submitted(second)
    assert tracker.state(pending) == (0, set())

    tracker.began(pending[A].handle, first.ident)
    state, awaited = tracker.state(pending)
    assert (state, awaited) == (0, {A})  # the second thread may still submit anything

    tracker.began(pending[B].handle, second.ident)
    state, awaited = tracker.state(pending)
    assert state > 0 and awaited == {A, B}


def test_the_wait_state_changes_with_every_submission_and_every_wait():
    tracker = WaitTracker(0, enabled=True, clock=FakeClock())
    pending = _pending("a")
    thread = _Thread(1)
    tracker.submitted(thread)
    tracker.began(pending[A].handle, thread.ident)
    before, _ = tracker.state(pending)
    tracker.ended(pending[A].handle, thread.ident)
    assert tracker.state(pending) == (0, set())  # nobody waits now
    tracker.began(pending[A].handle, thread.ident)
    after, _ = tracker.state(pending)
    assert before and after and before != after  # blocked again, but not all along


def test_ended_threads_and_autograd_hooks_leave_the_rank_blocked():
    tracker = WaitTracker(0, enabled=True, clock=FakeClock())
    pending = _pending("a")
    waiter, ended, hooks = _Thread(1), _Thread(2, alive=False), _Thread(3)
    tracker.submitted(waiter)
    tracker.submitted(ended)  # submitted, then its thread ended
    with tracker.submitting_for_autograd():
        tracker.submitted(hooks)  # submits on behalf of a thread in backward()
    tracker.began(pending[A].handle, waiter.ident)
    assert tracker.state(pending)[0] > 0


def test_a_thread_with_several_waits_on_one_handle_waits_until_the_last_ends():
    tracker = WaitTracker(0, enabled=True, clock=FakeClock())
    pending = _pending("a")
    thread = _Thread(1)
    tracker.submitted(thread)
    for _ in range(2):
        tracker.began(pending[A].handle, thread.ident)
    tracker.ended(pending[A].handle, thread.ident)
    assert tracker.state(pending)[1] == {A}
    tracker.ended(pending[A].handle, thread.ident)
    assert tracker.state(pending) == (0, set())


def test_tracking_turned_off_never_blocks_but_still_names_what_threads_wait_for():
    tracker = WaitTracker(0, enabled=False, clock=FakeClock())
    pending = _pending("a")
    thread = _Thread(1)
    tracker.submitted(thread)
    tracker.began(pending[A].handle, thread.ident)
    assert tracker.state(pending) == (0, {A})


def test_ranks_count_as_blocked_with_the_same_state_in_two_consecutive_rounds():
    tracker = WaitTracker(0, enabled=True, clock=FakeClock())
    assert tracker.blocked([0, 5, 7]) == []  # no previous round to compare with
    assert tracker.blocked([0, 5, 8]) == [1]  # rank 2 did something in between
    assert tracker.blocked([3, 5, 8]) == [1, 2]
    assert tracker.blocked([3, 0, 8]) == [0, 2]


def test_a_blocked_rank_asks_for_a_check_when_its_peers_were_blocked_or_now_and_then():
    clock = FakeClock()
    tracker = WaitTracker(0, enabled=True, clock=clock)
    pending = _pending("a")
    thread = _Thread(1)
    tracker.submitted(thread)
    tracker.began(pending[A].handle, thread.ident)
    state, awaited = tracker.state(pending)
    assert not tracker.wants_check(state, awaited, pending)  # no previous round yet

    tracker.blocked([state, 0])  # blocked as now; its peer, rank 1, computing
    assert tracker.wants_check(state, awaited, pending)  # never asked: the first time
    assert not tracker.wants_check(state, awaited, pending)  # asked just now
    clock.advance(DEADLOCK_CHECK_S)
    assert tracker.wants_check(state, awaited, pending)

    tracker.blocked([state, 9])  # rank 1 blocked too: every member of "a"'s set
    assert tracker.wants_check(state, awaited, pending)
    tracker.blocked([state + 1, 9])  # this rank changed since: not blocked all along
    assert not tracker.wants_check(state, awaited, pending)
