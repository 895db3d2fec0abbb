"""Keras 3 on PyTorch, and nothing else: on another backend a model would never touch
ringtrain's collectives, every rank training alone, silently. So importing ``ringtrain.keras``
makes ``torch`` Keras' backend if keras is not imported yet, and refuses any other
(docs/keras.md, "The backend").
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

from ringtrain.errors import RingtrainError

_HINT = ("ringtrain.keras runs Keras 3 on its PyTorch backend: set KERAS_BACKEND=torch before "
         "keras is first imported (export it, or import ringtrain.keras before keras)")


class KerasBackendError(RingtrainError, ImportError):
    """Keras is missing, too old, or runs on a backend other than PyTorch."""


def import_keras() -> ModuleType:
    """Import keras on the torch backend and return it.

    Reading and setting ``KERAS_BACKEND`` here is deliberate work at import time: it is the
    only moment at which the backend can still be chosen.

    Raises:
        KerasBackendError: keras is not installed, is not Keras 3, or was imported (or is
            configured) with another backend.
    """
    if "keras" not in sys.modules:
        chosen = os.environ.setdefault("KERAS_BACKEND", "torch")
        if chosen != "torch":
            raise KerasBackendError(f"KERAS_BACKEND is {chosen!r}. {_HINT}.")
    try:
        import keras
    except ImportError as e:
        raise KerasBackendError(f"ringtrain.keras needs Keras 3: pip install 'ringtrain[keras]' "
                                f"({e})") from None
    version = getattr(keras, "__version__", "0")
    if int(version.split(".")[0]) < 3:
        raise KerasBackendError(f"ringtrain.keras needs Keras 3 (found keras {version}); "
                                "Keras 2 and tf.keras run only on TensorFlow")
    backend = keras.backend.backend()
    if backend != "torch":
        raise KerasBackendError(f"keras was imported with the {backend!r} backend. {_HINT}.")
    return keras
