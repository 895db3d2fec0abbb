"""Elastic training for Keras (``hvd.elastic``): a model's state, the callbacks that commit it and
keep its ``epoch``/``batch`` current during ``fit``, and ringtrain.torch's :func:`run`
(docs/keras.md, "Elastic").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ringtrain.keras.backend import import_keras
from ringtrain.keras.collectives import broadcast_variables, is_seed_state
from ringtrain.keras.handoff import current as current_handoff
from ringtrain.torch.elastic import ObjectState, run

if TYPE_CHECKING:  # keras (untyped: Any) as a module, so its classes can be base classes
    import keras
else:
    keras = import_keras()  # checks the backend: keras must come from here at run time

__all__ = ["CommitStateCallback", "KerasState", "UpdateBatchStateCallback",
           "UpdateEpochStateCallback", "run"]


class KerasState(ObjectState):
    """The state of a built Keras model and its optimizer (default: the model's), plus plain
    values as attributes (``epoch=0, batch=0``).

    Raises:
        ValueError: the model is not built yet.
    """

    def __init__(self, model: Any, optimizer: Any = None, **kwargs: Any):
        if not model.built:
            raise ValueError("Model must be built first. Run `model.build(input_shape)`.")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else model.optimizer
        self._save_model()
        super().__init__(**kwargs)

    def _variables(self) -> tuple[list, list]:
        # Keras on JAX keeps the state of a running fit outside the variables until asked
        # (callbacks ask through their `model` property; this state holds the model itself).
        sync = getattr(self.model, "jax_state_sync", None)
        if sync is not None:
            sync()
        optimizer = [] if self.optimizer is None else list(self.optimizer.variables)
        return list(self.model.variables), optimizer

    def _save_model(self) -> None:
        model, optimizer = self._variables()
        handoff = current_handoff()
        self._saved_model_state = [handoff.snapshot(v) for v in model]
        self._saved_optimizer_state = [handoff.snapshot(v) for v in optimizer]

    def _load_model(self) -> None:
        model, optimizer = self._variables()
        for var, saved in zip(model, self._saved_model_state):
            var.assign(saved)
        # An optimizer first built after the last commit has more variables than were saved:
        # the ones it had then get their values back, as in Horovod.
        for var, saved in zip(optimizer, self._saved_optimizer_state):
            var.assign(saved)

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        self._load_model()
        super().restore()

    def sync(self) -> None:
        model, optimizer = self._variables()
        broadcast_variables([v for v in model if not is_seed_state(v)], root_rank=0,
                            name="KerasState.model")
        broadcast_variables(optimizer, root_rank=0, name="KerasState.optimizer")
        self._save_model()
        super().sync()


class CommitStateCallback(keras.callbacks.Callback):
    """Commit ``state`` every ``batches_per_commit`` batches and at the end of every epoch."""

    def __init__(self, state: Any, batches_per_commit: int = 1):
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs: dict | None = None) -> None:
        # Every rank counts from here after a reset, so they commit at the same batches.
        self.batches_remaining = self.batches_per_commit

    def on_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keep ``state.batch`` at the last finished batch (0 after each epoch).

    Unlike Horovod's, it does not lower ``params["steps"]`` for the first epoch after a reset:
    Keras 3 reads an epoch's steps from its data, never from the callbacks' ``params``, so the
    epoch is not shortened by the batches already done either way (docs/keras.md, "Elastic").
    """

    def __init__(self, state: Any):
        super().__init__()
        self.state = state

    def on_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.state.batch = batch

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keep ``state.epoch`` at the number of epochs finished, counted across resets.

    As in Horovod, ``fit`` is called for the epochs left, ``epochs=total - state.epoch``, so
    that its own epoch numbers start at 0 after each reset.
    """

    def __init__(self, state: Any):
        super().__init__()
        self.state = state
        self.initial_epoch = self.state.epoch

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.epoch = self.initial_epoch + epoch + 1
