"""Ordinal-regression heads."""

from __future__ import annotations

import torch
from torch import nn

from rankwise._validation import check_bool, check_positive_int

__all__ = ["CoralLayer"]


class CoralLayer(nn.Module):
    r"""The CORAL head (Cao, Mirjalili & Raschka, Pattern Recognit. Lett. 2020): one weight vector
    shared by the :math:`K - 1` rank thresholds, plus one bias per threshold.

    :math:`z_k = w^\top x + b_k`, :math:`k = 0, \dots, K-2`: the thresholds differ only by their
    biases, so once the biases are ordered (:math:`b_0 \ge b_1 \ge \dots`, which CORAL's training
    keeps) the probabilities :math:`\sigma(z_k) = P(y > k)` are ordered as well: the head is rank
    consistent. Train it with :func:`rankwise.losses.coral_loss` and decode with
    :func:`rankwise.losses.coral_predict`.

    Equal to ``coral_pytorch.layers.CoralLayer`` 1.4.0: the same parameters and names
    (``coral_weights``, a bias-free ``nn.Linear(in_features, 1)``; ``coral_bias``, shape ``(K-1,)``), so
    a state dict of one loads into the other; with ``preinit_bias=True`` the biases start at the
    reference's descending values :math:`(K-1-k) / (K-1)`, i.e. ``[(K-1)/(K-1), ..., 1/(K-1)]`` (else
    zeros); the weights are drawn by the same ``nn.Linear`` initialisation in the same order (so the
    same seed gives the same layer); the forward is the same expression. The biases are created in
    the default dtype (the reference: always float32) so that the layer is of one dtype.

    Args:
        in_features: the size :math:`d` of each input.
        num_classes: the number of classes :math:`K \ge 2`.
        preinit_bias: start the biases at the descending values above (faster training, per the
            authors) instead of zeros.

    Shape:
        - input: :math:`(*, d)`, any leading dims (usually :math:`(B, d)`).
        - output: :math:`(*, K-1)`, the threshold logits.

    Example:
        >>> import torch
        >>> from rankwise.models import CoralLayer
        >>> head = CoralLayer(16, num_classes=5)
        >>> head.coral_bias
        Parameter containing:
        tensor([1.0000, 0.7500, 0.5000, 0.2500], requires_grad=True)
        >>> head(torch.randn(8, 16)).shape
        torch.Size([8, 4])
    """

    def __init__(self, in_features: int, num_classes: int, *, preinit_bias: bool = True) -> None:
        super().__init__()
        self.in_features = check_positive_int(in_features, "in_features")
        k = check_positive_int(num_classes, "num_classes")
        if k < 2:
            raise ValueError(f"`num_classes` must be >= 2 (an ordinal problem has at least two classes), got {k}")
        self.num_classes = k
        self.preinit_bias = check_bool(preinit_bias, "preinit_bias")
        self.coral_weights = nn.Linear(self.in_features, 1, bias=False)
        dtype = torch.get_default_dtype()
        if preinit_bias:
            bias = torch.arange(k - 1, 0, -1, dtype=dtype) / (k - 1)
        else:
            bias = torch.zeros(k - 1, dtype=dtype)
        self.coral_bias = nn.Parameter(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"`x` must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"`x` must have shape (*, in_features) = (*, {self.in_features}), got {tuple(x.shape)}")
        return self.coral_weights(x) + self.coral_bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, num_classes={self.num_classes}, preinit_bias={self.preinit_bias}"
