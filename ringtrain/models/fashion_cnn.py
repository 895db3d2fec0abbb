"""The classic small CNN of the Keras/Horovod examples, for 28x28 grey images.

Layers as in Keras' ``cifar10_cnn.py`` recipe: two blocks of two 3x3 ReLU convolutions (32 then
64 channels; the first of each block pads to keep the size, the second does not), each block
closed by 2x2 max pooling and dropout 0.25; then a 512-unit ReLU layer, dropout 0.5 and a linear
layer of class scores. The softmax is left to the loss (``cross_entropy``), which is more stable
than a softmax layer followed by a log.
"""

from __future__ import annotations

from torch import nn


class FashionCNN(nn.Sequential):
    """The CNN: ``[N, C, 28, 28]`` images in, ``[N, num_classes]`` logits out.

    Args:
        num_classes: Output classes.
        in_channels: Channels of the input images (1 for Fashion-MNIST).

    With the defaults it has 889,834 parameters, 819,712 of them in the 1600-to-512 layer.
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 1) -> None:
        super().__init__(
            nn.Conv2d(in_channels, 32, 3, padding=1),  # 28x28
            nn.ReLU(inplace=True),
            nn.Conv2d(32, 32, 3),  # 26x26
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # 13x13
            nn.Dropout(0.25),
            nn.Conv2d(32, 64, 3, padding=1),  # 13x13
            nn.ReLU(inplace=True),
            nn.Conv2d(64, 64, 3),  # 11x11
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # 5x5
            nn.Dropout(0.25),
            nn.Flatten(),
            nn.Linear(64 * 5 * 5, 512),
            nn.ReLU(inplace=True),
            nn.Dropout(0.5),
            nn.Linear(512, num_classes),
        )
