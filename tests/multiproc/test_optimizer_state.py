"""broadcast_optimizer_state with parameters that have no gradient or no state yet (frozen layers,
unused parameters, fresh optimizers), and the attributes Horovod's DistributedOptimizer exposes,
on real 2-rank worlds."""

from __future__ import annotations

import pytest
import torch

import ringtrain.torch as hvd


def _partly_frozen_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 3),
                                torch.nn.Linear(3, 2))
    model[0].requires_grad_(False)  # a frozen layer: parameters 0 and 1
    return model


def _state_summary(optimizer: torch.optim.Optimizer) -> dict[int, dict[str, float]]:
    return {index: {key: float(torch.as_tensor(value).double().sum())
                    for key, value in state.items()}
            for index, state in optimizer.state_dict()["state"].items()}


def _fresh_optimizer(wrap: bool) -> dict:
    model = _partly_frozen_model(seed=hvd.rank())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01 * (hvd.rank() + 1),
                                  weight_decay=0.5)
    if wrap:
        optimizer = hvd.DistributedOptimizer(optimizer,
                                             named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    before = [p.detach().clone() for p in model.parameters()]
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    # the state is created by a step, but weight decay does not move the parameters
    unchanged = all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    grads = [None if p.grad is None else float(p.grad.abs().sum()) for p in model.parameters()]
    state = _state_summary(optimizer)
    lr = optimizer.param_groups[0]["lr"]
    # Every rank now steps alike from the same state.
    optimizer.zero_grad()
    torch.manual_seed(5)
    model(torch.randn(6, 4)).pow(2).sum().backward()
    optimizer.step()
    params = [p.detach().clone() for p in model.parameters()]
    return {"grads": grads, "state": state, "lr": lr, "params": params, "unchanged": unchanged}


@pytest.mark.parametrize("wrap", [False, True], ids=["optimizer", "DistributedOptimizer"])
def test_a_fresh_optimizer_gets_state_for_its_trainable_parameters_only(world2, wrap):
    # Horovod: a zero gradient for every parameter that requires one, one local step, then the
    # root's state; frozen parameters get neither gradient nor state.
    root, other = world2.run(_fresh_optimizer, wrap)
    for result in (root, other):
        assert result["grads"] == [None, None, 0.0, 0.0, 0.0, 0.0]
        assert sorted(result["state"]) == [2, 3, 4, 5]
        assert all(s["step"] == 1.0 and s["exp_avg"] == 0.0 for s in result["state"].values())
        assert result["lr"] == 0.01 and result["unchanged"]
    assert root["state"] == other["state"]
    for a, b in zip(root["params"], other["params"]):
        assert torch.equal(a, b)


def _resumed_root_with_an_unused_parameter() -> dict:
    model = _partly_frozen_model(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if hvd.rank() == 0:  # the root resumed training in which the last layer was never used
        model[1](model[0](torch.randn(2, 4))).sum().backward()
        optimizer.step()
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    return _state_summary(optimizer)


def test_parameters_without_state_on_the_root_have_none_anywhere(world2):
    root, other = world2.run(_resumed_root_with_an_unused_parameter)
    assert sorted(root) == [2, 3]  # only the used, trainable layer has momentum
    assert other == root


def _sparse_embedding() -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 3, sparse=True), torch.nn.Linear(3, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hvd.broadcast_optimizer_state(optimizer, 0, model)  # Horovod's third argument: the model
    sparse = [p.grad.is_sparse for p in model.parameters()]
    optimizer.zero_grad()
    model(torch.tensor([[1, 2]])).sum().backward()
    optimizer.step()
    return {"sparse": sparse, "state": sorted(_state_summary(optimizer))}


def test_model_argument_makes_sparse_embeddings_zero_gradients_sparse(world2):
    for result in world2.run(_sparse_embedding):
        assert result["sparse"] == [True, False, False]
        assert result["state"] == [0, 1, 2]


def _parameter_names(named: bool) -> list[str]:
    model = _partly_frozen_model(seed=0)
    optimizer = torch.optim.SGD([{"params": model[0].parameters()},
                                 {"params": list(model[1].parameters())
                                  + list(model[2].parameters())}], lr=0.1)
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters() if named else None)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return [optimizer._parameter_names[p] for p in params]


def test_distributed_optimizer_exposes_horovods_parameter_names(world2):
    # Horovod 0.28.1: {parameter: name}, with generated names "allreduce.noname.<group>.<index>"
    # when named_parameters is not given.
    unnamed = ["allreduce.noname.0.0", "allreduce.noname.0.1", "allreduce.noname.1.0",
               "allreduce.noname.1.1", "allreduce.noname.1.2", "allreduce.noname.1.3"]
    named = ["0.weight", "0.bias", "1.weight", "1.bias", "2.weight", "2.bias"]
    assert world2.run(_parameter_names, False) == [unnamed, unnamed]
    assert world2.run(_parameter_names, True) == [named, named]


def _restore_mid_step() -> list[float]:
    model = _partly_frozen_model(seed=0)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    committed = optimizer.state_dict()
    model(torch.randn(2, 4)).sum().backward()  # gradients submitted; no step follows
    optimizer.load_state_dict(committed)  # what TorchState.restore() does after a failure
    optimizer.zero_grad()
    torch.manual_seed(3)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    return [float(p.detach().sum()) for p in model.parameters()]


def test_load_state_dict_forgets_the_gradients_of_an_unfinished_step(world2):
    # Horovod's DistributedOptimizer.load_state_dict clears its handles, so hvd.elastic can
    # restore it after a peer failed in the middle of a step.
    first, second = world2.run(_restore_mid_step)
    assert first == second
