"""ringtrain.keras on Keras' TensorFlow and JAX backends, 2 real ranks each: gradients reduced
inside the compiled train step, the broadcast and metric callbacks, load_model and the elastic
state. Each backend's world runs with its own KERAS_BACKEND; this process never imports keras
for them (it may hold keras on torch from other tests), so every function imports it itself.
"""

from __future__ import annotations

import hashlib
import importlib.util

import numpy as np
import pytest

from tests.multiproc.world import World

BACKENDS = {"tensorflow": "tensorflow", "jax": "jax"}  # backend: the library it needs


@pytest.fixture(scope="module", params=sorted(BACKENDS))
def backend_world(request):
    backend = request.param
    if importlib.util.find_spec(BACKENDS[backend]) is None:
        pytest.skip(f"{BACKENDS[backend]} is not installed "
                    "(the test extra has it: bash scripts/setup.sh)")
    world = World(2, env={"KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=180)
    yield backend, world
    world.close()


def _digest(variables) -> str:
    import keras

    h = hashlib.sha256()
    for v in variables:
        h.update(np.ascontiguousarray(keras.ops.convert_to_numpy(v)).tobytes())
    return h.hexdigest()


def _model(seed: int):
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(3)])


def _data():
    rng = np.random.default_rng(0)
    return rng.random((32, 6), dtype=np.float32), rng.random((32, 3), dtype=np.float32)


def _fit_from_different_seeds() -> dict:
    import keras

    import ringtrain.keras as hvd

    r = hvd.rank()
    model = _model(100 + r)  # different initial weights: the callback must broadcast rank 0's
    model.compile(loss="mse", metrics=["mae"],
                  optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)))
    raw: list[dict] = []
    copy_logs = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: raw.append(dict(logs)))
    rng = np.random.default_rng(r)  # each rank its own data
    x, y = rng.random((32, 6), dtype=np.float32), rng.random((32, 3), dtype=np.float32)
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), copy_logs,
                                   hvd.callbacks.MetricAverageCallback()])
    return {"final": _digest(model.variables), "optimizer": _digest(model.optimizer.variables),
            "history": history.history, "raw": raw}


def test_fit_ends_with_identical_weights_and_averaged_metrics(backend_world):
    _, world = backend_world
    r0, r1 = world.run(_fit_from_different_seeds, timeout=240)
    assert r0["final"] == r1["final"] and r0["optimizer"] == r1["optimizer"]
    assert r0["history"] == r1["history"]
    for key, values in r0["history"].items():
        for epoch, value in enumerate(values):
            mean = (r0["raw"][epoch][key] + r1["raw"][epoch][key]) / 2
            assert value == pytest.approx(mean, rel=1e-6), key
    assert r0["raw"][0]["loss"] != r1["raw"][0]["loss"]  # there was something to average


def _fit_halves_and_whole_batches() -> tuple[list, list]:
    """Rank r fits rows 8r..8r+8 of every 16 (after broadcast_variables of rank 0's weights);
    one process fits the whole batches of 16 from the same weights with the plain optimizer."""
    import keras

    import ringtrain.keras as hvd

    r = hvd.rank()
    x, y = _data()
    model = _model(100 + r)
    hvd.broadcast_variables(model.variables, root_rank=0)
    model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(
        keras.optimizers.SGD(0.1, momentum=0.5)))
    mine = np.concatenate([np.arange(i + 8 * r, i + 8 * r + 8) for i in range(0, 32, 16)])
    model.fit(x[mine], y[mine], batch_size=8, epochs=2, shuffle=False, verbose=0)
    alone = _model(100)  # rank 0's initial weights
    alone.compile(loss="mse", optimizer=keras.optimizers.SGD(0.1, momentum=0.5))
    alone.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    return ([keras.ops.convert_to_numpy(v) for v in model.trainable_variables],
            [keras.ops.convert_to_numpy(v) for v in alone.trainable_variables])


def test_two_ranks_on_half_batches_train_as_one_process_on_whole_ones(backend_world):
    _, world = backend_world
    for distributed, alone in world.run(_fit_halves_and_whole_batches, timeout=240):
        for d, a in zip(distributed, alone):
            np.testing.assert_allclose(d, a, rtol=1e-5, atol=1e-6)


def _load_model_and_train(path: str) -> dict:
    """Rank 0 saves a trained model; every rank resumes from it with hvd.load_model."""
    import keras

    import ringtrain.keras as hvd
    from ringtrain.keras.optimizer import is_distributed

    x, y = _data()
    if hvd.rank() == 0:
        model = _model(0)
        model.compile(loss="mse", optimizer=keras.optimizers.Adam(0.01))
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        model.save(path)
    hvd.allreduce(np.zeros(1), name="saved")  # the file is there for every rank
    loaded = hvd.load_model(path)
    iterations = int(keras.ops.convert_to_numpy(loaded.optimizer.iterations))
    rng = np.random.default_rng(hvd.rank())
    loaded.fit(rng.random((16, 6), dtype=np.float32), rng.random((16, 3), dtype=np.float32),
               batch_size=8, epochs=1, verbose=0)
    return {"distributed": is_distributed(loaded.optimizer), "iterations": iterations,
            "final": _digest(loaded.variables)}


def test_load_model_resumes_distributed(backend_world, tmp_path):
    _, world = backend_world
    r0, r1 = world.run(_load_model_and_train, str(tmp_path / "m.keras"), timeout=240)
    assert r0["distributed"] and r1["distributed"]
    assert r0["iterations"] == r1["iterations"] == 2  # the saved optimizer state
    assert r0["final"] == r1["final"]  # same file, reduced gradients: the replicas stay equal


def _elastic_state() -> dict:
    import keras

    import ringtrain.keras as hvd

    model = _model(hvd.rank())
    model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)))
    state = hvd.elastic.KerasState(model, epoch=10 * hvd.rank())
    state.sync()  # rank 0's weights and epoch everywhere
    synced = _digest(model.variables)
    x, y = _data()
    # Commits during fit read the state of the step just done (JAX keeps it outside the
    # variables while fit runs); restore brings the last commit back.
    model.fit(x, y, batch_size=16, epochs=1, verbose=0,
              callbacks=[hvd.elastic.CommitStateCallback(state)])
    committed = _digest(model.variables)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    moved = _digest(model.variables)
    state.restore()
    return {"synced": synced, "committed": committed, "moved": moved,
            "restored": _digest(model.variables), "epoch": state.epoch}


def test_elastic_state_commits_restores_and_syncs(backend_world):
    _, world = backend_world
    r0, r1 = world.run(_elastic_state, timeout=240)
    assert r0["synced"] == r1["synced"] and r0["epoch"] == r1["epoch"] == 0
    assert r0["committed"] == r1["committed"] != r0["synced"]
    assert r0["moved"] != r0["committed"] and r0["restored"] == r0["committed"]


def _fit_passes_and_whole_batches() -> dict:
    """backward_passes_per_step=2: rank r's two passes of each step are rows 16r..16r+16 of
    every 32, in halves of 8; one process fits the whole batches of 32 with the plain optimizer
    from the same weights. The sum of a step's passes is twice the whole batch's mean gradient,
    so the plain optimizer has twice the learning rate, unless the sums are averaged."""
    import keras

    import ringtrain.keras as hvd

    r = hvd.rank()
    rng = np.random.default_rng(0)
    x, y = rng.random((64, 6), dtype=np.float32), rng.random((64, 3), dtype=np.float32)
    mine = np.concatenate([np.arange(i + 16 * r, i + 16 * r + 16) for i in range(0, 64, 32)])
    out: dict = {}
    for average in (False, True):
        model = _model(100 + r)
        hvd.broadcast_variables(model.variables, root_rank=0)
        # Momentum: an update applied on a pass that only accumulates would move the weights.
        model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(
            keras.optimizers.SGD(0.1, momentum=0.5), backward_passes_per_step=2,
            average_aggregated_gradients=average))
        model.fit(x[mine], y[mine], batch_size=8, epochs=2, shuffle=False, verbose=0)
        alone = _model(100)
        alone.compile(loss="mse", optimizer=keras.optimizers.SGD(0.1 if average else 0.2,
                                                                 momentum=0.5))
        alone.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
        out[average] = {
            "distributed": [keras.ops.convert_to_numpy(v) for v in model.trainable_variables],
            "alone": [keras.ops.convert_to_numpy(v) for v in alone.trainable_variables],
            "iterations": int(keras.ops.convert_to_numpy(model.optimizer.iterations))}
    return out


def test_backward_passes_accumulate_inside_the_compiled_step(backend_world):
    _, world = backend_world
    for out in world.run(_fit_passes_and_whole_batches, timeout=240):
        for average in (False, True):
            assert out[average]["iterations"] == 8  # every pass counts, as in Horovod
            for d, a in zip(out[average]["distributed"], out[average]["alone"]):
                np.testing.assert_allclose(d, a, rtol=1e-5, atol=1e-6)


def _passes_across_worlds() -> list:
    """backward_passes_per_step=2 applied eagerly: one pass in a world of 2, then two in a
    world of one."""
    import keras

    import ringtrain.keras as hvd

    r = hvd.rank()
    a = keras.Variable(np.zeros(2, np.float32), name="a")
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0),
                                   backward_passes_per_step=2)
    grad = np.array([1.0, 2.0], np.float32) * (r + 1)
    opt.apply([grad * 10], [a])  # half a step, never finished in this world
    hvd.shutdown()
    hvd.init(comm=[r])
    try:
        opt.apply([grad], [a])
        after_one = (-keras.ops.convert_to_numpy(a)).tolist()
        opt.apply([grad], [a])
        after_two = (-keras.ops.convert_to_numpy(a)).tolist()
    finally:
        hvd.shutdown()
        hvd.init()
    return [after_one, after_two]


def test_accumulated_passes_restart_in_a_new_world(backend_world):
    _, world = backend_world
    for r, (after_one, after_two) in enumerate(world.run(_passes_across_worlds, timeout=240)):
        assert after_one == [0.0, 0.0]  # the first pass of the new world: counted only
        # the two passes of the new world, reduced over its one rank; the old pass dropped
        assert after_two == [2.0 * (r + 1), 4.0 * (r + 1)]
