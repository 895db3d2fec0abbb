"""Synthetic image/label batches for throughput benchmarks.

A benchmark that measures the model and the collectives must not measure the input pipeline, so
the batch is made once, on the training device, and fed every step (as Horovod's
``pytorch_synthetic_benchmark.py`` does).
"""

from __future__ import annotations

import torch


def synthetic_batch(
    batch_size: int,
    *,
    image_shape: tuple[int, int, int] = (3, 224, 224),
    num_classes: int = 1000,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed random batch on ``device``: ``dtype`` images of ``[batch_size, *image_shape]``
    (standard normal) and ``int64`` labels of ``[batch_size]`` (uniform over the classes).

    ``seed`` seeds a private generator, so the batch is the same on every call and every rank
    without touching the global random state.

    Raises:
        ValueError: ``batch_size`` or ``num_classes`` is not positive, or ``image_shape`` does
            not have three positive sizes.
    """
    if batch_size < 1 or num_classes < 1:
        raise ValueError(
            f"batch_size and num_classes must be positive, got {batch_size} and {num_classes}"
        )
    if len(image_shape) != 3 or min(image_shape) < 1:
        raise ValueError(f"image_shape must be (C, H, W) with positive sizes, got {image_shape}")
    generator = torch.Generator().manual_seed(seed)
    # Drawn on the CPU so the values do not depend on the device's random number generator.
    images = torch.randn((batch_size, *image_shape), generator=generator, dtype=dtype)
    labels = torch.randint(num_classes, (batch_size,), generator=generator)
    return images.to(device), labels.to(device)
