"""hvd.elastic: commit/restore/sync of a TorchState, ElasticSampler sharding and resume, run."""

from __future__ import annotations

import pytest
import torch

import ringtrain.torch as hvd
from ringtrain.errors import HorovodInternalError


def _model_and_optimizer(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _step(model, optimizer) -> None:
    optimizer.zero_grad()
    model(torch.randn(8, 4)).pow(2).sum().backward()
    optimizer.step()


def _snapshot(model, optimizer) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    params = [t.clone() for t in model.state_dict().values()]
    momenta = [s["momentum_buffer"].clone() for s in optimizer.state.values()]
    return params, momenta


def _equal(a, b) -> bool:
    return all(torch.equal(x, y) for xs, ys in zip(a, b) for x, y in zip(xs, ys))


def commit_restore_round_trip() -> dict[str, bool]:
    model, optimizer = _model_and_optimizer(0)
    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
    initial = _snapshot(model, optimizer)
    _step(model, optimizer)
    state.restore()  # no commit yet: back to construction time
    back_to_initial = _equal(_snapshot(model, optimizer), initial) and not optimizer.state
    _step(model, optimizer)
    state.epoch, state.batch = 1, 7
    state.commit()
    committed = _snapshot(model, optimizer)
    results = {"back_to_initial": back_to_initial}
    for attempt in range(2):  # a second restore must not see the first one's later steps
        _step(model, optimizer)
        state.epoch, state.batch = 5, 99
        state.restore()
        results[f"restored_{attempt}"] = (_equal(_snapshot(model, optimizer), committed)
                                          and (state.epoch, state.batch) == (1, 7))
    return results


def test_commit_and_restore_round_trip_model_optimizer_and_attributes(world2):
    for result in world2.run(commit_restore_round_trip):
        assert result == {"back_to_initial": True, "restored_0": True, "restored_1": True}


def replaced_model_becomes_committed() -> bool:
    model, optimizer = _model_and_optimizer(0)
    state = hvd.elastic.TorchState(model, optimizer)
    new_model, _ = _model_and_optimizer(1)
    state.model = new_model
    expected = new_model[0].weight.detach().clone()
    with torch.no_grad():
        new_model[0].weight.add_(1)
    state.restore()
    return state.model is new_model and torch.equal(new_model[0].weight, expected)


def test_assigning_a_new_model_to_the_state_tracks_it(world2):
    assert world2.run(replaced_model_becomes_committed) == [True, True]


def sync_from_rank_0() -> tuple[list[float], list[float], int, int]:
    model, optimizer = _model_and_optimizer(seed=100 + hvd.rank())
    _step(model, optimizer)
    state = hvd.elastic.TorchState(model, optimizer, epoch=hvd.rank())
    state.sync()
    params, momenta = _snapshot(model, optimizer)
    return ([t.float().sum().item() for t in params], [m.sum().item() for m in momenta],
            state.epoch, len(optimizer.state))


def test_sync_gives_every_rank_rank_0s_state(world2):
    rank0, rank1 = world2.run(sync_from_rank_0)
    assert rank0 == rank1
    assert rank0[2] == 0 and rank0[3] == 4  # every parameter has momentum


def shards(length: int, shuffle: bool) -> tuple[list[int], int]:
    sampler = hvd.elastic.ElasticSampler(list(range(length)), shuffle=shuffle, seed=3)
    return list(sampler), len(sampler)


def test_sampler_shards_in_rank_order_without_shuffle(world2):
    assert world2.run(shards, 10, False) == [([0, 2, 4, 6, 8], 5), ([1, 3, 5, 7, 9], 5)]


def test_sampler_shuffles_the_same_way_everywhere_and_pads_to_equal_shards(world2):
    (a, len_a), (b, len_b) = world2.run(shards, 11, True)
    assert len_a == len_b == len(a) == len(b) == 6
    assert sorted(set(a) | set(b)) == list(range(11))  # one index repeated as padding
    assert a != list(range(0, 11, 2))  # shuffled


def pad_with_fewer_indices_than_ranks() -> list[int]:
    sampler = hvd.elastic.ElasticSampler(range(1), shuffle=False)
    return list(sampler)


def test_sampler_pads_when_fewer_indices_remain_than_ranks(world2):
    assert world2.run(pad_with_fewer_indices_than_ranks) == [[0], [0]]


def resume_epoch() -> dict[str, object]:
    sampler = hvd.elastic.ElasticSampler(range(10), shuffle=False)
    state = hvd.elastic.TorchState(sampler=sampler, epoch=0)
    own_batch = sampler.get_indices(0, 2)
    sampler.record_batch(0, 2)  # rank 0 trained on [0, 2], rank 1 on [1, 3]: both record all
    state.commit()
    sampler.record_batch(1, 2)  # lost on restore
    state.restore()
    local = sorted(sampler.processed_indices)
    state.sync()  # the union: nobody repeats what another rank already did
    resumed = list(sampler)
    saved = sampler.state_dict()
    fresh = hvd.elastic.ElasticSampler(range(10), shuffle=False)
    fresh.load_state_dict(saved)
    fresh.set_epoch(1)
    return {"own": own_batch, "local": local, "synced": sorted(sampler.processed_indices),
            "resumed": resumed,
            "loaded": saved["processed_indices"] == sampler.processed_indices,
            "next_epoch": list(fresh)}


def test_sampler_resumes_an_epoch_from_the_committed_batches_of_every_rank(world2):
    rank0, rank1 = world2.run(resume_epoch)
    assert (rank0["own"], rank1["own"]) == ([0, 2], [1, 3])
    # Every rank knows the whole world's batch (ranks step together), so the record survives
    # the loss of any rank.
    assert rank0["local"] == rank1["local"] == [0, 1, 2, 3]
    assert rank0["synced"] == rank1["synced"] == [0, 1, 2, 3]
    assert (rank0["resumed"], rank1["resumed"]) == ([4, 6, 8], [5, 7, 9])
    assert rank0["loaded"] and rank1["loaded"]
    assert (rank0["next_epoch"], rank1["next_epoch"]) == ([0, 2, 4, 6, 8], [1, 3, 5, 7, 9])


def run_then_fail() -> dict[str, object]:
    model, optimizer = _model_and_optimizer(seed=hvd.rank())
    state = hvd.elastic.TorchState(model, optimizer, batch=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append("reset")])

    @hvd.elastic.run
    def train(state, steps):
        torch.manual_seed(0)  # same batches on both ranks: equal weights only if synced first
        for batch in range(steps):
            _step(state.model, state.optimizer)
            state.batch = batch
            state.commit()
        state.batch = 100
        raise HorovodInternalError("peer 1 is gone")

    try:
        train(state, 2)
    except HorovodInternalError as e:
        message = str(e)
    state.on_reset()
    weight = model[0].weight.sum().item()
    return {"message": message, "batch": state.batch, "weight": weight, "resets": resets}


def test_run_syncs_then_on_a_peer_failure_restores_the_commit_and_reraises(world2):
    rank0, rank1 = world2.run(run_then_fail)
    for result in (rank0, rank1):
        assert "peer 1 is gone" in result["message"]
        assert "This launch is not elastic" in result["message"]
        assert result["batch"] == 1 and result["resets"] == ["reset"]
    assert rank0["weight"] == rank1["weight"]


def test_state_base_class_needs_save_restore_sync():
    state = hvd.elastic.State()
    for method in (state.save, state.restore, state.sync):
        with pytest.raises(NotImplementedError):
            method()
