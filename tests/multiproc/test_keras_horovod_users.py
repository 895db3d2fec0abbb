"""ringtrain.keras on real 2-rank worlds, where Horovod's Keras users fell: resuming with rank 0
alone loading the checkpoint, ranks with different models, scalars through the collectives, and
rank-local variables."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

hvd = pytest.importorskip("ringtrain.keras")
import keras

from ringtrain.errors import TensorMismatchError
from ringtrain.keras.collectives import is_seed_state


def _model() -> keras.Model:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(
        keras.optimizers.SGD(0.05, momentum=0.9)))
    return model


def _digest(variables) -> str:
    h = hashlib.sha256()
    for v in variables:
        h.update(np.ascontiguousarray(keras.ops.convert_to_numpy(v)).tobytes())
    return h.hexdigest()


def _resume(path: str) -> dict:
    """Horovod's ImageNet example resuming: rank 0 loads the checkpoint, the others build a
    fresh model (in a process that built one before, as a test or a notebook does), then the
    first batch's broadcast gives them rank 0's state."""
    keras.utils.set_random_seed(hvd.rank())
    rng = np.random.default_rng(hvd.rank())
    x, y = rng.random((16, 3), dtype=np.float32), rng.random((16, 2), dtype=np.float32)
    before = _model()
    before.fit(x, y, batch_size=8, epochs=1, verbose=0,
               callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    if hvd.rank() == 0:
        before.save(path)
    hvd.broadcast(0, 0, name="saved")  # the file is written
    model = hvd.load_model(path) if hvd.rank() == 0 else _model()
    paths = [v.path for v in model.trainable_variables]
    model.fit(x, y, batch_size=8, epochs=1, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    return {"paths": paths, "iterations": int(model.optimizer.iterations),
            "weights": _digest([v for v in model.variables if not is_seed_state(v)]),
            "optimizer": _digest(model.optimizer.variables)}


def test_rank_0_resumes_from_a_checkpoint_the_others_from_a_fresh_model(world2, tmp_path):
    r0, r1 = world2.run(_resume, str(tmp_path / "checkpoint.keras"), timeout=120)
    assert r0["paths"] != r1["paths"]  # Keras named the variables differently on each rank
    assert r0["weights"] == r1["weights"] and r0["optimizer"] == r1["optimizer"]
    # 2 steps saved; 2 more on rank 0's state, which rank 1 took after its first batch
    assert r0["iterations"] == r1["iterations"] == 4


def _different_models() -> dict:
    units = 3 + hvd.rank()  # rank 0: Dense(3), rank 1: Dense(4)
    kernel = keras.Variable(np.zeros((2, units), np.float32), name="kernel")
    bias = keras.Variable(np.zeros(2, np.float32), name="bias")
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0))
    errors = []
    with pytest.raises(TensorMismatchError) as apply_error:
        opt.apply([torch.ones(2, units), torch.ones(2)], [kernel, bias])
    errors.append(str(apply_error.value))
    with pytest.raises(TensorMismatchError) as broadcast_error:
        hvd.broadcast_variables([bias, kernel], root_rank=0)
    errors.append(str(broadcast_error.value))
    with pytest.raises(TensorMismatchError) as count_error:
        hvd.broadcast_variables([bias] + [kernel] * hvd.rank(), root_rank=0, name="count")
    errors.append(str(count_error.value))
    return {"errors": errors, "after": float(hvd.allreduce(1.0))}


def test_ranks_with_different_models_get_an_error_naming_both_shapes(world2):
    for result in world2.run(_different_models):
        apply, broadcast, count = result["errors"]
        assert "variable 0" in apply and "(2, 3) float32 on rank 0" in apply
        assert "(2, 4) float32 on rank 1" in apply
        assert "variable 1" in broadcast and "(2, 3)" in broadcast and "(2, 4)" in broadcast
        assert "rank 0 has 1 variables, rank 1 has 2" in count
        assert result["after"] == 1.0  # the job goes on


def _scalars() -> dict:
    r = hvd.rank()
    epoch = hvd.broadcast(3 if r == 0 else 0, 0, name="resume_from_epoch")
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(loss="mse", optimizer="sgd")
    history = model.fit(np.ones((4, 2)), np.ones((4, 1)), epochs=epoch + 1,
                        initial_epoch=epoch, verbose=0)
    values = {
        "broadcast": epoch,
        "allreduce": hvd.allreduce(float(r)),
        "allreduce_0d": hvd.allreduce(np.array(r + 1.0, np.float32)),
        "allreduce_torch": hvd.allreduce(torch.tensor(float(r))),
        "allreduce_variable": hvd.allreduce(keras.Variable(float(r))),
        "broadcast_torch": hvd.broadcast(torch.tensor(r), 1),
        "broadcast_object": hvd.broadcast_object(7 if r == 0 else None, 0),
    }
    with pytest.raises(ValueError, match="scalar") as gather_error:
        hvd.allgather(r)
    return {"values": {k: (type(v).__name__, tuple(np.shape(v)), v.item() if hasattr(v, "item")
                           else v) for k, v in values.items()},
            "epochs": history.epoch, "gathered": hvd.allgather([r]).tolist(),
            "gather_error": str(gather_error.value)}


def test_a_scalar_comes_back_a_scalar(world2):
    for result in world2.run(_scalars):
        values = result["values"]
        assert values["broadcast"] == ("int64", (), 3)  # a number: a numpy number, as Horovod
        assert result["epochs"] == [3]  # usable as fit's initial_epoch
        assert values["allreduce"] == ("float64", (), 0.5)
        assert values["allreduce_0d"] == ("ndarray", (), 1.5)  # a 0-d array: a 0-d array
        assert values["allreduce_torch"] == ("Tensor", (), 0.5)
        assert values["allreduce_variable"] == ("Tensor", (), 0.5)
        assert values["broadcast_torch"] == ("Tensor", (), 1)
        assert values["broadcast_object"] == ("int", (), 7)
        # a scalar has no first dimension to gather along: refused, as Horovod refuses it
        assert "[value]" in result["gather_error"] and result["gathered"] == [0, 1]


def _local_variables(scale: bool) -> list:
    """Rank-dependent gradients with SGD(1.0): each variable moves by minus its gradient."""
    r = hvd.rank()
    shared = keras.Variable(np.zeros(2, np.float32), name="shared")
    local = keras.Variable(np.zeros(2, np.float32), name="local")
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), scale_local_gradients=scale)
    opt.register_local_var(local)
    grad = torch.tensor([1.0, 2.0]) * (r + 1)
    opt.apply([grad, grad], [shared, local])
    return [(-shared.numpy()).tolist(), (-local.numpy()).tolist()]


@pytest.mark.parametrize("scale", [True, False])
def test_local_variables_keep_their_own_gradient(world2, scale):
    for r, (shared, local) in enumerate(world2.run(_local_variables, scale)):
        assert shared == [1.5, 3.0]  # the average of 1x and 2x [1, 2]
        # not reduced; divided by the number of ranks with scale_local_gradients, as Horovod
        assert local == [(r + 1) * g / (2 if scale else 1) for g in (1.0, 2.0)]
