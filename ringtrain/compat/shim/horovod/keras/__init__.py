"""``horovod.keras``: ringtrain.keras's whole API (Keras 3 on its PyTorch backend)."""

import sys as _sys

from ringtrain.keras import *
from ringtrain.keras import __all__, callbacks, elastic  # noqa: F401

# ``import horovod.keras.callbacks`` (and ``.elastic``) must give the modules that
# ``hvd.callbacks`` and ``hvd.elastic`` are, not second copies of them.
_sys.modules[__name__ + ".callbacks"] = callbacks
_sys.modules[__name__ + ".elastic"] = elastic
