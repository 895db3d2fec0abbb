"""``horovod`` as ``ringtrain run --horovod-compat`` provides it, with ringtrain underneath.

Only the PyTorch frontend (``horovod.torch``) and the ``horovod.common`` names that PyTorch scripts
use exist; ``horovod.tensorflow``, ``horovod.keras``, ``horovod.spark`` and ``horovod.run`` do not.
"""

#: The Horovod release whose PyTorch API ringtrain implements (scripts compare versions).
__version__ = "0.28.1"
