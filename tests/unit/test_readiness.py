"""Readiness counting: which rank's submission completes a unit on every member, with the
counters of a real LocalDoorbell (the store's add, in one process)."""

from __future__ import annotations

from ringtrain.engine.doorbell import LocalDoorbell
from ringtrain.engine.handle import Handle
from ringtrain.engine.negotiation import decide
from ringtrain.engine.readiness import Readiness
from ringtrain.engine.request import OpType, ReduceOp, Request, RequestMeta, TensorMeta
from ringtrain.engine.response_cache import ResponseCache


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
    return [Readiness(cache, store.count) for _ in range(size)]


def test_the_last_member_to_submit_completes_the_operation():
    rank0, rank1 = ranks_sharing(cached("a"))
    assert rank0.count([request("a", 0)]) is False
    assert rank1.count([request("a", 1)]) is True
    # the next submission of the same name starts counting again
    assert rank0.count([request("a", 0)]) is False
    assert rank1.count([request("a", 1)]) is True


def test_a_unit_completes_once_whatever_order_its_requests_came_in():
    rank0, rank1 = ranks_sharing(cached("a", "b", "c"))
    assert rank0.count([request(n, 0) for n in ("a", "b", "c")]) is False
    assert rank1.count([request(n, 1) for n in ("c", "a", "b")]) is True


def test_different_units_never_complete_each_other():
    rank0, rank1 = ranks_sharing(cached("a", "b"))
    assert rank0.count([request("a", 0), request("b", 0)]) is False
    assert rank1.count([request("a", 1)]) is False


def test_what_the_cache_does_not_know_needs_a_round_at_once():
    (rank0,) = ranks_sharing(cached("a"), size=1)
    first_time = request("new", 0)
    assert rank0.count([first_time]) is True and first_time.counted is None
    reshaped = request("a", 0, shape=(5,))
    assert rank0.count([reshaped, request("a", 0)]) is True
    join = Request(meta=RequestMeta("join", OpType.JOIN, 0, (0, 1), ()), outputs=[],
                   handle=Handle("join"))
    assert rank0.count([join]) is True


def test_a_unit_over_different_process_sets_is_not_counted():
    cache = cached("a")
    cache.put(decide([[meta("b", r, ranks=(0, 1, 2))] for r in range(3)]).responses[0])
    (rank0,) = ranks_sharing(cache, size=1)
    assert rank0.count([request("a", 0), request("b", 0, ranks=(0, 1, 2))]) is True


def test_a_full_exchange_renews_the_counter_and_pending_requests_count_again():
    cache = cached("a")
    rank0, rank1 = ranks_sharing(cache)
    pending = request("a", 0)
    assert rank0.count([pending]) is False
    old_key = pending.counted
    # a full exchange decides "a" again (say a peer missed the cache): every rank renews it
    cache.put(decide([[meta("a", 0)], [meta("a", 1)]]).responses[0])
    assert cache.counter_key(cache.lookup(meta("a", 0))) != old_key
    assert rank0.recount([pending]) is False and pending.counted != old_key
    assert rank1.count([request("a", 1)]) is True
    assert rank0.recount([pending]) is False  # unchanged key: not counted twice
