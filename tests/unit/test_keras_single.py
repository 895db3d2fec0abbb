"""ringtrain.keras in a world of one: the optimizer wrapper, the callbacks' numbers against
Horovod's formulas, load_model, the elastic state, and the backend check."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

hvd = pytest.importorskip("ringtrain.keras")
import keras

from ringtrain.keras.optimizer import is_distributed

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    torch.set_num_threads(1)
    hvd.init()
    yield
    hvd.shutdown()


def _model(units: int = 3) -> keras.Model:
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(units, activation="softmax")])


def _data(n: int = 64, seed: int = 0):
    rng = np.random.default_rng(seed)
    return (rng.random((n, 4), dtype=np.float32),
            keras.utils.to_categorical(rng.integers(0, 3, n), 3))


class _Recorder(keras.callbacks.Callback):
    """Records the optimizer's learning rate and momentum as each batch starts."""

    def __init__(self):
        super().__init__()
        self.lrs, self.momenta = [], []

    def on_train_batch_begin(self, batch, logs=None):
        opt = self.model.optimizer
        self.lrs.append(float(keras.ops.convert_to_numpy(opt.learning_rate)))
        self.momenta.append(getattr(opt, "momentum", None))


def test_wrapper_is_the_users_class_and_keeps_state():
    model = _model()
    plain = keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)
    model.compile(loss="categorical_crossentropy", optimizer=plain)
    model.fit(*_data(), batch_size=16, epochs=1, verbose=0)
    wrapped = hvd.DistributedOptimizer(plain)
    assert isinstance(wrapped, type(plain)) and type(wrapped).__name__ == "SGD"
    assert is_distributed(wrapped) and not is_distributed(plain)
    assert int(wrapped.iterations) == 4
    for a, b in zip(wrapped.variables, plain.variables):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))
    with pytest.raises(ValueError, match="already a DistributedOptimizer"):
        hvd.DistributedOptimizer(wrapped)
    with pytest.raises(ValueError, match="only supports Average and Sum"):
        hvd.DistributedOptimizer(plain, op=hvd.Adasum)
    with pytest.raises(TypeError, match="keras.optimizers.Optimizer"):
        hvd.DistributedOptimizer(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1))


@pytest.mark.parametrize("average", [False, True])
def test_backward_passes_accumulate_locally(average):
    var = keras.Variable(np.zeros(2, np.float32), name="w")
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0),
                                   backward_passes_per_step=2,
                                   average_aggregated_gradients=average)
    opt.apply([torch.tensor([1.0, 2.0])], [var])
    np.testing.assert_array_equal(var.numpy(), [0, 0])  # no update until the second pass
    assert int(opt.iterations) == 1  # ... but the pass counts, as in Horovod
    opt.apply([torch.tensor([3.0, 4.0])], [var])
    expected = np.array([-4.0, -6.0]) / (2 if average else 1)
    np.testing.assert_allclose(var.numpy(), expected)
    assert int(opt.iterations) == 2


def test_schedule_staircase_with_momentum_correction():
    model = _model()
    model.compile(loss="categorical_crossentropy",
                  optimizer=hvd.DistributedOptimizer(
                      keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)))
    schedule = hvd.callbacks.LearningRateScheduleCallback(
        initial_lr=0.1, multiplier=0.5, start_epoch=1, end_epoch=3)
    rec = _Recorder()
    history = model.fit(*_data(32), batch_size=16, epochs=4, verbose=0,
                        callbacks=[schedule, rec])
    # 2 batches per epoch; epoch e in [1, 3) gets 0.1 * 0.5 ** (e - 1), epoch 3 keeps the last
    np.testing.assert_allclose(rec.lrs, [0.1, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05], rtol=1e-6)
    # momentum corrected by new/old only in the batch where the rate changes
    np.testing.assert_allclose(rec.momenta, [0.9, 0.9, 0.9, 0.9, 0.45, 0.9, 0.9, 0.9], rtol=1e-6)
    np.testing.assert_allclose(history.history["lr"], [0.1, 0.1, 0.05, 0.05], rtol=1e-6)


def test_schedule_per_batch_with_callable_multiplier():
    model = _model()
    model.compile(loss="categorical_crossentropy", optimizer=keras.optimizers.Adam(0.2))
    schedule = hvd.callbacks.LearningRateScheduleCallback(
        initial_lr=0.2, multiplier=lambda epoch: 1.0 / (1 + epoch), staircase=False)
    rec = _Recorder()
    model.fit(*_data(64), batch_size=16, epochs=2, verbose=0, callbacks=[schedule, rec])
    epochs = [e + b / 4 for e in range(2) for b in range(4)]  # steps_per_epoch found: 4
    np.testing.assert_allclose(rec.lrs, [0.2 / (1 + e) for e in epochs], rtol=1e-6)
    assert rec.momenta == [None] * 8  # Adam has no momentum: nothing to correct


def test_warmup_is_flat_in_a_world_of_one():
    model = _model()
    model.compile(loss="categorical_crossentropy", optimizer=keras.optimizers.SGD(0.3))
    rec = _Recorder()
    history = model.fit(*_data(32), batch_size=16, epochs=2, verbose=0, callbacks=[
        hvd.callbacks.LearningRateWarmupCallback(0.3, warmup_epochs=2), rec])
    np.testing.assert_allclose(rec.lrs, [0.3] * 4, rtol=1e-6)  # initial_lr / 1 ... initial_lr
    assert len(history.history["lr"]) == 2
    with pytest.raises(ValueError, match="initial_lr"):
        hvd.callbacks.LearningRateScheduleCallback(None, 0.5)


def test_best_model_checkpoint_keeps_the_best(tmp_path):
    model = _model()
    model.compile(loss="categorical_crossentropy", optimizer=keras.optimizers.SGD(0.1))
    path = tmp_path / "best.keras"
    best = hvd.callbacks.BestModelCheckpoint(monitor="loss", mode="min", filepath=str(path))
    assert best.save_best_only
    x, y = _data()
    model.fit(x, y, batch_size=16, epochs=3, verbose=0, callbacks=[best])
    assert path.is_file() and best.best == pytest.approx(min(model.history.history["loss"]))


def test_load_model_round_trips_the_distributed_optimizer(tmp_path):
    keras.utils.set_random_seed(1)
    model = _model()
    model.compile(loss="categorical_crossentropy",
                  optimizer=hvd.DistributedOptimizer(keras.optimizers.RMSprop(0.01, momentum=0.5)))
    x, y = _data()
    model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = hvd.load_model(path)
    assert is_distributed(loaded.optimizer) and type(loaded.optimizer).__name__ == "RMSprop"
    assert int(loaded.optimizer.iterations) == 8
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))
    # plain Keras loads the same file with the plain optimizer
    assert not is_distributed(keras.saving.load_model(path).optimizer)
    # and training goes on identically from either
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    loaded.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    for a, b in zip(model.variables, loaded.variables):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b),
                                   rtol=1e-6)
    with pytest.raises(ValueError, match="legacy"):
        hvd.load_model(path, legacy_opts=True)


class _UsersOptimizer(keras.optimizers.RMSprop):
    """An optimizer class of the user's, as in Horovod's test_load_model_custom_objects."""


def _users_loss(y_true, y_pred):
    return keras.ops.mean(keras.ops.square(y_true - y_pred))


def test_load_model_calls_factories_given_for_classes(tmp_path):
    model = _model()
    model.compile(loss=_users_loss, optimizer=hvd.DistributedOptimizer(_UsersOptimizer(0.01)))
    model.fit(*_data(32), batch_size=16, epochs=1, verbose=0)
    path = tmp_path / "model.keras"
    model.save(path)
    made = []

    def factory(**kwargs):  # Horovod's form: Keras 2 called it with the optimizer's config
        made.append(kwargs["learning_rate"])
        return hvd.DistributedOptimizer(_UsersOptimizer(**kwargs))

    loaded = hvd.load_model(path, custom_objects={"_UsersOptimizer": factory,
                                                  "_users_loss": _users_loss})
    assert made == [pytest.approx(0.01)]
    assert type(loaded.optimizer).__name__ == "_UsersOptimizer"
    assert is_distributed(loaded.optimizer) and int(loaded.optimizer.iterations) == 2
    assert loaded.loss is _users_loss  # a function used as one stays itself
    # the class itself still works, as before
    assert is_distributed(hvd.load_model(path, custom_optimizers=[_UsersOptimizer],
                                         custom_objects={"_users_loss": _users_loss}).optimizer)


def test_optimizer_variables_can_be_called_as_horovods_code_does():
    model = _model()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    model.compile(loss="categorical_crossentropy", optimizer=opt)
    model.fit(*_data(16), batch_size=16, epochs=1, verbose=0)
    assert isinstance(opt.variables, list) and len(opt.variables) == 6  # 2 + 4 momenta
    assert [v.path for v in opt.variables()] == [v.path for v in opt.variables]
    assert opt.variables()[0] is opt.iterations
    unwrapped = type(opt).from_config(opt.get_config())  # as Keras' deserialisation makes one
    with pytest.raises(ValueError, match="DistributedOptimizer"):
        unwrapped.register_local_var(model.trainable_variables[0])


def test_the_epoch_after_a_reset_runs_all_its_steps():
    # Keras 3 takes an epoch's steps from its data: the batches done before a reset are not
    # skipped (docs/keras.md, "Elastic"); the callback leaves fit's params alone.
    model = _model()
    model.compile(loss="categorical_crossentropy", optimizer=keras.optimizers.SGD(0.1))
    state = hvd.elastic.KerasState(model, batch=2, epoch=0)  # restored mid-epoch
    steps = _StepsSeen()
    model.fit(*_data(64), batch_size=16, epochs=1, verbose=0,
              callbacks=[hvd.elastic.UpdateBatchStateCallback(state), steps])
    assert steps.batches == [0, 1, 2, 3] and steps.params_steps == 4
    assert state.batch == 0


class _StepsSeen(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.batches = []
        self.params_steps = None

    def on_train_batch_end(self, batch, logs=None):
        self.batches.append(batch)
        self.params_steps = self.params["steps"]


def test_elastic_state_and_callbacks():
    model = _model()
    model.compile(loss="categorical_crossentropy", optimizer=keras.optimizers.SGD(0.1))
    model.fit(*_data(16), batch_size=16, epochs=1, verbose=0)  # builds the optimizer
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    commits = []
    state.register_reset_callbacks([])
    original_commit = state.commit
    state.commit = lambda: (commits.append((state.epoch, state.batch)), original_commit())[1]
    before = [v.numpy().copy() for v in model.trainable_variables]
    model.fit(*_data(64), batch_size=16, epochs=2, verbose=0, callbacks=[
        hvd.elastic.UpdateBatchStateCallback(state), hvd.elastic.UpdateEpochStateCallback(state),
        hvd.elastic.CommitStateCallback(state, batches_per_commit=3)])
    assert (state.epoch, state.batch) == (2, 0)
    # every 3 batches (4 per epoch, counted across epochs) and at each epoch's end
    assert commits == [(0, 2), (1, 0), (1, 1), (2, 0)]
    committed = [v.numpy().copy() for v in model.trainable_variables]
    model.fit(*_data(32), batch_size=16, epochs=1, verbose=0)
    state.restore()
    for v, c in zip(model.trainable_variables, committed):
        np.testing.assert_array_equal(v.numpy(), c)
    assert any(not np.array_equal(b, c) for b, c in zip(before, committed))
    with pytest.raises(ValueError, match="built"):
        hvd.elastic.KerasState(keras.Sequential([keras.layers.Dense(2)]))


def test_collectives_on_values_and_the_tf1_call():
    out = hvd.allreduce(np.arange(3.0))
    assert isinstance(out, np.ndarray) and out.tolist() == [0.0, 1.0, 2.0]
    assert torch.equal(hvd.broadcast(torch.ones(2), 0), torch.ones(2))
    assert hvd.allgather([[1, 2]]).tolist() == [[1, 2]]
    with pytest.raises(RuntimeError, match="BroadcastGlobalVariablesCallback"):
        hvd.broadcast_global_variables(0)


@pytest.mark.parametrize("backend", ["numpy", "openvino"])
def test_another_backend_is_refused_with_a_clear_error(backend):
    # Refused before keras is imported: a script would otherwise train each rank alone
    # (torch, tensorflow and jax are served: tests/multiproc/test_keras_backends.py).
    env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-c", "import ringtrain.keras"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode != 0
    assert "KerasBackendError" in proc.stderr and "torch, tensorflow or jax" in proc.stderr
    assert repr(backend) in proc.stderr


def test_the_bug_report_block_names_keras_and_its_backend():
    from ringtrain.env_report import collect

    info = collect()
    assert info["keras"] == keras.__version__ and info["keras_backend"] == "torch"


def test_tensorboard_callback_writes_the_curves_the_dashboard_reads(tmp_path):
    from ringtrain.jobs.service.monitor.tfevents import EventFileReader

    pytest.importorskip("tensorboard")
    with pytest.raises(ValueError, match="update_freq"):
        hvd.callbacks.TensorBoard(str(tmp_path / "bad"), update_freq=-1)
    model = _model()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)),
                  loss="categorical_crossentropy", metrics=["accuracy"])
    x, y = _data()
    history = model.fit(x, y, batch_size=16, epochs=2, validation_data=_data(16, seed=1),
                        verbose=0, callbacks=[hvd.callbacks.TensorBoard(str(tmp_path / "tb"),
                                                                        update_freq=2)])
    (events,) = (tmp_path / "tb").glob("*tfevents*")
    points = {(s.tag, s.step): s.value for s in EventFileReader(events).read()}
    for epoch in (1, 2):
        for name in ("loss", "accuracy", "val_loss", "val_accuracy"):
            assert points[f"epoch/{name}", epoch] == pytest.approx(
                history.history[name][epoch - 1], rel=1e-5)
    # 4 batches an epoch, a point every 2: steps 2, 4, 6, 8
    assert sorted(step for tag, step in points if tag == "train/loss") == [2, 4, 6, 8]
    assert points["train/lr", 8] == pytest.approx(0.05)
