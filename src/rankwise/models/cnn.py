"""A small convolutional backbone for digit images (MNIST 28x28, multi-digit 28x112 strips)."""

from __future__ import annotations

import torch
from torch import nn

from rankwise._validation import check_positive_int
from rankwise.models._registry import register_backbone

__all__ = ["SmallCNN", "small_cnn"]


class SmallCNN(nn.Module):
    """Three conv blocks + adaptive average pooling to a fixed grid + a linear layer.

    ``conv(32) -> pool -> conv(64) -> pool -> conv(128) -> AdaptiveAvgPool2d(pool_size) ->
    Linear -> ReLU``, with BatchNorm and ReLU after every convolution. The adaptive pooling makes
    it size-agnostic (8x8, 28x28, 28x112 ... all work); its default grid ``(2, 4)`` keeps the
    left-to-right layout of a strip of digits (needed to read multi-digit numbers).

    Shape:
        ``(B, in_channels, H, W) -> (B, feature_dim)`` for any ``H, W >= 1``.

    Example:
        >>> import torch
        >>> net = SmallCNN(feature_dim=32)
        >>> net(torch.randn(2, 1, 28, 28)).shape, net(torch.randn(2, 1, 28, 112)).shape
        (torch.Size([2, 32]), torch.Size([2, 32]))
    """

    def __init__(
        self, in_channels: int = 1, feature_dim: int = 128, *, pool_size: tuple[int, int] = (2, 4), dropout: float = 0.0
    ) -> None:
        super().__init__()
        for name, v in (("in_channels", in_channels), ("feature_dim", feature_dim)):
            check_positive_int(v, name)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1), got {dropout!r}")
        self.in_channels = in_channels
        self.feature_dim = feature_dim

        def block(cin: int, cout: int) -> list[nn.Module]:
            return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

        self.features = nn.Sequential(
            *block(in_channels, 32),
            nn.MaxPool2d(2, ceil_mode=True),
            *block(32, 64),
            nn.MaxPool2d(2, ceil_mode=True),
            *block(64, 128),
            nn.AdaptiveAvgPool2d(pool_size),
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Dropout(dropout), nn.Linear(128 * pool_size[0] * pool_size[1], feature_dim), nn.ReLU()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"`x` must have shape (B, {self.in_channels}, H, W), got {tuple(x.shape)}")
        return self.head(self.features(x))


@register_backbone("small_cnn")
def small_cnn(
    in_channels: int = 1, feature_dim: int = 128, *, pool_size: tuple[int, int] = (2, 4), dropout: float = 0.0
) -> tuple[nn.Module, int]:
    """Small CNN for digit images (:class:`SmallCNN`); options ``in_channels``, ``feature_dim``."""
    return SmallCNN(in_channels, feature_dim, pool_size=pool_size, dropout=dropout), feature_dim
