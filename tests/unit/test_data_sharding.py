"""ShardedSampler: shards, per-epoch order, the three last-batch rules and mid-epoch resume."""

from __future__ import annotations

import pytest

from ringtrain.data.sharding import ShardedSampler


def _shards(n: int, world: int, batch: int, last_batch: str, epoch: int = 0) -> list[list[int]]:
    samplers = [ShardedSampler(range(n), batch, last_batch=last_batch, rank=r,
                               num_replicas=world, seed=3) for r in range(world)]
    for s in samplers:
        s.set_epoch(epoch)
    return [list(s) for s in samplers]


@pytest.mark.parametrize("n", [1, 7, 10, 24, 25])
def test_partial_covers_everything_with_equal_shards(n):
    shards = _shards(n, 3, 4, "partial")
    assert len({len(s) for s in shards}) == 1
    assert set().union(*shards) == set(range(n))
    assert sum(map(len, shards)) - n < 3  # padding only to a multiple of the ranks


@pytest.mark.parametrize("n", [7, 10, 24, 25])
def test_pad_gives_whole_batches_and_covers_everything(n):
    shards = _shards(n, 3, 4, "pad")
    assert all(len(s) % 4 == 0 and len(s) == len(shards[0]) for s in shards)
    assert set().union(*shards) == set(range(n))


@pytest.mark.parametrize("n", [7, 10, 24, 25])
def test_drop_gives_whole_batches_without_repeats(n):
    shards = _shards(n, 3, 4, "drop")
    flat = [i for s in shards for i in s]
    assert len(flat) == len(set(flat)) == (n // 12) * 12
    assert all(len(s) % 4 == 0 for s in shards)


def test_every_epoch_has_a_new_order_the_same_on_every_rank():
    assert _shards(24, 2, 4, "partial", epoch=0) != _shards(24, 2, 4, "partial", epoch=1)
    assert _shards(24, 2, 4, "partial", epoch=1) == _shards(24, 2, 4, "partial", epoch=1)


def test_resume_mid_epoch_skips_what_every_rank_processed():
    sampler = ShardedSampler(range(20), 2, rank=0, num_replicas=2, seed=5)
    peer = ShardedSampler(range(20), 2, rank=1, num_replicas=2, seed=5)
    sampler.record_batch(0, 2)
    sampler.record_batch(1, 2)
    done = set(sampler.indices[:4]) | set(peer.indices[:4])
    assert sampler.processed_indices == done
    state = sampler.state_dict()
    resumed = [ShardedSampler(range(20), 2, rank=r, num_replicas=2, seed=5) for r in range(2)]
    for s in resumed:
        s.load_state_dict(state)
    rest = [i for s in resumed for i in s]
    assert sorted(rest) == sorted(set(range(20)) - done)
    assert resumed[0].num_samples == 6


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="batch_size"):
        ShardedSampler(range(4), 0, rank=0, num_replicas=1)
    with pytest.raises(ValueError, match="last_batch"):
        ShardedSampler(range(4), 2, last_batch="keep", rank=0, num_replicas=1)
    with pytest.raises(ValueError, match="both"):
        ShardedSampler(range(4), 2, rank=0)
    with pytest.raises(ValueError, match="rank must be"):
        ShardedSampler(range(4), 2, rank=2, num_replicas=2)
