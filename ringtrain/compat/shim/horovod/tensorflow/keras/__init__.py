"""``horovod.tensorflow.keras``: ringtrain.keras's whole API (Keras 3 on its PyTorch backend),
the same objects as ``horovod.keras``."""

import sys as _sys

from ringtrain.keras import *
from ringtrain.keras import __all__, callbacks, elastic  # noqa: F401

_sys.modules[__name__ + ".callbacks"] = callbacks
_sys.modules[__name__ + ".elastic"] = elastic
