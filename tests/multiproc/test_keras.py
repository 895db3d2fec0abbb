"""ringtrain.keras on real 2-rank worlds: identical weights after fit from different seeds,
averaged metrics, Horovod's warmup numbers, collectives per step, values and elastic sync."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

hvd = pytest.importorskip("ringtrain.keras")
import keras

from ringtrain.keras.collectives import is_seed_state

COLLECTIVES = {"ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER", "BARRIER"}


def _cnn() -> keras.Model:
    return keras.Sequential([
        keras.Input((12, 12, 3)), keras.layers.RandomFlip("horizontal"),
        keras.layers.Conv2D(8, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Dropout(0.25), keras.layers.Flatten(),
        keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4, activation="softmax")])


def _data(seed: int, n: int = 64):
    rng = np.random.default_rng(seed)
    return (rng.random((n, 12, 12, 3), dtype=np.float32),
            keras.utils.to_categorical(rng.integers(0, 4, n), 4))


def _digest(variables) -> str:
    h = hashlib.sha256()
    for v in variables:
        h.update(np.ascontiguousarray(keras.ops.convert_to_numpy(v)).tobytes())
    return h.hexdigest()


class _RawLogs(keras.callbacks.Callback):
    """Copies the epoch-end logs before MetricAverageCallback averages them."""

    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(dict(logs))


def _fit_from_different_seeds() -> dict:
    keras.utils.set_random_seed(100 + hvd.rank())  # different initial weights and dropout
    model = _cnn()
    initial = _digest(model.variables)
    model.compile(loss="categorical_crossentropy", metrics=["accuracy"],
                  optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)))
    raw = _RawLogs()
    x, y = _data(hvd.rank())  # each rank its own data
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0, validation_data=_data(7, 32),
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), raw,
                                   hvd.callbacks.MetricAverageCallback()])
    weights = [v for v in model.variables if not is_seed_state(v)]
    seeds = [v for v in model.variables if is_seed_state(v)]
    return {"initial": initial, "final": _digest(weights), "seeds": _digest(seeds),
            "optimizer": _digest(model.optimizer.variables), "raw": raw.epochs,
            "history": history.history}


def test_fit_ends_with_identical_weights_and_averaged_metrics(world2):
    r0, r1 = world2.run(_fit_from_different_seeds, timeout=240)
    assert r0["initial"] != r1["initial"]
    assert r0["final"] == r1["final"] and r0["optimizer"] == r1["optimizer"]
    assert r0["seeds"] != r1["seeds"]  # each rank keeps its own dropout/augmentation draws
    assert r0["history"] == r1["history"]
    for key, values in r0["history"].items():
        for epoch, value in enumerate(values):
            mean = (r0["raw"][epoch][key] + r1["raw"][epoch][key]) / 2
            assert value == pytest.approx(mean, rel=1e-12), key
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(r0["history"])
    assert r0["raw"][0]["loss"] != r1["raw"][0]["loss"]  # there was something to average


class _LearningRates(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = []

    def on_train_batch_begin(self, batch, logs=None):
        opt = self.model.optimizer
        self.seen.append((float(keras.ops.convert_to_numpy(opt.learning_rate)), opt.momentum))


def _warmup() -> list:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(
        keras.optimizers.SGD(0.8, momentum=0.5)))
    rec = _LearningRates()
    x = np.ones((32, 3), np.float32)
    model.fit(x, np.zeros((32, 2), np.float32), batch_size=8, epochs=3, verbose=0,
              callbacks=[hvd.callbacks.LearningRateWarmupCallback(0.8, warmup_epochs=2), rec])
    return rec.seen


def test_warmup_follows_horovods_formula(world2):
    seen, other = world2.run(_warmup)
    assert seen == other
    size, warmup, steps, lr = 2, 2, 4, 0.8
    expected = []
    for epoch in range(2):
        for batch in range(steps):
            e = epoch + (batch + 1) / steps  # Horovod's shift: each epoch ends on a round value
            expected.append(lr / size * (e * (size - 1) / warmup + 1))
    lrs = [s[0] for s in seen]
    np.testing.assert_allclose(lrs[:8], expected, rtol=1e-6)
    assert lrs[0] == pytest.approx(lr / size * (1 + 1 / (steps * warmup)), rel=1e-6)
    assert lrs[7] == pytest.approx(lr, rel=1e-6)  # warmup done: initial_lr
    np.testing.assert_allclose(lrs[8:], [lr] * 4, rtol=1e-6)  # after the warmup: untouched
    # momentum corrected by new_lr / old_lr within each changed batch (old 0.8 at the start)
    assert seen[0][1] == pytest.approx(0.5 * expected[0] / 0.8, rel=1e-6)
    assert seen[1][1] == pytest.approx(0.5 * expected[1] / expected[0], rel=1e-6)


def _count_collectives(path: str, groups) -> int:
    keras.utils.set_random_seed(0)
    model = _cnn()
    model.compile(loss="categorical_crossentropy", optimizer=hvd.DistributedOptimizer(
        keras.optimizers.RMSprop(1e-3), groups=groups))
    x, y = _data(hvd.rank(), 64)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)  # warm-up: the response cache fills
    hvd.start_timeline(path)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)  # 4 steps
    hvd.stop_timeline()
    return len(model.trainable_variables)


@pytest.mark.parametrize("groups,per_step", [(None, 1), (2, 2)])
def test_collectives_per_step(world2, tmp_path, groups, per_step):
    path = str(tmp_path / "timeline.json")
    variables = world2.run(_count_collectives, path, groups, timeout=120)[0]
    events = json.loads(Path(path).read_text())
    collectives = [e for e in events if e.get("ph") == "X" and e.get("name") in COLLECTIVES]
    assert variables == 6
    # one bucket of all 6 gradients per step; groups=2: one grouped allreduce per group
    assert len(collectives) == 4 * per_step, collectives


def _values() -> dict:
    r = hvd.rank()
    return {
        "avg": hvd.allreduce(np.array([1.0, 2.0]) * (r + 1)).tolist(),
        "sum": hvd.allreduce(np.array([r + 1]), op=hvd.Sum).tolist(),
        "gather": hvd.allgather(np.full((r + 1, 2), r)).tolist(),
        "bcast": hvd.broadcast(np.array([r, r]), root_rank=1).tolist(),
        "scatter": hvd.reducescatter(np.arange(4.0).reshape(4, 1) * (r + 1), op=hvd.Sum).tolist(),
    }


def test_collectives_on_numpy_values(world2):
    r0, r1 = world2.run(_values)
    assert r0["avg"] == r1["avg"] == [1.5, 3.0]
    assert r0["sum"] == [3]
    assert r0["gather"] == r1["gather"] == [[0, 0], [1, 1], [1, 1]]
    assert r0["bcast"] == r1["bcast"] == [1, 1]
    assert r0["scatter"] == [[0.0], [3.0]] and r1["scatter"] == [[6.0], [9.0]]


def _elastic_sync() -> tuple[str, str, int]:
    keras.utils.set_random_seed(hvd.rank())
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    state = hvd.elastic.KerasState(model, optimizer=keras.optimizers.SGD(0.1),
                                   epoch=10 * hvd.rank())
    before = _digest(model.variables)
    state.sync()
    return before, _digest(model.variables), state.epoch


def test_elastic_state_sync_gives_every_rank_rank_0s_values(world2):
    (b0, a0, e0), (b1, a1, e1) = world2.run(_elastic_sync)
    assert b0 != b1 and a0 == a1 == b0 and e0 == e1 == 0


def _apply_per_rank(kwargs: dict) -> list:
    """One apply of rank-dependent gradients with SGD(1.0): the variables move by -reduced."""
    kwargs = dict(kwargs)
    if kwargs.pop("fp16", False):
        kwargs["compression"] = hvd.Compression.fp16
    if "op" in kwargs:
        kwargs["op"] = getattr(hvd, kwargs["op"])
    r = hvd.rank()
    a = keras.Variable(np.zeros(3, np.float32), name="a")
    b = keras.Variable(np.zeros((2, 2), np.float32), name="b")
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0), **kwargs)
    grad_b = None if r == 1 else np.full((2, 2), 4.0, np.float32)  # rank 1 did not use b
    import torch

    opt.apply([torch.tensor([1.0, 2.0, 3.0]) * (r + 1),
               None if grad_b is None else torch.tensor(grad_b)], [a, b])
    return [(-a.numpy()).tolist(), (-b.numpy()).tolist()]


@pytest.mark.parametrize("kwargs,scale", [
    ({}, 0.5), ({"op": "Sum"}, 1.0), ({"fp16": True}, 0.5),
    ({"gradient_predivide_factor": 2.0}, 0.5), ({"groups": 2}, 0.5)])
def test_reduced_gradients(world2, kwargs, scale):
    for a, b in world2.run(_apply_per_rank, kwargs):
        # a: ranks sent 1x and 2x [1, 2, 3]; b: only rank 0 had a gradient (4s), rank 1 sent
        # zeros, and both apply the reduced one: the replicas stay equal
        np.testing.assert_allclose(a, np.array([3.0, 6.0, 9.0]) * scale, rtol=1e-3)
        np.testing.assert_allclose(b, np.full((2, 2), 4.0 * scale), rtol=1e-3)


def _passes_across_worlds() -> list:
    """backward_passes_per_step=2: one pass in a world of 2, then two in a world of one."""
    import torch

    r = hvd.rank()
    a = keras.Variable(np.zeros(2, np.float32), name="a")
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0),
                                   backward_passes_per_step=2)
    grad = torch.tensor([1.0, 2.0]) * (r + 1)
    opt.apply([grad * 10], [a])  # half a step, never finished in this world
    hvd.shutdown()
    hvd.init(comm=[r])
    try:
        opt.apply([grad], [a])
        after_one = (-a.numpy()).tolist()
        opt.apply([grad], [a])
        after_two = (-a.numpy()).tolist()
    finally:
        hvd.shutdown()
        hvd.init()
    return [after_one, after_two]


def test_accumulated_passes_restart_in_a_new_world(world2):
    for r, (after_one, after_two) in enumerate(world2.run(_passes_across_worlds)):
        assert after_one == [0.0, 0.0]  # the first pass of the new world: counted only
        # the two passes of the new world, reduced over its one rank; the old pass dropped
        assert after_two == [2.0 * (r + 1), 4.0 * (r + 1)]
