"""Statistics shared by the library's metrics: Pearson's correlation (the metrics, the imbalanced
regression report and the learned sorters' evaluation use this one)."""

from __future__ import annotations

import torch

__all__ = ["pearson"]


def pearson(a: torch.Tensor, b: torch.Tensor, *, dim: int = -1) -> torch.Tensor:
    r"""Pearson's correlation of ``a`` and ``b`` along ``dim``; NaN where it is undefined.

    .. math:: r = \frac{\sum_i (a_i - \bar a)(b_i - \bar b)}
                       {\sqrt{\sum_i (a_i - \bar a)^2 \sum_i (b_i - \bar b)^2}}

    Undefined (NaN): a constant ``a`` or ``b`` (zero variance), which includes a single value and no
    value at all; a NaN input gives NaN. Computed in the inputs' dtype (float32 for float16 /
    bfloat16); no host sync.

    Shape:
        - a, b: :math:`(*, n, *)`, the same shape.
        - output: the shape without ``dim``.

    Example:
        >>> import torch
        >>> pearson(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2.0, 4.0, 7.0])).round(decimals=4)
        tensor(0.9934)
        >>> pearson(torch.tensor([1.0, 2.0]), torch.tensor([5.0, 5.0]))
        tensor(nan)
    """
    if a.shape != b.shape:
        raise ValueError(f"`a` and `b` must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    dtype = torch.promote_types(a.dtype, b.dtype)
    if dtype != torch.float64:
        dtype = torch.float32
    a, b = a.to(dtype), b.to(dtype)
    da = a - a.mean(dim, keepdim=True)
    db = b - b.mean(dim, keepdim=True)
    den = ((da * da).sum(dim) * (db * db).sum(dim)).sqrt()
    r = (da * db).sum(dim) / torch.where(den == 0, torch.ones_like(den), den)
    return torch.where(den == 0, torch.full_like(r, float("nan")), r)
