"""The control vector: what a rank offers, each rank's vector packed, added up as
``control_allreduce`` does, and read back."""

from __future__ import annotations

from dataclasses import replace

import torch

from ringtrain.engine import control
from ringtrain.engine.control import ControlVector
from ringtrain.engine.negotiation import Response
from ringtrain.engine.response_cache import ResponseCache
from ringtrain.op_types import OpType
from tests.engine.calls import request


def _vector(rank: int, bits: set[int], **flags) -> ControlVector:
    flags = {"full_exchange": False, "shutdown": False, "joined": False,
             "deadlock_check": False, **flags}
    return ControlVector.of_rank(rank, 3, 4, bits, wait_state=10 * (rank + 1), **flags)


def test_the_sum_of_the_ranks_vectors_counts_flags_and_offers_and_keeps_each_wait_state():
    vectors = [_vector(0, {0, 2}), _vector(1, {2}, shutdown=True, joined=True),
               _vector(2, {2, 3}, shutdown=True)]
    total = ControlVector.unpack(sum(v.pack() for v in vectors), 3)

    assert total == ControlVector(full_exchange=0, shutdown=2, joined=1, deadlock_check=0,
                                  wait_states=[10, 20, 30], offers=[1, 0, 3, 1])
    assert not total.decides_by_counts  # a joined rank: the metas are exchanged


def test_a_rank_vector_is_its_flags_then_one_wait_state_per_rank_then_one_count_per_response():
    packed = _vector(1, {3}, deadlock_check=True).pack().tolist()
    assert packed == [0, 0, 0, 1, 0, 20, 0, 0, 0, 0, 1]


def test_counts_decide_alone_unless_a_rank_wants_an_exchange_has_joined_or_a_check():
    assert _vector(0, {1}).decides_by_counts
    for flag in ("full_exchange", "joined", "deadlock_check"):
        assert not _vector(0, {1}, **{flag: True}).decides_by_counts, flag
    assert _vector(0, set(), shutdown=True).decides_by_counts


def test_a_rank_offers_its_cached_requests_and_says_whether_one_is_new_or_a_join():
    cache = ResponseCache(8)
    known = request(0, (0, 1), "known", torch.ones(1))
    cache.put(Response("known", OpType.ALLREDUCE, {0: known.meta, 1: replace(known.meta, rank=1)}))
    assert control.offers([known], cache) == ({0}, False, False)
    new = request(0, (0, 1), "new", torch.ones(1))
    join = request(0, (0, 1), "join", op=OpType.JOIN)
    assert control.offers([known, new, join], cache) == ({0}, True, True)
