"""Horovod's Keras callbacks (``hvd.callbacks``) on Keras 3, with Horovod 0.28.1's semantics
(docs/keras.md, "Callbacks"), and a :class:`TensorBoard` that needs no TensorFlow.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ringtrain.keras.backend import import_keras
from ringtrain.keras.collectives import broadcast_variables, is_seed_state
from ringtrain.torch import ops, runtime
from ringtrain.torch.summary_writer import summary_writer

if TYPE_CHECKING:  # keras (untyped: Any) as a module, so its classes can be base classes
    import keras
else:
    keras = import_keras()  # checks the backend: keras must come from here at run time


def _get_lr(optimizer: Any) -> float:
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Broadcast the model's and its optimizer's variables from ``root_rank`` to every rank.

    As Horovod's, it runs at the end of the first batch of ``fit`` (a model or optimizer may
    only be built by the first step). The states of random seed generators stay each rank's own.

    Args:
        device: accepted for Horovod's signature; variables are broadcast where they live.
        local_variables: variables (or one) not to broadcast.
    """

    def __init__(self, root_rank: int, device: str = "", local_variables: Any = None):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.broadcast_done = False
        if local_variables is None:
            local_variables = []
        elif isinstance(local_variables, keras.Variable):
            local_variables = [local_variables]
        elif not all(isinstance(v, keras.Variable) for v in local_variables):
            raise ValueError("All local variables must be of keras.Variable type.")
        self._local_vars = {id(v) for v in local_variables}

    def register_local_var(self, var: Any) -> None:
        """Leave ``var`` out of the broadcast (a rank-local variable)."""
        self._local_vars.add(id(var))

    def on_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self.broadcast_done:
            return
        variables = [v for v in self.model.variables
                     if id(v) not in self._local_vars and not is_seed_state(v)]
        broadcast_variables(variables, self.root_rank, name="BroadcastGlobalVariables.model")
        if self.model.optimizer is not None:
            broadcast_variables(self.model.optimizer.variables, self.root_rank,
                                name="BroadcastGlobalVariables.optimizer")
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """Average the metrics in the epoch-end logs over all ranks, in place (one allreduce, in
    the order of their sorted names); callbacks after it in the list see the averages.
    ``device``: accepted for Horovod's signature."""

    def __init__(self, device: str = ""):
        super().__init__()
        self.device = device

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._average_metrics_in_place(logs)

    def _average_metrics_in_place(self, logs: dict | None) -> None:
        if not logs:
            return
        names = [k for k, v in sorted(logs.items()) if _is_number(v)]
        if not names:
            return
        values = torch.tensor([float(np.asarray(keras.ops.convert_to_numpy(logs[k])))
                               for k in names], dtype=torch.float64)
        averaged = ops.synchronize(ops.allreduce_async(
            values, name=f"MetricAverageCallback.{len(names)}", op=ops.Average))
        for k, v in zip(names, averaged.tolist()):
            logs[k] = v


def _is_number(value: Any) -> bool:
    try:
        return np.asarray(keras.ops.convert_to_numpy(value)).size == 1
    except (TypeError, ValueError):
        return False


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Set the learning rate to ``initial_lr * multiplier(epoch)`` from ``start_epoch`` until
    ``end_epoch`` (exclusive; None: no end).

    With ``staircase=True`` the rate changes at the first batch of each epoch and ``multiplier``
    gets the integer epoch; otherwise at every batch, with ``epoch + batch / steps_per_epoch``
    (``steps_per_epoch`` found from ``fit``'s parameters when missing). A constant
    ``multiplier`` means ``multiplier ** (epoch - start_epoch)``. With momentum correction, an
    optimizer's ``momentum`` is multiplied by ``new_lr / old_lr`` for the batch in which the
    rate changes, then restored. The epoch's logs get ``lr``.

    Raises:
        ValueError: ``initial_lr`` is None.
    """

    def __init__(self, initial_lr: float, multiplier: float | Callable[[float], float],
                 start_epoch: int = 0, end_epoch: int | None = None, staircase: bool = True,
                 momentum_correction: bool = True, steps_per_epoch: int | None = None):
        super().__init__()
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.initial_lr = initial_lr
        self.restore_momentum: float | None = None
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch: int | None = None
        if not callable(multiplier):
            constant = multiplier
            self.multiplier = lambda epoch: constant ** (epoch - start_epoch)
        else:
            self.multiplier = multiplier
        if self.initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")

    def _autodetect_steps_per_epoch(self) -> int:
        if self.params.get("steps"):
            return self.params["steps"]
        if self.params.get("samples") and self.params.get("batch_size"):
            return self.params["samples"] // self.params["batch_size"]
        raise ValueError(f"Could not autodetect the number of steps per epoch. Please specify "
                         f"the steps_per_epoch parameter to the {type(self).__name__}() (fit "
                         "on a generator of unknown length does not tell it).")

    def _adjust_learning_rate(self, epoch: float) -> None:
        optimizer = self.model.optimizer
        old_lr = _get_lr(optimizer)
        new_lr = self.initial_lr * self.multiplier(epoch)
        optimizer.learning_rate = new_lr
        if hasattr(optimizer, "momentum") and self.momentum_correction:
            self.restore_momentum = optimizer.momentum
            optimizer.momentum = self.restore_momentum * new_lr / old_lr

    def _restore_momentum_if_needed(self) -> None:
        if self.restore_momentum:
            self.model.optimizer.momentum = self.restore_momentum
            self.restore_momentum = None

    def on_train_begin(self, logs: dict | None = None) -> None:
        if self.initial_lr is None:
            self.initial_lr = _get_lr(self.model.optimizer)
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.current_epoch = epoch

    def on_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        assert self.current_epoch is not None
        if (self.current_epoch < self.start_epoch
                or (self.end_epoch is not None and self.current_epoch >= self.end_epoch)):
            return  # outside the adjustment's epochs
        if self.staircase and batch == 0:
            self._adjust_learning_rate(self.current_epoch)
        elif not self.staircase:
            assert self.steps_per_epoch is not None  # on_train_begin sets it when not staircase
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._restore_momentum_if_needed()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None:
            logs["lr"] = _get_lr(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Warm the learning rate up from ``initial_lr / size`` to ``initial_lr``, per batch.

    ``lr(epoch) = initial_lr / size * (epoch * (size - 1) / warmup_epochs + 1)`` with
    ``epoch = full_epochs + (batch + 1) / steps_per_epoch`` (shifted by one batch so that each
    epoch ends on a round value, as in Horovod), for the first ``warmup_epochs`` epochs;
    ``verbose=1``: rank 0 prints when the warmup ends.
    """

    def __init__(self, initial_lr: float, warmup_epochs: int = 5,
                 momentum_correction: bool = True, steps_per_epoch: int | None = None,
                 verbose: int = 0):
        def multiplier(epoch: float) -> float:
            assert self.steps_per_epoch is not None  # per batch: on_train_begin has set it
            epoch += 1.0 / self.steps_per_epoch
            size = runtime.size()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        super().on_epoch_end(epoch, logs)
        assert self.end_epoch is not None  # warmup_epochs, given to the base class
        if epoch == self.end_epoch - 1 and self.verbose > 0 and runtime.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{_get_lr(self.model.optimizer):g}.")


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """A ``ModelCheckpoint`` that saves only the best model so far (by ``monitor``).

    Horovod leaves ``filepath`` to be set later (its Spark estimator does); Keras 3 checks the
    path when the callback is made, so it is an argument here, last, with a default.
    """

    def __init__(self, monitor: str = "val_loss", verbose: int = 0, mode: str = "auto",
                 save_freq: str | int = "epoch", save_weights_only: bool = False,
                 filepath: str | None = None):
        if filepath is None:
            filepath = "best_model.weights.h5" if save_weights_only else "best_model.keras"
        super().__init__(filepath=filepath, monitor=monitor, verbose=verbose,
                         save_best_only=True, save_weights_only=save_weights_only, mode=mode,
                         save_freq=save_freq)


class TensorBoard(keras.callbacks.Callback):
    """Rank 0 writes ``fit``'s metrics to TensorBoard event files in ``log_dir`` (created; in a
    job, under its outputs, where the dashboard finds them).

    Keras' own callback writes through TensorFlow, which Keras 3 on torch or JAX does not have;
    this one writes through ``torch.utils.tensorboard`` (``pip install
    'ringtrain[tensorboard]'``), without TensorFlow on every backend
    (:mod:`ringtrain.torch.summary_writer`).
    Every epoch's logs go to ``epoch/<name>`` at the epoch's number, and every ``update_freq``
    batches (0: never) the batch's logs to ``train/<name>`` at the step, with the learning rate
    as ``train/lr``.

    Raises:
        ImportError: The ``tensorboard`` package is not installed.
        ValueError: ``update_freq`` is negative.
    """

    def __init__(self, log_dir: str = "logs", update_freq: int = 20) -> None:
        super().__init__()
        if update_freq < 0:
            raise ValueError(f"update_freq must be 0 or more (got {update_freq})")
        self.update_freq = update_freq
        self._step = 0
        self._writer: Any = None
        if runtime.rank() == 0:
            self._writer = summary_writer(log_dir)

    def _scalars(self, prefix: str, logs: dict[str, Any] | None, step: int) -> None:
        for name, value in (logs or {}).items():
            if _is_number(value):
                self._writer.add_scalar(f"{prefix}/{name}", float(value), step)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._step += 1
        if self._writer is None or not self.update_freq or self._step % self.update_freq:
            return
        self._scalars("train", logs, self._step)
        self._writer.add_scalar("train/lr", _get_lr(self.model.optimizer), self._step)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._writer is not None:
            self._scalars("epoch", logs, epoch + 1)
            self._writer.flush()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._writer is not None:
            self._writer.close()
