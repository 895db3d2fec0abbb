"""ResNet (He et al., 2015) as single-device code, parameter-for-parameter torchvision's.

Module names, parameter shapes and initialisation follow ``torchvision.models.resnet`` ("ResNet
v1.5": the stride of a bottleneck sits on its 3x3 convolution), so a torchvision ``state_dict``
loads with ``load_state_dict(..., strict=True)`` and the other way round. ResNet-50 has
25,557,032 parameters.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def _conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, 3, stride=stride, padding=1, bias=False)


def _conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a shortcut (ResNet-18/34)."""

    expansion = 1

    def __init__(
        self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = _conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)

    def last_bn(self) -> nn.BatchNorm2d:
        """The normalisation closing the residual branch (zeroed by ``zero_init_residual``)."""
        return self.bn2


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand by 4, with a shortcut (ResNet-50/101/152)."""

    expansion = 4

    def __init__(
        self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = _conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)

    def last_bn(self) -> nn.BatchNorm2d:
        """The normalisation closing the residual branch (zeroed by ``zero_init_residual``)."""
        return self.bn3


Block = type[BasicBlock] | type[Bottleneck]


class ResNet(nn.Module):
    """A ResNet for ``[N, 3, H, W]`` images (224x224 in the paper); returns ``[N, num_classes]``
    logits.

    Args:
        block: :class:`BasicBlock` or :class:`Bottleneck`.
        layers: Blocks in each of the four stages, e.g. ``[3, 4, 6, 3]`` for ResNet-50.
        num_classes: Outputs of the final linear layer.
        zero_init_residual: Start the last batch norm of every residual branch at zero, so each
            block starts as the identity; Goyal et al. (2017) found this helps large-batch
            distributed training.
    """

    def __init__(
        self,
        block: Block,
        layers: list[int],
        num_classes: int = 1000,
        zero_init_residual: bool = False,
    ) -> None:
        super().__init__()
        if len(layers) != 4:
            raise ValueError(f"layers must list four stage depths, got {layers}")
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)

        # torchvision's initialisation, so a fresh model trains as a fresh torchvision one does.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, (BasicBlock, Bottleneck)):
                    nn.init.zeros_(m.last_bn().weight)

    def _make_layer(self, block: Block, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                _conv1x1(self.inplanes, planes * block.expansion, stride),
                nn.BatchNorm2d(planes * block.expansion),
            )
        stage = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        stage += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*stage)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(**kwargs: object) -> ResNet:
    """ResNet-18. Keyword arguments go to :class:`ResNet`."""
    return ResNet(BasicBlock, [2, 2, 2, 2], **kwargs)  # type: ignore[arg-type]


def resnet34(**kwargs: object) -> ResNet:
    """ResNet-34. Keyword arguments go to :class:`ResNet`."""
    return ResNet(BasicBlock, [3, 4, 6, 3], **kwargs)  # type: ignore[arg-type]


def resnet50(**kwargs: object) -> ResNet:
    """ResNet-50 (25,557,032 parameters). Keyword arguments go to :class:`ResNet`."""
    return ResNet(Bottleneck, [3, 4, 6, 3], **kwargs)  # type: ignore[arg-type]


def resnet101(**kwargs: object) -> ResNet:
    """ResNet-101. Keyword arguments go to :class:`ResNet`."""
    return ResNet(Bottleneck, [3, 4, 23, 3], **kwargs)  # type: ignore[arg-type]


def resnet152(**kwargs: object) -> ResNet:
    """ResNet-152. Keyword arguments go to :class:`ResNet`."""
    return ResNet(Bottleneck, [3, 8, 36, 3], **kwargs)  # type: ignore[arg-type]


#: Builders by torchvision's names for them.
BUILDERS: dict[str, Callable[..., ResNet]] = {
    "resnet18": resnet18,
    "resnet34": resnet34,
    "resnet50": resnet50,
    "resnet101": resnet101,
    "resnet152": resnet152,
}
