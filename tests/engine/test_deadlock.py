"""Deadlock detection in the engine, with N ranks as threads of this process: when a rank counts
as blocked (every thread that submits waits, with no timeout, for a pending operation), and that
ranks blocked on operations the others never submit fail together while the engine goes on."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import torch

from ringtrain.errors import DeadlockError
from tests.engine.calls import results, submit, wait_until
from tests.engine.thread_world import ThreadWorld

pytestmark = pytest.mark.timeout(30)

#: Real seconds a test lets the engines take (they probe every few milliseconds here).
_BOUND_S = 10.0


def _rounds(world: ThreadWorld, clock, n: int, until: Callable[[], bool] = lambda: False) -> None:
    """Move the clock a second at a time, ``n`` times, each time until a negotiation round has
    run entirely after the move (the watches ring for waiting requests; deadlock checks come at
    least every 5 s of the clock), or ``until`` holds."""
    for _ in range(n):
        clock.advance(1.0)
        done = world.completed["control_allreduce"]
        wait_until(lambda: until() or world.completed["control_allreduce"] >= done + 2,  # noqa: B023
                   "a round after the clock moved")


class _Waits:
    """Threads that each submit one allreduce on a rank and wait for it with no timeout."""

    def __init__(self):
        self.outcomes: dict[str, object] = {}
        self._threads: list[threading.Thread] = []

    def start(self, engine, name: str, ranks: tuple[int, ...] | None = None) -> None:
        """Start the thread; return once it has submitted (later clock moves age the request)."""
        submitted = threading.Event()

        def run() -> None:
            try:
                handle = submit(engine, name, torch.ones(1), ranks=ranks)
                submitted.set()
                self.outcomes[name] = handle.wait().tolist()
            except RuntimeError as exc:
                self.outcomes[name] = exc
        thread = threading.Thread(target=run, name=f"waits.{name}", daemon=True)
        thread.start()
        self._threads.append(thread)
        assert submitted.wait(_BOUND_S), f"{name} was not submitted"

    def settle(self, world: ThreadWorld, clock, count: int) -> None:
        """Age the requests round by round until ``count`` outcomes (or the bound)."""
        deadline = time.monotonic() + _BOUND_S
        while len(self.outcomes) < count and time.monotonic() < deadline:
            _rounds(world, clock, 1, until=lambda: len(self.outcomes) >= count)
        for thread in self._threads:
            thread.join(_BOUND_S)


def test_ranks_waiting_for_operations_nobody_else_submits_fail_and_the_engine_goes_on(
        start_engines, clock):
    world, engines = start_engines(2, probe_s=0.005)
    waits = _Waits()
    waits.start(engines[0], "a")
    waits.start(engines[1], "b")
    waits.settle(world, clock, 2)
    for name, other in (("a", 1), ("b", 0)):
        error = waits.outcomes[name]
        assert isinstance(error, DeadlockError), error
        assert (f"rank {1 - other} waits for allreduce '{name}' (not submitted by rank(s) "
                f"[{other}])") in str(error)
    assert results([submit(e, "after", torch.ones(1)) for e in engines]) == [[2.0]] * 2


def test_two_members_of_a_process_set_deadlock_while_a_rank_outside_it_computes(
        start_engines, clock):
    world, engines = start_engines(3, probe_s=0.005)
    pair = (0, 1)
    for engine in engines:
        world.backend(engine.rank).add_set(pair)
    waits = _Waits()
    waits.start(engines[0], "a", pair)
    waits.start(engines[1], "b", pair)
    waits.settle(world, clock, 2)
    for name in ("a", "b"):
        assert isinstance(waits.outcomes[name], DeadlockError), waits.outcomes
        assert "deadlock: rank(s) [0, 1] wait" in str(waits.outcomes[name])
    assert results([submit(e, "after", torch.ones(1)) for e in engines]) == [[3.0]] * 3


def test_a_thread_that_submitted_and_does_not_wait_keeps_its_rank_unblocked(start_engines,
                                                                            clock):
    world, engines = start_engines(2, probe_s=0.005)
    release, submitted = threading.Event(), threading.Event()

    def computes() -> None:  # submits on rank 1, then computes until released
        submit(engines[1], "c", torch.ones(1))
        submitted.set()
        release.wait(_BOUND_S)

    other = threading.Thread(target=computes, daemon=True)
    other.start()
    assert submitted.wait(_BOUND_S)
    waits = _Waits()
    waits.start(engines[0], "a")
    waits.start(engines[1], "b")
    _rounds(world, clock, 30)  # many rounds, deadlock checks among them (every 5 s of the clock)
    assert waits.outcomes == {}
    release.set()  # the thread ends: every submitter of rank 1 now waits
    other.join(_BOUND_S)
    waits.settle(world, clock, 2)
    assert all(isinstance(e, DeadlockError) for e in waits.outcomes.values()), waits.outcomes


def test_a_wait_with_a_timeout_is_not_blocked(start_engines, clock):
    world, engines = start_engines(2, probe_s=0.005)
    waits = _Waits()
    waits.start(engines[1], "b")
    outcome: list = []
    submitted = threading.Event()

    def wait_timed() -> None:  # the only submitter of rank 0
        handle = submit(engines[0], "a", torch.ones(1))
        submitted.set()
        try:
            handle.wait(3.0)
        except TimeoutError as exc:
            outcome.append((exc, handle.done()))

    thread = threading.Thread(target=wait_timed, daemon=True)
    thread.start()
    assert submitted.wait(_BOUND_S)
    _rounds(world, clock, 30)
    thread.join(_BOUND_S)
    # nothing failed it meanwhile: it simply timed out, still pending
    assert [(type(e), done) for e, done in outcome] == [(TimeoutError, False)]
    assert waits.outcomes == {}


def test_sixteen_ranks_in_a_ring_of_pairs_deadlock_only_once_the_ring_closes(start_engines,
                                                                              clock):
    # rank r waits for an operation of the pair (r, r + 1) that r + 1 never submits: while one
    # rank still computes, everybody may still go on; the last to block closes the cycle
    size = 16
    world, engines = start_engines(size, probe_s=0.005)
    pairs = [tuple(sorted((r, (r + 1) % size))) for r in range(size)]
    for pair in pairs:
        for rank in pair:
            world.backend(rank).add_set(pair)
    waits = _Waits()
    for r in range(size - 1):
        waits.start(engines[r], f"op.{r}", pairs[r])
    _rounds(world, clock, 12)  # deadlock checks among them (every 5 s of the clock at least)
    assert waits.outcomes == {}
    waits.start(engines[size - 1], f"op.{size - 1}", pairs[size - 1])
    waits.settle(world, clock, size)
    messages = {str(e) for e in waits.outcomes.values()}
    assert len(waits.outcomes) == size and len(messages) == 1  # one report, on every rank
    (message,) = messages
    assert message.startswith(f"deadlock: rank(s) {list(range(size))} wait")
    assert "rank 14 waits for allreduce 'op.14' (not submitted by rank(s) [15])" in message
    assert "and 8 more" not in message  # one pending operation each
