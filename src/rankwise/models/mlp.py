"""Multi-layer perceptron backbone for tabular data."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import nn

from rankwise._validation import check_positive_int
from rankwise.models._registry import register_backbone

__all__ = ["MLPBackbone", "mlp_backbone"]


class MLPBackbone(nn.Module):
    """``in_dim -> hidden[0] -> ... -> feature_dim`` with ReLU (and dropout) after every layer.

    The output is the feature vector that regularizers (RankSim, ConR, FDS ...) act on; the
    regression head is a separate linear layer on top. The last layer is followed by a ReLU as
    well (like a ResNet's pooled features) unless ``final_activation=False``.

    Shape:
        ``(B, in_dim) -> (B, feature_dim)``; any leading dims ``(*, in_dim) -> (*, feature_dim)``.

    Example:
        >>> import torch
        >>> net = MLPBackbone(10, hidden=(32,), feature_dim=16)
        >>> net(torch.randn(5, 10)).shape
        torch.Size([5, 16])
    """

    def __init__(
        self,
        in_dim: int,
        hidden: Sequence[int] = (128, 128),
        feature_dim: int = 64,
        dropout: float = 0.0,
        *,
        final_activation: bool = True,
    ) -> None:
        super().__init__()
        for name, v in (("in_dim", in_dim), ("feature_dim", feature_dim)):
            check_positive_int(v, name)
        hidden = tuple(hidden)
        if any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in hidden):
            raise ValueError(f"`hidden` must be a sequence of positive ints, got {hidden!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1), got {dropout!r}")
        self.in_dim = in_dim
        self.feature_dim = feature_dim
        layers: list[nn.Module] = []
        dims = (in_dim, *hidden)
        for a, b in itertools.pairwise(dims):
            layers += [nn.Linear(a, b), nn.ReLU()]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
        layers.append(nn.Linear(dims[-1], feature_dim))
        if final_activation:
            layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_dim:
            raise ValueError(f"`x` must have {self.in_dim} features in its last dim, got shape {tuple(x.shape)}")
        return self.net(x)


@register_backbone("mlp")
def mlp_backbone(
    in_dim: int,
    hidden: Sequence[int] = (128, 128),
    feature_dim: int = 64,
    dropout: float = 0.0,
    *,
    final_activation: bool = True,
) -> tuple[nn.Module, int]:
    """MLP for tabular data (:class:`MLPBackbone`); options ``in_dim``, ``hidden``, ``feature_dim``, ``dropout``."""
    net = MLPBackbone(in_dim, hidden, feature_dim, dropout, final_activation=final_activation)
    return net, feature_dim
