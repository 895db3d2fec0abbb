"""Pure negotiation, cache, fusion and topology logic."""

from __future__ import annotations

from ringtrain.engine import fusion
from ringtrain.engine.negotiation import decide
from ringtrain.engine.request import OpKey, RequestMeta, TensorMeta
from ringtrain.engine.response_cache import ResponseCache
from ringtrain.op_types import OpType, ReduceOp
from ringtrain.torch.topology import from_hostnames


def meta(name, rank, shape=(4,), op=OpType.ALLREDUCE, ranks=(0, 1), dtype="torch.float32",
         root=-1, age=0.0):
    return RequestMeta(name=name, op=op, rank=rank, set_ranks=ranks,
                       tensors=(TensorMeta(shape, dtype, "cpu"),), reduce_op=ReduceOp.SUM,
                       root_rank=root, age_s=age)


def test_ready_only_when_every_member_submitted():
    d = decide([[meta("a", 0), meta("b", 0)], [meta("b", 1)]])
    assert [r.name for r in d.responses] == ["b"]
    waiting = d.waiting[OpKey("a", (0, 1))]
    assert waiting.submitted == (0,) and waiting.missing == (1,)


def test_shape_mismatch_becomes_an_error_response_naming_each_rank():
    d = decide([[meta("a", 0, shape=(2,))], [meta("a", 1, shape=(3,))]])
    (response,) = d.responses
    assert "shape" in response.error and "rank 0: [2]" in response.error
    assert "rank 1: [3]" in response.error


def test_allgather_allows_different_first_dims_only():
    ok = decide([[meta("g", 0, (2, 3), OpType.ALLGATHER)],
                 [meta("g", 1, (5, 3), OpType.ALLGATHER)]])
    assert ok.responses[0].error is None
    bad = decide([[meta("g", 0, (2, 3), OpType.ALLGATHER)],
                  [meta("g", 1, (2, 4), OpType.ALLGATHER)]])
    assert "trailing dimensions" in bad.responses[0].error


def test_joined_rank_stands_in_for_allreduce_but_not_broadcast():
    join = RequestMeta(name="join", op=OpType.JOIN, rank=1, set_ranks=(0, 1), tensors=())
    d = decide([[meta("a", 0), meta("b", 0, op=OpType.BROADCAST, root=0)], [join]])
    by_name = {r.name: r for r in d.responses}
    assert by_name["a"].joined == (1,) and by_name["a"].error is None
    assert "join" in by_name["b"].error
    assert d.join_done is None


def test_join_completes_with_the_last_rank_to_join():
    joins = [[RequestMeta("join", OpType.JOIN, r, (0, 1, 2), (), age_s=age, offered_round=7)]
             for r, age in enumerate([5.0, 0.1, 2.0])]
    assert decide(joins).join_done == 1


def test_the_join_offered_in_a_later_round_is_last_whatever_the_clocks_say():
    # Rank 1 trained a step with rank 0 standing in, then joined: its join came rounds later,
    # although a rank descheduled before it measured made its age look older.
    joins = [[RequestMeta("join", OpType.JOIN, r, (0, 1), (), age_s=age, offered_round=rnd)]
             for r, (age, rnd) in enumerate([(0.010, 40), (0.030, 43)])]
    assert decide(joins).join_done == 1


def test_cache_hits_only_for_identical_requests():
    cache = ResponseCache(capacity=2)
    d = decide([[meta("a", 0)], [meta("a", 1)]])
    cache.put(d.responses[0])
    assert cache.lookup(meta("a", 0, age=3.0)) == 0
    assert cache.lookup(meta("a", 0, shape=(5,))) is None
    for name in ("b", "c"):
        cache.put(decide([[meta(name, 0)], [meta(name, 1)]]).responses[0])
    assert len(cache) == 2  # capacity reached: "c" is not cached
    assert cache.lookup(meta("c", 0)) is None


def test_a_renewed_response_keeps_its_match_and_a_replaced_one_drops_it():
    cache = ResponseCache(capacity=4)
    cache.put(decide([[meta("a", 0)], [meta("a", 1)]]).responses[0])
    submitted = meta("a", 0)
    assert cache.lookup(submitted) == 0
    key = cache.counter_key(0)
    cache.put(cache.response(0))  # a round decided by counts records the cached response
    assert cache.counter_key(0) != key  # a fresh readiness counter all the same
    assert cache.lookup(submitted) == 0
    # Renegotiated with another shape (a full exchange): the meta matched before no longer is.
    cache.put(decide([[meta("a", 0, shape=(8,))], [meta("a", 1, shape=(8,))]]).responses[0])
    assert cache.lookup(submitted) is None
    assert cache.lookup(meta("a", 0, shape=(8,))) == 0


def test_fusion_plan_groups_by_kind_and_threshold():
    small = [decide([[meta(n, 0, (256,))], [meta(n, 1, (256,))]]).responses[0]
             for n in ("a", "b", "c")]
    other = decide([[meta("d", 0, (256,), dtype="torch.float64")],
                    [meta("d", 1, (256,), dtype="torch.float64")]]).responses[0]
    big = decide([[meta("e", 0, (2_000_000,))], [meta("e", 1, (2_000_000,))]]).responses[0]
    batches = fusion.plan(small + [other, big], threshold_bytes=2048)
    names = [[r.name for r in b] for b in batches]
    assert names == [["a", "b"], ["c"], ["d"], ["e"]]


def test_topology_matches_horovod_for_two_hosts():
    hosts = ["a", "a", "b", "b", "b"]
    t = [from_hostnames(r, hosts) for r in range(5)]
    assert [(x.local_rank, x.local_size) for x in t] == [(0, 2), (1, 2), (0, 3), (1, 3), (2, 3)]
    assert [(x.cross_rank, x.cross_size) for x in t] == [(0, 2), (0, 2), (1, 2), (1, 2), (0, 1)]
    assert not t[0].homogeneous
