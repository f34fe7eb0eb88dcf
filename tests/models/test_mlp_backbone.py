"""MLP backbone and the backbone registry."""

from __future__ import annotations

import pytest
import torch

from rankwise.models import MLPBackbone, build_backbone, list_backbones


def test_mlp_shapes_backward(device: torch.device) -> None:
    net = MLPBackbone(10, hidden=(32, 16), feature_dim=8, dropout=0.1).to(device)
    x = torch.randn(5, 10, device=device)
    out = net(x)
    assert out.shape == (5, 8) and out.device.type == device.type
    out.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())
    assert net(torch.randn(2, 3, 10, device=device)).shape == (2, 3, 8)
    assert net.feature_dim == 8


def test_mlp_options_and_errors() -> None:
    net = MLPBackbone(4, hidden=(), feature_dim=3, final_activation=False)
    assert isinstance(net.net[-1], torch.nn.Linear)
    out = net(torch.randn(100, 4))
    assert (out < 0).any()  # no ReLU at the end
    with pytest.raises(ValueError, match="`in_dim` must be a positive int, got 0"):
        MLPBackbone(0)
    with pytest.raises(ValueError, match="`hidden` must be a sequence of positive ints"):
        MLPBackbone(3, hidden=(4, -1))
    with pytest.raises(ValueError, match=r"`dropout` must be in \[0, 1\)"):
        MLPBackbone(3, dropout=1.0)
    with pytest.raises(ValueError, match=r"`x` must have 3 features in its last dim, got shape \(2, 4\)"):
        MLPBackbone(3)(torch.randn(2, 4))


def test_build_backbone_mlp() -> None:
    assert "mlp" in list_backbones()
    net, dim = build_backbone("mlp", in_dim=7, hidden=(16,), feature_dim=12)
    assert dim == 12 and net(torch.randn(3, 7)).shape == (3, 12)
    with pytest.raises(ValueError, match="unknown backbone 'nope'"):
        build_backbone("nope")
