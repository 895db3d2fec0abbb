"""Readiness counting: which rank's submission completes a unit on every member, with the
counters of a real LocalDoorbell (the store's add, in one process)."""

from __future__ import annotations

from ringtrain.engine.doorbell import NEGOTIATE, LocalDoorbell
from ringtrain.engine.handle import Handle
from ringtrain.engine.negotiation import decide
from ringtrain.engine.readiness import Readiness
from ringtrain.engine.request import Request, RequestMeta, TensorMeta
from ringtrain.engine.response_cache import ResponseCache
from ringtrain.op_types import OpType, ReduceOp


def meta(name, rank, shape=(4,), ranks=(0, 1), op=OpType.ALLREDUCE):
    return RequestMeta(name=name, op=op, rank=rank, set_ranks=ranks,
                       tensors=(TensorMeta(shape, "torch.float32", "cpu"),),
                       reduce_op=ReduceOp.SUM)


def request(name, rank, **kw) -> Request:
    return Request(meta=meta(name, rank, **kw), outputs=[], handle=Handle(name))


def cached(*names, ranks=(0, 1)) -> ResponseCache:
    """A cache as every rank holds it after one full exchange of ``names``."""
    cache = ResponseCache(capacity=16)
    for name in names:
        cache.put(decide([[meta(name, r, ranks=ranks)] for r in ranks]).responses[0])
    return cache


def ranks_sharing(cache: ResponseCache, size: int = 2) -> list[Readiness]:
    """One Readiness per rank, all adding to the same counters (one store)."""
    store = LocalDoorbell()
    return [Readiness(cache, store.count, store.read) for _ in range(size)]


def test_the_last_member_to_submit_rings_the_submission_it_completed():
    rank0, rank1 = ranks_sharing(cached("a"))
    first0, first1 = request("a", 0), request("a", 1)
    assert rank0.count([first0]) is None
    bell = rank1.count([first1])
    assert bell is not None and bell.endswith(b"@1")
    # every member's request carries the tag that the last member rings
    assert first0.counted == first1.counted == bell.decode()
    # the next submission of the same name is the next one
    second0, second1 = request("a", 0), request("a", 1)
    assert rank1.count([second1]) is None
    assert rank0.count([second0]) == second1.counted.encode() == bell.replace(b"@1", b"@2")


def test_a_unit_completes_once_whatever_order_its_requests_came_in():
    rank0, rank1 = ranks_sharing(cached("a", "b", "c"))
    assert rank0.count([request(n, 0) for n in ("a", "b", "c")]) is None
    assert rank1.count([request(n, 1) for n in ("c", "a", "b")]) is not None


def test_different_units_never_complete_each_other():
    rank0, rank1 = ranks_sharing(cached("a", "b"))
    assert rank0.count([request("a", 0), request("b", 0)]) is None
    assert rank1.count([request("a", 1)]) is None


def test_what_the_cache_does_not_know_needs_a_round_at_once():
    (rank0,) = ranks_sharing(cached("a"), size=1)
    first_time = request("new", 0)
    assert rank0.count([first_time]) == NEGOTIATE and first_time.counted is None
    reshaped = request("a", 0, shape=(5,))
    assert rank0.count([reshaped, request("a", 0)]) == NEGOTIATE
    join = Request(meta=RequestMeta("join", OpType.JOIN, 0, (0, 1), ()), outputs=[],
                   handle=Handle("join"))
    assert rank0.count([join]) == NEGOTIATE


def test_a_unit_over_different_process_sets_is_not_counted():
    cache = cached("a")
    cache.put(decide([[meta("b", r, ranks=(0, 1, 2))] for r in range(3)]).responses[0])
    (rank0,) = ranks_sharing(cache, size=1)
    assert rank0.count([request("a", 0), request("b", 0, ranks=(0, 1, 2))]) == NEGOTIATE


def test_a_full_exchange_renews_the_counter_and_pending_requests_count_again():
    cache = cached("a")
    rank0, rank1 = ranks_sharing(cache)
    pending = request("a", 0)
    assert rank0.count([pending]) is None
    old_tag = pending.counted
    # a full exchange decides "a" again (say a peer missed the cache): every rank renews it
    cache.put(decide([[meta("a", 0)], [meta("a", 1)]]).responses[0])
    assert not old_tag.startswith(cache.counter_key(cache.lookup(meta("a", 0))) + "@")
    assert rank0.recount([pending]) == [] and pending.counted != old_tag
    assert rank1.count([request("a", 1)]) == pending.counted.encode()
    assert rank0.recount([pending]) == []  # unchanged key: not counted twice


def test_a_submission_is_completed_once_every_member_counted_it():
    rank0, rank1 = ranks_sharing(cached("a"))
    mine, theirs = request("a", 0), request("a", 1)
    assert not rank0.completed(mine)  # not counted
    rank0.count([mine])
    assert not rank0.completed(mine)
    rank1.count([theirs])
    assert rank0.completed(mine) and rank1.completed(theirs)
    again = request("a", 0)
    rank0.count([again])  # the second submission: incomplete until rank 1's second
    assert not rank0.completed(again) and rank0.completed(mine)
