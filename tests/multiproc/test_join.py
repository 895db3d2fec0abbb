"""hvd.join() on real multi-rank Gloo worlds: what a joined rank contributes to its peers'
allreduces (grouped ones and process sets included), which collectives fail without it
(allgather too, as Horovod 0.28.1's own test_horovod_join_allgather requires), and
that unnamed collectives still meet after a join (they hung: the ranks that joined early had
skipped some, so their generated names no longer matched)."""

from __future__ import annotations

import re

import pytest
import torch

import ringtrain.torch as hvd


def _after_the_others_joined(name: str) -> None:
    """Return once every other rank has joined, so that join() has one answer: an allreduce
    the others never submit completes only with the zeros of ranks that joined."""
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name=name).item() == 1.0


def _while_one_has_joined(first: int) -> dict:
    r, n = hvd.rank(), hvd.size()
    last = max(i for i in range(n) if i != first)
    out: dict = {}
    if r != first:
        out["avg"] = hvd.allreduce(torch.full((2,), r + 1.0), name="join.avg").tolist()
        out["gathers"] = [_error_of(hvd.allgather, torch.full((r, 1), float(r)))
                          for _ in range(2)]  # unnamed
        out["grouped_sum"] = [t.tolist() for t in hvd.grouped_allreduce(
            [torch.ones(2), torch.full((3,), float(r))], op=hvd.Sum)]
        out["grouped_gather"] = _error_of(hvd.grouped_allgather,
                                          [torch.tensor([r]), torch.full((1, 2), r)])
        for root in (first, last):
            try:
                hvd.broadcast(torch.ones(2), root_rank=root, name=f"join.bcast.{root}")
                out[f"bcast.{root}"] = "no error"
            except RuntimeError as exc:
                out[f"bcast.{root}"] = str(exc)
        if r == last:
            _after_the_others_joined(f"join.last.{first}")
    out["last"] = hvd.join()
    # After every rank joined, unnamed collectives meet again on every rank.
    out["after"] = hvd.allgather(torch.tensor([r])).tolist()
    return out


def test_peers_go_on_while_a_rank_has_joined(world):
    n = world.size
    for first in (0, n - 1):  # the second round starts with generated names counted apart
        results = world.run(_while_one_has_joined, first, timeout=30)
        active = [i for i in range(n) if i != first]
        last = active[-1]
        for r, out in enumerate(results):
            assert out["last"] == last and out["after"] == list(range(n))
            if r == first:
                continue
            # zeros from the joined rank; Average divides by the size, as Horovod does
            assert out["avg"] == pytest.approx([sum(i + 1.0 for i in active) / n] * 2)
            # allgathers raise, as Horovod's test_horovod_join_allgather requires
            for message in [*out["gathers"], out["grouped_gather"]]:
                assert first in _joined_ranks_named(message, -1), message
                assert "only allreduce goes on with joined ranks" in message
            assert out["grouped_sum"] == [[n - 1.0] * 2, [float(sum(active))] * 3]
            # A peer whose broadcasts already failed may join before this rank's request
            # arrives, so a message can name it too; the first rank to join is always named.
            for root in (first, last):
                assert first in _joined_ranks_named(out[f"bcast.{root}"], root)
            assert r not in _joined_ranks_named(out[f"bcast.{last}"], last)


def _error_of(collective, *args) -> str:
    try:
        collective(*args)
    except RuntimeError as exc:
        return str(exc)
    return "no error"


def _joined_ranks_named(message: str, root: int) -> set[int]:
    """The ranks a broadcast's join error names; asserts the root is marked when among them."""
    named = re.search(r"rank\(s\) \[([\d, ]+)\]( \(the root\))? have already called join\(\)",
                      message)
    assert named, message
    ranks = {int(i) for i in named.group(1).split(",")}
    assert (named.group(2) is not None) == (root in ranks), message
    return ranks


def _in_a_process_set() -> dict:
    r = hvd.rank()
    pair = hvd.add_process_set([0, 1])
    out: dict = {}
    if r == 0:
        out["pair.avg"] = hvd.allreduce(torch.full((2,), 4.0), name="pair.avg",
                                        process_set=pair).tolist()
        out["pair.gather"] = _error_of(hvd.allgather, torch.ones(1, 2), None, pair)
    if r != 1:
        out["world.sum"] = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="world.sum").item()
    if r == 2:
        _after_the_others_joined("pair.last")
    out["last"] = hvd.join()
    hvd.remove_process_set(pair)
    return out


def test_a_process_set_goes_on_while_a_member_has_joined(world3):
    zero, one, two = world3.run(_in_a_process_set, timeout=30)
    assert zero["pair.avg"] == [2.0, 2.0]  # rank 1 added zeros; the set has two members
    assert "rank(s) [1] have already called join()" in zero["pair.gather"]
    assert zero["world.sum"] == two["world.sum"] == 2.0
    assert zero["last"] == one["last"] == two["last"] == 2
