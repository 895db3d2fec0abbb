"""``horovod.tensorflow``: only its ``keras`` subpackage exists here (Keras 3 on PyTorch).

ringtrain runs no TensorFlow: any other name of ``horovod.tensorflow`` raises an error saying
so, rather than a script half-working on a module that only looks like Horovod's.
"""


def __getattr__(name: str):
    raise AttributeError(
        f"horovod.tensorflow.{name}: ringtrain provides no TensorFlow frontend, only "
        "horovod.tensorflow.keras (Keras 3 on PyTorch: KERAS_BACKEND=torch); for PyTorch use "
        "horovod.torch")
