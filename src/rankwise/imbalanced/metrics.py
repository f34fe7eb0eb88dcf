"""Shot-group regression metrics of deep imbalanced regression (MAE, MSE, GM, Pearson, Spearman)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rankwise._binning import label_bins_np
from rankwise._stats import average_ranks, pearson_np
from rankwise._validation import check_positive

__all__ = ["regression_metrics", "shot_groups"]

_GROUPS = ("all", "many", "medium", "few")


def _to_numpy(x: Any, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().to(device="cpu", dtype=torch.float64).numpy()
    try:
        a = np.asarray(x, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise TypeError(f"`{name}` must be a tensor, array or sequence of numbers, got {type(x).__name__}") from None
    if not np.isfinite(a).all():
        raise ValueError(f"`{name}` must be finite, got NaN or inf")
    return a


#: floating dtypes from the most to the least precise (exact label matching uses the coarsest of the two)
_PRECISION = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def _label_dtype(x: Any) -> torch.dtype:
    """The floating dtype a label container was stored in (float64 for Python numbers and integers)."""
    if isinstance(x, torch.Tensor) and x.dtype in _PRECISION:
        return x.dtype
    if isinstance(x, np.ndarray) and x.dtype in (np.float32, np.float16):
        return torch.float32 if x.dtype == np.float32 else torch.float16
    return torch.float64


def _keys(labels: np.ndarray, bin_width: float | None, dtype: torch.dtype) -> np.ndarray:
    if bin_width is not None:
        return label_bins_np(labels, bin_width).astype(np.float64)
    if dtype == torch.float64:
        return labels
    # exact matching across dtypes: round both sides to the coarser dtype (float32 0.7 == float64 0.7)
    return torch.from_numpy(labels).to(dtype).to(torch.float64).numpy()


def _check_thresholds(many_shot: Any, few_shot: Any) -> tuple[float, float]:
    many = check_positive(many_shot, "many_shot", allow_zero=True)
    few = check_positive(few_shot, "few_shot", allow_zero=True)
    if few > many:
        raise ValueError(f"`few_shot` must be <= `many_shot`, got few_shot={few_shot}, many_shot={many_shot}")
    return many, few


def shot_groups(
    labels: Any,
    train_labels: Any,
    *,
    many_shot: float = 100,
    few_shot: float = 20,
    bin_width: float | None = None,
) -> dict[str, np.ndarray]:
    """Boolean masks ``{"many", "medium", "few"}`` over ``labels`` from the TRAINING count of each label.

    A sample's label (or its bin ``floor(label / bin_width)`` when ``bin_width`` is given, the same bins
    for train and test) is many-shot if it occurs more than ``many_shot`` times in ``train_labels``,
    few-shot if fewer than ``few_shot`` times (absent from training: 0, few-shot), medium otherwise.
    Bins follow :func:`rankwise.data.label_bins` (the same bin whatever the labels' dtype: a float32
    ``0.7`` is bin 7 of width 0.1, as the float64 one). Without ``bin_width`` labels are compared
    exactly (integer ages, as the DIR reference), after rounding both sides to the coarser of their
    two dtypes (so float32 test labels match float64 training labels of the same decimal value).

    Example:
        >>> from rankwise.imbalanced import shot_groups
        >>> g = shot_groups([1, 2, 3], [1] * 150 + [2] * 50 + [3] * 5)
        >>> {k: v.tolist() for k, v in g.items()}
        {'many': [True, False, False], 'medium': [False, True, False], 'few': [False, False, True]}
    """
    many, few = _check_thresholds(many_shot, few_shot)
    if bin_width is not None:
        bin_width = check_positive(bin_width, "bin_width")
    coarse = max(_label_dtype(labels), _label_dtype(train_labels), key=_PRECISION.index)
    y = _keys(_to_numpy(labels, "labels"), bin_width, coarse)
    tr = np.sort(_keys(_to_numpy(train_labels, "train_labels"), bin_width, coarse))
    counts = np.searchsorted(tr, y, side="right") - np.searchsorted(tr, y, side="left")
    return {"many": counts > many, "medium": (counts >= few) & (counts <= many), "few": counts < few}


def _gmean(abs_err: np.ndarray, eps: float) -> float:
    if eps == 0.0 and (abs_err == 0).any():
        return 0.0
    return float(np.exp(np.mean(np.log(abs_err + eps))))


def regression_metrics(
    preds: Any,
    labels: Any,
    train_labels: Any,
    *,
    many_shot: float = 100,
    few_shot: float = 20,
    bin_width: float | None = None,
    gmean_eps: float = 0.0,
) -> dict[str, Any]:
    r"""DIR evaluation: MAE, MSE and geometric mean of the errors, overall and per shot group.

    Groups come from :func:`shot_groups` (training count of each test label or bin: many-shot
    :math:`> 100`, few-shot :math:`< 20`, medium otherwise). In every group the errors are averaged over
    *samples* (not over labels), as the DIR reference does:
    :math:`\mathrm{MAE} = \mathrm{mean}|e_i|`, :math:`\mathrm{MSE} = \mathrm{mean}\,e_i^2`,
    :math:`\mathrm{GM} = \exp(\mathrm{mean}\log(|e_i| + \varepsilon))` with :math:`\varepsilon` =
    ``gmean_eps``. With the default ``gmean_eps=0`` an exact-zero error makes GM exactly 0 (the reference's
    ``scipy.stats.gmean`` behaviour, without its warning); pass e.g. ``gmean_eps=1e-8`` to keep GM
    informative for predictions that may hit labels exactly (integer-rounded outputs).

    ``"pearson"`` and ``"spearman"`` (average ranks for ties) are computed over all samples, as plain
    correlations in :math:`[-1, 1]` (STS-B-DIR reports them x100); ``None`` when undefined (fewer than
    two samples or a constant input).

    An empty group gives ``count`` 0 and ``None`` for its metrics (the reference crashes there).

    Args:
        preds: predictions, any shape with :math:`N` elements (a tensor, an array or a sequence); flattened.
        labels: targets, the same number of elements as ``preds``; flattened.
        train_labels: the training set's labels (only their counts matter).

    Returns:
        A dict of plain Python numbers,
        ``{"all"|"many"|"medium"|"few": {"mae", "mse", "gmean": float | None, "count": int},
        "pearson": float | None, "spearman": float | None}``.

    Example:
        >>> from rankwise.imbalanced import regression_metrics
        >>> m = regression_metrics([1.0, 2.5, 5.0], [1.0, 2.0, 3.0], [1] * 150 + [2] * 50)
        >>> m["all"]["mae"], m["all"]["gmean"], m["many"]["count"], m["few"]["mse"]
        (0.8333333333333334, 0.0, 1, 4.0)
        >>> regression_metrics([1.0, 2.5, 5.0], [1.0, 2.0, 3.0], [1] * 150)["medium"]
        {'mae': None, 'mse': None, 'gmean': None, 'count': 0}
    """
    gmean_eps = check_positive(gmean_eps, "gmean_eps", allow_zero=True)
    p = _to_numpy(preds, "preds")
    y = _to_numpy(labels, "labels")
    if p.shape != y.shape:
        raise ValueError(f"`preds` and `labels` must hold the same number of values, got {p.size} and {y.size}")
    groups = shot_groups(y, train_labels, many_shot=many_shot, few_shot=few_shot, bin_width=bin_width)
    err = p - y
    abs_err = np.abs(err)
    out: dict[str, Any] = {}
    for name in _GROUPS:
        mask = np.ones(y.shape, dtype=bool) if name == "all" else groups[name]
        n = int(mask.sum())
        if n == 0:
            out[name] = {"mae": None, "mse": None, "gmean": None, "count": 0}
            continue
        e = abs_err[mask]
        out[name] = {"mae": float(e.mean()), "mse": float((e * e).mean()), "gmean": _gmean(e, gmean_eps), "count": n}
    out["pearson"] = pearson_np(p, y)
    out["spearman"] = pearson_np(average_ranks(p), average_ranks(y)) if p.size >= 2 else None
    return out
