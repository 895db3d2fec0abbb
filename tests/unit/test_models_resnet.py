"""ringtrain's ResNets against torchvision's layout, written out here from its definition."""

from __future__ import annotations

import pytest
import torch

from ringtrain.models import resnet

_BN = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def _bn(prefix: str, c: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.{k}": (() if k == "num_batches_tracked" else (c,)) for k in _BN}


def _torchvision_layout(bottleneck: bool, depths: list[int]) -> dict[str, tuple[int, ...]]:
    """The state_dict keys and shapes of torchvision.models.resnet.ResNet, in order."""
    keys: dict[str, tuple[int, ...]] = {"conv1.weight": (64, 3, 7, 7), **_bn("bn1", 64)}
    expansion = 4 if bottleneck else 1
    inplanes = 64
    for stage, (planes, depth) in enumerate(zip((64, 128, 256, 512), depths), start=1):
        for b in range(depth):
            p = f"layer{stage}.{b}"
            if bottleneck:
                keys[f"{p}.conv1.weight"] = (planes, inplanes, 1, 1)
                keys.update(_bn(f"{p}.bn1", planes))
                keys[f"{p}.conv2.weight"] = (planes, planes, 3, 3)
                keys.update(_bn(f"{p}.bn2", planes))
                keys[f"{p}.conv3.weight"] = (planes * 4, planes, 1, 1)
                keys.update(_bn(f"{p}.bn3", planes * 4))
            else:
                keys[f"{p}.conv1.weight"] = (planes, inplanes, 3, 3)
                keys.update(_bn(f"{p}.bn1", planes))
                keys[f"{p}.conv2.weight"] = (planes, planes, 3, 3)
                keys.update(_bn(f"{p}.bn2", planes))
            if b == 0 and (stage > 1 or inplanes != planes * expansion):
                keys[f"{p}.downsample.0.weight"] = (planes * expansion, inplanes, 1, 1)
                keys.update(_bn(f"{p}.downsample.1", planes * expansion))
            inplanes = planes * expansion
    keys["fc.weight"] = (1000, 512 * expansion)
    keys["fc.bias"] = (1000,)
    return keys


@pytest.mark.parametrize(
    ("name", "bottleneck", "depths", "params"),
    [
        ("resnet18", False, [2, 2, 2, 2], 11_689_512),
        ("resnet34", False, [3, 4, 6, 3], 21_797_672),
        ("resnet50", True, [3, 4, 6, 3], 25_557_032),
        ("resnet101", True, [3, 4, 23, 3], 44_549_160),
    ],
)
def test_state_dict_matches_torchvision_layout(
    name: str, bottleneck: bool, depths: list[int], params: int
) -> None:
    model = resnet.BUILDERS[name]()
    state = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    expected = _torchvision_layout(bottleneck, depths)
    assert list(state) == list(expected)
    assert state == expected
    assert sum(p.numel() for p in model.parameters()) == params


def test_resnet50_strides_on_the_3x3_convolution() -> None:
    # "ResNet v1.5", as torchvision: the bottleneck's stride is on conv2, not conv1.
    block = resnet.resnet50().layer2[0]
    assert block.conv1.stride == (1, 1) and block.conv2.stride == (2, 2)
    assert block.downsample[0].stride == (2, 2)


def test_a_state_dict_round_trips_strictly() -> None:
    source, target = resnet.resnet18(num_classes=5), resnet.resnet18(num_classes=5)
    target.load_state_dict(source.state_dict(), strict=True)
    source.eval(), target.eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(source(x), target(x))


def test_forward_shape_and_backward() -> None:
    model = resnet.resnet18(num_classes=7)
    out = model(torch.randn(2, 3, 64, 64))
    assert out.shape == (2, 7)
    out.sum().backward()
    assert model.conv1.weight.grad is not None


def test_zero_init_residual_zeroes_the_last_norm_of_every_block() -> None:
    for build, last in ((resnet.resnet50, "bn3"), (resnet.resnet18, "bn2")):
        model = build(zero_init_residual=True)
        weights = {k: v for k, v in model.state_dict().items() if k.endswith(f"{last}.weight")}
        assert weights and all(bool((w == 0).all()) for w in weights.values())
        assert bool((model.bn1.weight == 1).all())
        plain = build()
        assert all(bool((plain.state_dict()[k] == 1).all()) for k in weights)


def test_zero_init_blocks_start_as_identity_plus_shortcut() -> None:
    model = resnet.resnet50(zero_init_residual=True).eval()
    block = model.layer1[1]  # no downsample: the output is relu(x) of a non-negative x
    x = torch.rand(1, 256, 8, 8)
    with torch.no_grad():
        assert torch.equal(block(x), x)


def test_four_stages_are_required() -> None:
    with pytest.raises(ValueError, match="four stage depths"):
        resnet.ResNet(resnet.Bottleneck, [3, 4, 6])
