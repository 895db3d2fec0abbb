"""The CNN of the Keras CIFAR-10 tutorial (``cifar10_cnn.py``), in PyTorch.

Two blocks of two 3x3 ReLU convolutions (32 then 64 channels; the first of each block pads to
keep the size, the second does not), each block closed by 2x2 max pooling and dropout 0.25; then
a 512-unit ReLU layer, dropout 0.5 and a linear layer of class scores. The softmax is left to the
loss (``cross_entropy``), which is more stable than a softmax layer followed by a log. The
tutorial trains it with RMSprop and random shifts and flips.
"""

from __future__ import annotations

from torch import nn


class CifarCNN(nn.Sequential):
    """The CNN: ``[N, in_channels, S, S]`` images in (``S``: ``image_size``; CIFAR-10's are
    ``[N, 3, 32, 32]``), ``[N, num_classes]`` logits out. With the defaults it has 1,250,858
    parameters, 1,180,160 of them in the 2304-to-512 layer.

    Raises:
        ValueError: ``image_size`` is too small for two blocks (less than 10).
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 3, image_size: int = 32) -> None:
        side = ((image_size - 2) // 2 - 2) // 2  # each block: an unpadded conv, then pooling
        if side < 1:
            raise ValueError(f"image_size must be at least 10, got {image_size}")
        super().__init__(
            nn.Conv2d(in_channels, 32, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(32, 32, 3),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Dropout(0.25),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(64, 64, 3),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Dropout(0.25),
            nn.Flatten(),
            nn.Linear(64 * side * side, 512),
            nn.ReLU(inplace=True),
            nn.Dropout(0.5),
            nn.Linear(512, num_classes),
        )
