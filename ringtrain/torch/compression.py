"""Gradient compression for allreduce: cast to a narrower float on the wire and back."""

from __future__ import annotations

import torch


class Compressor:
    """Turns a tensor into what is sent, and what is received back into the original dtype."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, object]:
        """Returns the tensor to send and the context ``decompress`` needs."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: object) -> torch.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _CastCompressor(Compressor):
    wire_dtype: torch.dtype

    @classmethod
    def compress(cls, tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != cls.wire_dtype:
            return tensor.to(cls.wire_dtype), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class FP16Compressor(_CastCompressor):
    """Floating-point tensors travel as float16 (half the bytes; 3 significant digits)."""

    wire_dtype = torch.float16


class BF16Compressor(_CastCompressor):
    """Floating-point tensors travel as bfloat16 (half the bytes; float32's range)."""

    wire_dtype = torch.bfloat16


class Compression:
    """The available compressors, named as in Horovod (plus ``bf16``)."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
