"""DistributedOptimizer across world changes (``shutdown()``, ``init()``), as an elastic reset
makes them: a world of 2 shrinks to 1 and grows back, with a step left in flight at the change.

Each rank trains on its own data, so the gradients tell which world reduced them: the average
of both ranks' in a world of 2, this rank's own in a world of 1.
"""

from __future__ import annotations

import torch

import ringtrain.torch as hvd


def _model_and_data(rank: int) -> tuple[torch.nn.Linear, torch.Tensor]:
    torch.manual_seed(0)
    # d sum(model(x)) / d weight = the column sums of x: 2 * (rank + 1) for every element
    return torch.nn.Linear(4, 1), torch.full((2, 4), float(rank + 1))


def _step(model: torch.nn.Linear, optimizer: torch.optim.Optimizer, x: torch.Tensor,
          passes: int = 1) -> list[float]:
    optimizer.zero_grad()
    for _ in range(passes):
        model(x).sum().backward()
    optimizer.step()
    assert model.weight.grad is not None
    return model.weight.grad.flatten().tolist()


def _shrink_to_one_and_grow_back(passes: int) -> dict:
    rank = hvd.rank()
    model, x = _model_and_data(rank)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters(),
                                         backward_passes_per_step=passes)
    out: dict = {"two": _step(model, optimizer, x, passes)}
    # A step begun and never finished: its buckets belong to the world about to go.
    optimizer.zero_grad()
    for _ in range(passes):
        model(x).sum().backward()
    # Both ranks submitted the step before either leaves the world (a rank whose peer shut down
    # first would fail its submission, as an elastic reset expects, not leave it in flight).
    hvd.barrier()
    hvd.shutdown()
    optimizer.zero_grad()  # between worlds: the old world's step is gone, nothing is refused
    hvd.init(comm=[rank])  # a world of this rank alone
    try:
        out["size"] = hvd.size()
        out["one"] = [_step(model, optimizer, x, passes) for _ in range(3)]
        if passes > 1:  # the passes are still counted at size 1: one too many is refused
            optimizer.zero_grad()
            try:
                for _ in range(passes + 1):
                    model(x).sum().backward()
            except AssertionError as e:
                out["too_many"] = str(e)
            optimizer.synchronize()  # ends the refused step at size 1
            with optimizer.skip_synchronize():
                optimizer.step()
    finally:
        hvd.shutdown()
        hvd.init()
    out["two_again"] = _step(model, optimizer, x, passes)
    return out


def test_the_optimizer_shrinks_to_one_rank_and_grows_back(world2):
    for rank, out in enumerate(world2.run(_shrink_to_one_and_grow_back, 1)):
        assert out["size"] == 1
        assert out["two"] == [3.0] * 4  # (2 + 4) / 2
        assert out["one"] == [[2.0 * (rank + 1)] * 4] * 3  # its own: nothing reduced
        assert out["two_again"] == [3.0] * 4


def test_accumulated_passes_restart_in_each_world(world2):
    for rank, out in enumerate(world2.run(_shrink_to_one_and_grow_back, 2)):
        assert out["size"] == 1
        assert out["two"] == [6.0] * 4  # (4 + 8) / 2
        # a step's passes add up locally; at size 1 nothing more happens to them
        assert out["one"] == [[4.0 * (rank + 1)] * 4] * 3
        assert "backward_passes_per_step" in out["too_many"]
        assert out["two_again"] == [6.0] * 4  # (4 + 8) / 2, the step left over forgotten


def _built_alone_then_grown() -> list[float]:
    rank = hvd.rank()
    hvd.shutdown()
    hvd.init(comm=[rank])
    try:
        model, x = _model_and_data(rank)
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                             named_parameters=model.named_parameters())
        _step(model, optimizer, x)
    finally:
        hvd.shutdown()
        hvd.init()
    return _step(model, optimizer, x)


def test_an_optimizer_made_in_a_world_of_one_averages_once_the_world_grows(world2):
    assert world2.run(_built_alone_then_grown) == [[3.0] * 4] * 2
