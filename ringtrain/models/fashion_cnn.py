"""The classic small CNN of the Keras/Horovod examples, for 28x28 grey images.

It is :class:`~ringtrain.models.cifar_cnn.CifarCNN` (the Keras ``cifar10_cnn.py`` recipe) sized
for Fashion-MNIST: one input channel, 28x28 images; same layers, same ``state_dict`` keys.
"""

from __future__ import annotations

from ringtrain.models.cifar_cnn import CifarCNN


class FashionCNN(CifarCNN):
    """The CNN: ``[N, in_channels, 28, 28]`` images in, ``[N, num_classes]`` logits out. With
    the defaults it has 889,834 parameters, 819,712 of them in the 1600-to-512 layer."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1) -> None:
        super().__init__(num_classes, in_channels, image_size=28)
