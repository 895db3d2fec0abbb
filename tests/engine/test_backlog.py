"""The backlog, without threads: a request's way from submission through the queue and pending
to its response, and what a stopped engine does to the requests it still holds."""

from __future__ import annotations

import pytest

from ringtrain.engine.backlog import Backlog
from ringtrain.engine.negotiation import Response
from ringtrain.engine.request import OpKey, Request
from ringtrain.errors import HorovodInternalError
from tests.engine.calls import request


def _added(backlog: Backlog, *names: str, counted: str | None = None) -> list[Request]:
    made = []
    for name in names:
        made.append(request(0, (0, 1), name))
        made[-1].counted = counted
        backlog.add(made[-1], 5.0)
        backlog.queue.append(made[-1])
    return made


def test_a_name_in_flight_is_refused_and_free_again_once_decided():
    backlog = Backlog()
    (first,) = _added(backlog, "a")
    assert first.submitted_at == 5.0
    with pytest.raises(ValueError, match="'a' is already in flight"):
        backlog.add(request(0, (0, 1), "a"), 6.0)
    backlog.take_queue(3)
    backlog.wanted_by_peers.add(first.key)
    local = backlog.take_decided([Response("a", first.meta.op, {0: first.meta})])
    assert local == {OpKey("a", (0, 1)): first} and not backlog.pending
    assert not backlog.wanted_by_peers
    backlog.add(request(0, (0, 1), "a"), 7.0)


def test_a_negotiation_round_takes_the_whole_queue_and_stamps_its_round():
    backlog = Backlog()
    made = _added(backlog, "a", "b")
    backlog.take_queue(4)
    assert not backlog.queue and [k.name for k in backlog.pending] == ["a", "b"]
    assert [r.offered_round for r in made] == [4, 4]


def test_a_unit_round_takes_its_units_requests_wherever_they_wait_and_leaves_the_rest():
    backlog = Backlog()
    (taken_before,) = _added(backlog, "old", counted="u@1")
    backlog.take_queue(2)  # a negotiation round took it without running it
    _added(backlog, "x", counted="v@1")
    unit = _added(backlog, "a", "b", counted="u@1")
    _added(backlog, "y")
    backlog.caller_blocked.set()

    assert backlog.take_unit("u@1", 3) == [*unit, taken_before]
    assert [r.name for r in backlog.queue] == ["x", "y"]
    assert [r.offered_round for r in unit] == [3, 3] and taken_before.offered_round == 2
    assert backlog.caller_blocked.is_set()  # requests still queued: gathering news stands
    assert [r.name for r in backlog.take_unit("v@1", 4)] == ["x"]


def test_a_lone_unit_round_clears_the_blocked_caller_once_the_queue_is_empty():
    backlog = Backlog()
    (lone,) = _added(backlog, "lone", counted="k@1")
    backlog.caller_blocked.set()
    assert backlog.take_unit("k@1", 0) == [lone]
    assert not backlog.queue and not backlog.caller_blocked.is_set()


def test_the_express_round_takes_its_request_out_of_flight_and_leaves_later_ones_queued():
    backlog = Backlog()
    (lone,) = _added(backlog, "lone", counted="k@1")
    (later,) = _added(backlog, "later")  # submitted by another thread meanwhile
    backlog.wanted_by_peers.add(lone.key)
    backlog.caller_blocked.set()
    backlog.take_running(lone)
    assert list(backlog.queue) == [later] and backlog.caller_blocked.is_set()
    assert lone.key not in backlog.keys and not backlog.wanted_by_peers and not backlog.pending
    backlog.add(request(0, (0, 1), "lone"), 6.0)  # the name is free again
    backlog.take_running(later)
    assert not backlog.queue and not backlog.caller_blocked.is_set()


def test_a_failure_fails_every_request_held_and_every_later_submission_with_the_first_error():
    backlog = Backlog()
    queued, pending = _added(backlog, "q", "p")
    backlog.pending[pending.key] = backlog.queue.pop()
    first, later = HorovodInternalError("first"), HorovodInternalError("later")
    backlog.fail(first)
    backlog.fail(later)
    for made in (queued, pending):
        with pytest.raises(HorovodInternalError, match="first"):
            made.handle.wait(0)
    assert not backlog.keys and not backlog.queue and not backlog.pending
    with pytest.raises(HorovodInternalError, match="first"):
        backlog.add(request(0, (0, 1), "new"), 1.0)
