"""``load_model``: a saved Keras model whose optimizer comes back distributed, state included."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ringtrain.keras.backend import import_keras
from ringtrain.keras.optimizer import DistributedOptimizer
from ringtrain.torch.compression import Compression


def load_model(filepath: str | Path, custom_optimizers: Iterable[type] | None = None,
               custom_objects: dict[str, Any] | None = None,
               compression: Any = Compression.none, legacy_opts: bool = False) -> Any:
    """Load a ``.keras`` model and wrap its optimizer in a :func:`DistributedOptimizer`.

    The optimizer's state saved with the model (slots, iterations, learning rate) is the
    wrapped optimizer's state, so training resumes where it stopped.

    Args:
        custom_optimizers: optimizer classes of your own used by the saved model.
        custom_objects: other custom classes or functions, by name (as for Keras).
        legacy_opts: Horovod's switch for ``tf.keras.optimizers.legacy``; Keras 3 has none.

    Returns:
        The model; if it was saved compiled, ``model.optimizer`` is distributed.

    Raises:
        ValueError: ``legacy_opts`` is true, or the file is not a Keras model.
    """
    keras = import_keras()
    if legacy_opts:
        raise ValueError("legacy_opts=True asks for tf.keras.optimizers.legacy, which Keras 3 "
                         "does not have; load with legacy_opts=False")
    objects = {cls.__name__: cls for cls in custom_optimizers or ()}
    objects.update(custom_objects or {})
    model = keras.saving.load_model(filepath, custom_objects=objects)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        model.optimizer = DistributedOptimizer(optimizer, compression=compression)
    return model
