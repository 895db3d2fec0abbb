"""Keras 3 on a backend whose steps reach ringtrain's engine: PyTorch, TensorFlow or JAX. On
any other backend a model would never touch ringtrain's collectives, every rank training alone,
silently. So importing ``ringtrain.keras`` makes ``torch`` Keras' backend if keras is not
imported yet and ``KERAS_BACKEND`` is unset, and refuses a backend it cannot serve
(docs/keras.md, "The backend").
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

from ringtrain.errors import RingtrainError

#: The Keras backends ringtrain.keras runs on (each has a hand-off in ringtrain.keras.handoff).
BACKENDS = ("torch", "tensorflow", "jax")

_HINT = ("ringtrain.keras runs Keras 3 on its torch, tensorflow or jax backend: set "
         "KERAS_BACKEND to one of them before keras is first imported (export it, or import "
         "ringtrain.keras before keras, which chooses torch when KERAS_BACKEND is unset)")


class KerasBackendError(RingtrainError, ImportError):
    """Keras is missing, too old, or runs on a backend ringtrain.keras does not serve."""


def import_keras() -> ModuleType:
    """Import keras on one of :data:`BACKENDS` and return it.

    Reading and setting ``KERAS_BACKEND`` here is deliberate work at import time: it is the
    only moment at which the backend can still be chosen. Unset, it becomes ``torch`` (the one
    backend that ``pip install 'ringtrain[keras]'`` brings); Keras' own default, TensorFlow,
    is taken when asked for by name.

    Raises:
        KerasBackendError: keras is not installed, is not Keras 3, or was imported (or is
            configured) with another backend, or the backend's library is missing.
    """
    if "keras" not in sys.modules:
        chosen = os.environ.setdefault("KERAS_BACKEND", "torch")
        if chosen not in BACKENDS:
            raise KerasBackendError(f"KERAS_BACKEND is {chosen!r}. {_HINT}.")
    try:
        import keras
    except ImportError as e:
        wanted = os.environ.get("KERAS_BACKEND", "torch")
        extra = {"tensorflow": "keras-tf", "jax": "keras-jax"}.get(wanted, "keras")
        raise KerasBackendError(f"ringtrain.keras needs Keras 3 and its {wanted} backend: pip "
                                f"install 'ringtrain[{extra}]' ({e})") from None
    version = getattr(keras, "__version__", "0")
    if int(version.split(".")[0]) < 3:
        raise KerasBackendError(f"ringtrain.keras needs Keras 3 (found keras {version}); "
                                "Keras 2 and tf.keras run only on TensorFlow")
    backend = keras.backend.backend()
    if backend not in BACKENDS:
        raise KerasBackendError(f"keras was imported with the {backend!r} backend. {_HINT}.")
    if backend == "jax":
        from ringtrain.keras.jax_threads import ensure_callback_threads

        ensure_callback_threads()
    return keras
