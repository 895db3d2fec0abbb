"""An elastic Keras training script in Horovod's style (``keras_mnist_elastic.py``), for the
launcher's elastic test: ``KerasState`` with its three callbacks inside ``@hvd.elastic.run``.

Every rank prints JSON lines (start, batch, commit, reset, done). With
``RINGTRAIN_TEST_PAUSE=WORKER:EPOCH:BATCH`` that worker of the first world announces itself and
sleeps at that batch, so that a test can kill it there (its peer then waits in the batch's
gradient allreduce).
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import numpy as np

# isort: off
import ringtrain.keras as hvd  # first: it makes torch Keras' backend
import keras
# isort: on

EPOCHS = 3
BATCH = 8
SAMPLES = 64


def worker() -> int:
    return int(os.environ.get("RINGTRAIN_ELASTIC_WORKER", os.environ.get("HOROVOD_RANK", "0")))


def report(event: str, **fields) -> None:
    print(json.dumps({"event": event, "worker": worker(), **fields}), flush=True)


class ReportingState(hvd.elastic.KerasState):
    def commit(self) -> None:
        report("commit", epoch=self.epoch, batch=self.batch, size=hvd.size())
        super().commit()


class Progress(keras.callbacks.Callback):
    def __init__(self, state):
        super().__init__()
        self.state = state

    def on_train_batch_begin(self, batch, logs=None):
        target = os.environ.get("RINGTRAIN_TEST_PAUSE")
        if (target == f"{worker()}:{self.state.epoch}:{batch}" and hvd.size() == 2
                and os.environ.get("RINGTRAIN_ELASTIC_GENERATION", "1") == "1"):
            report("pause")
            time.sleep(120)

    def on_train_batch_end(self, batch, logs=None):
        report("batch", epoch=self.state.epoch, batch=batch, size=hvd.size())
        if hvd.size() > 1:
            time.sleep(0.1)  # time for the test to kill a worker and change the hosts


def main() -> None:
    hvd.init()
    report("start", pid=os.getpid())
    rng = np.random.default_rng(0)
    x = rng.random((SAMPLES, 4), dtype=np.float32)
    y = x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.5))
    model.compile(loss="mse", optimizer=optimizer)
    state = ReportingState(model, batch=0, epoch=0)
    state.register_reset_callbacks([
        lambda: report("reset", size=hvd.size(), epoch=state.epoch, batch=state.batch)])
    # Horovod's order (keras_mnist_elastic.py): the state is updated, then committed.
    callbacks = [hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=2), Progress(state)]

    @hvd.elastic.run
    def train(state):
        model.fit(x, y, batch_size=BATCH, epochs=EPOCHS - state.epoch, shuffle=False,
                  callbacks=callbacks, verbose=0)

    train(state)
    digest = hashlib.sha256(b"".join(np.ascontiguousarray(v.numpy()).tobytes()
                                     for v in model.trainable_variables)).hexdigest()
    report("done", size=hvd.size(), epoch=state.epoch, weights=digest)


if __name__ == "__main__":
    main()
