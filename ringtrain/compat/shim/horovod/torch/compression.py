"""``horovod.torch.compression``."""

from ringtrain.torch.compression import (  # noqa: F401
    Compression,
    Compressor,
    FP16Compressor,
    NoneCompressor,
)
