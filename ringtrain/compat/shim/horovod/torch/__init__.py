"""``horovod.torch``: ringtrain.torch's whole curated API under Horovod's names."""

import sys as _sys

from ringtrain.torch import *  # noqa: F401,F403
from ringtrain.torch import __all__, elastic  # noqa: F401 (re-exported: star-imports use it)

# ``import horovod.torch.elastic`` must give the module that ``hvd.elastic`` is, not a second
# copy of it.
_sys.modules[__name__ + ".elastic"] = elastic

# Horovod's submodules that scripts import by path, available as attributes as in Horovod.
from horovod.torch import compression, functions, mpi_ops  # noqa: E402,F401
