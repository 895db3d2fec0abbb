"""``load_model``: a saved Keras model whose optimizer comes back distributed, state included."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ringtrain.keras.backend import import_keras
from ringtrain.keras.optimizer import DistributedOptimizer, is_distributed
from ringtrain.torch.compression import Compression


class _Factory:
    """A function in ``custom_objects`` standing for a class: Keras 2 called it with the
    object's config as keyword arguments (so Horovod's users pass ``lambda **kwargs:
    hvd.DistributedOptimizer(MyOpt(**kwargs))``); Keras 3 calls ``from_config``."""

    def __init__(self, factory: Callable[..., Any]):
        self._factory = factory

    def from_config(self, config: dict[str, Any]) -> Any:
        return self._factory(**config)


def _class_names(filepath: str | Path) -> set[str]:
    """The names that a ``.keras`` file deserialises as classes (its configs that are dicts).

    Keras 3's legacy ``.h5`` loader still calls a function found for a class, as Keras 2 did:
    an ``.h5`` file needs nothing here.
    """
    if not zipfile.is_zipfile(filepath):
        return set()
    with zipfile.ZipFile(filepath) as archive:
        config = json.loads(archive.read("config.json"))
    names: set[str] = set()
    pending = [config]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            if isinstance(node.get("config"), dict):
                names.update(str(node[k]) for k in ("class_name", "registered_name")
                             if node.get(k))
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return names


def load_model(filepath: str | Path, custom_optimizers: Iterable[type] | None = None,
               custom_objects: dict[str, Any] | None = None,
               compression: Any = Compression.none, legacy_opts: bool = False) -> Any:
    """Load a ``.keras`` model and wrap its optimizer in a :func:`DistributedOptimizer`.

    The optimizer's state saved with the model (slots, iterations, learning rate) is the
    wrapped optimizer's state, so training resumes where it stopped.

    Args:
        custom_optimizers: optimizer classes of your own used by the saved model.
        custom_objects: other custom classes or functions, by name (as for Keras). As in
            Horovod (Keras 2), a function given for a class is a factory: it is called with
            the object's config as keyword arguments; an optimizer it returns already
            distributed is kept as it is.
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
    objects: dict[str, Any] = {cls.__name__: cls for cls in custom_optimizers or ()}
    if custom_objects:
        classes = _class_names(filepath)
        objects.update({
            name: _Factory(obj) if (name in classes and callable(obj)
                                    and not hasattr(obj, "from_config")) else obj
            for name, obj in custom_objects.items()})
    model = keras.saving.load_model(filepath, custom_objects=objects)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not is_distributed(optimizer):
        model.optimizer = DistributedOptimizer(optimizer, compression=compression)
    return model
