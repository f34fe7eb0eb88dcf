"""Statistics shared by the library's metrics: Pearson's correlation and average-tie ranks (the
metrics, the imbalanced regression report, the brain-age metrics and the learned sorters' evaluation
use these)."""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["average_ranks", "pearson", "pearson_np"]


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


def pearson_np(a: np.ndarray, b: np.ndarray) -> float | None:
    """Pearson's r (:func:`pearson`) of two 1-D float arrays as a float; ``None`` where it is undefined
    (fewer than 2 values, a constant, a NaN)."""
    r = float(pearson(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)))
    return None if math.isnan(r) else r


def average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of a 1-D array, ties sharing their average rank (``scipy.stats.rankdata``'s default)."""
    order = np.argsort(x, kind="stable")
    xs = x[order]
    new = np.concatenate([[True], xs[1:] != xs[:-1]])
    group = np.cumsum(new) - 1
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], len(x)) - 1
    ranks = np.empty(len(x))
    ranks[order] = (starts[group] + ends[group]) / 2.0 + 1.0
    return ranks
