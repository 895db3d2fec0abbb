"""A small CNN for colour image crops of any size: the light model of input-pipeline tests.

ResNet-50 needs a GPU to make the input pipeline the bottleneck; on a CPU this model trains fast
enough that decoding shows, which is what ``ringtrain doctor`` and the pipeline benchmark need.
"""

from __future__ import annotations

from torch import nn


class SmallCNN(nn.Sequential):
    """Four conv-batchnorm-ReLU blocks of stride 2 (``width`` to ``8 * width`` channels), global
    average pooling and a linear classifier of ``num_classes`` outputs."""

    def __init__(self, num_classes: int = 1000, width: int = 32, in_channels: int = 3) -> None:
        layers: list[nn.Module] = []
        channels = in_channels
        for i in range(4):
            out = width * 2**i
            layers += [nn.Conv2d(channels, out, 3, stride=2, padding=1, bias=False),
                       nn.BatchNorm2d(out), nn.ReLU(inplace=True)]
            channels = out
        super().__init__(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(channels, num_classes))
