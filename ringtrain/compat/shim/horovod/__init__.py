"""``horovod`` as ``ringtrain run --horovod-compat`` provides it, with ringtrain underneath.

The PyTorch frontend (``horovod.torch``), the Keras frontend on Keras 3 with PyTorch underneath
(``horovod.keras`` and ``horovod.tensorflow.keras``, both ``ringtrain.keras``) and the
``horovod.common`` names that scripts use exist; the rest of ``horovod.tensorflow``,
``horovod.spark`` and ``horovod.run`` do not.
"""

#: The Horovod release whose PyTorch API ringtrain implements (scripts compare versions).
__version__ = "0.28.1"
