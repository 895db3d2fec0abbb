"""The Fashion-MNIST CNN: shapes and size."""

from __future__ import annotations

import torch

from ringtrain.models.fashion_cnn import FashionCNN


def test_output_shape_and_parameter_count() -> None:
    model = FashionCNN()
    assert model(torch.zeros(3, 1, 28, 28)).shape == (3, 10)
    # 320 + 9,248 + 18,496 + 36,928 (convolutions) + 819,712 + 5,130 (dense)
    assert sum(p.numel() for p in model.parameters()) == 889_834


def test_dropout_is_active_in_training_only() -> None:
    model = FashionCNN(num_classes=4, in_channels=3)
    x = torch.rand(8, 3, 28, 28)
    model.eval()
    assert torch.equal(model(x), model(x))
    model.train()
    torch.manual_seed(0)
    assert not torch.equal(model(x), model(x))

