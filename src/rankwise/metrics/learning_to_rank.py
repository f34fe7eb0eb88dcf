r"""Learning-to-rank metrics on padded lists: NDCG@k, DCG@k, MRR@k and MAP@k.

Lists are the last dim of ``(*, n)`` tensors (any leading dims, flattened into the batch); a slot
whose ``y_true`` equals ``padding_indicator`` (default ``-1``) is padding and is ranked after every
real item, whatever the item's score (``-inf`` included). The conventions (gain :math:`2^y - 1`,
discount :math:`1/\log_2(r + 1)` at 1-based rank :math:`r`, ``ats`` clipped to the list length, the
order among tied predictions given by ``torch.sort(descending=True)``, NDCG ``filler_value=1`` for a
list without a relevant item) are those of allRank 1.4.3 (``allrank.models.metrics``), so its users
can swap the import; scikit-learn's ``ndcg_score`` differs (gain :math:`y`, tied predictions
averaged, 0 for a list without a relevant item). The outputs are ``(batch, len(ats))``. A list
with a NaN prediction in a real slot has no ranking: its row is NaN (the padded slots' predictions
are never read).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from rankwise._validation import (
    check_floating,
    check_real,
    check_same_device,
    common_compute_dtype,
    sort_padding_last,
)

__all__ = ["dcg", "map_at_k", "mrr", "ndcg", "power_gain"]


def power_gain(x: torch.Tensor) -> torch.Tensor:
    """The exponential gain :math:`2^x - 1` (the default of :func:`ndcg` and :func:`dcg`)."""
    return torch.pow(2.0, x) - 1.0


def _check_ats(ats: Any, n: int) -> list[int]:
    if ats is None:
        return [n]
    if isinstance(ats, int) and not isinstance(ats, bool):
        ats = [ats]
    if not isinstance(ats, Sequence) or not ats:
        raise TypeError(f"`ats` must be None or a non-empty sequence of positive ints, got {ats!r}")
    for a in ats:
        if isinstance(a, bool) or not isinstance(a, int) or a < 1:
            raise ValueError(f"`ats` must hold positive ints, got {a!r} in {ats!r}")
    return [min(a, n) for a in ats]


def _flat_lists(y_pred: Any, y_true: Any, padding_indicator: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, n) predictions and labels in the compute dtype, and the mask of real (unpadded) slots."""
    check_floating(y_pred, "y_pred")
    check_real(y_true, "y_true")
    check_same_device("y_pred", y_pred, ("y_true", y_true))
    if y_pred.shape != y_true.shape or y_pred.dim() == 0:
        raise ValueError(
            "`y_pred` and `y_true` must have the same shape (*, n), "
            f"got {tuple(y_pred.shape)} and {tuple(y_true.shape)}"
        )
    if isinstance(padding_indicator, bool) or not isinstance(padding_indicator, (int, float)):
        raise TypeError(f"`padding_indicator` must be a number, got {type(padding_indicator).__name__}")
    dt = common_compute_dtype(y_pred, y_true)
    n = y_pred.shape[-1]
    rows = math.prod(y_pred.shape[:-1])
    p = y_pred.detach().to(dt).reshape(rows, n)
    t = y_true.detach().reshape(rows, n)
    valid = t != padding_indicator
    return p, t.to(dt), valid


def _true_sorted_by_pred(p: torch.Tensor, t: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels in the order of descending predictions (padding last, label 0), and that order's validity."""
    _, idx = sort_padding_last(p, valid)
    return t.masked_fill(~valid, 0.0).gather(-1, idx), valid.gather(-1, idx)


def _discounts(n: int, like: torch.Tensor) -> torch.Tensor:
    return 1.0 / torch.log2(torch.arange(n, device=like.device, dtype=like.dtype) + 2.0)


def _dcg_flat(
    p: torch.Tensor, t: torch.Tensor, valid: torch.Tensor, ats: list[int], gain: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    ts, _ = _true_sorted_by_pred(p, t, valid)
    n = ts.shape[-1]
    if n == 0:
        return ts.new_zeros(ts.shape[0], len(ats))
    cum = torch.cumsum(gain(ts) * _discounts(n, ts), dim=-1)
    return cum[:, torch.tensor(ats, device=ts.device) - 1]


def _unflatten(out: torch.Tensor, like: torch.Tensor, p: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``out`` with a NaN row where a real slot's prediction is NaN (no rank), in the leading dims of ``like``."""
    out = torch.where((torch.isnan(p) & valid).any(dim=-1, keepdim=True), float("nan"), out)
    return out.reshape(*like.shape[:-1], out.shape[-1]) if like.dim() > 2 else out


def dcg(
    y_pred: torch.Tensor,
    y_true: torch.Tensor,
    *,
    ats: Sequence[int] | int | None = None,
    gain_function: Callable[[torch.Tensor], torch.Tensor] = power_gain,
    padding_indicator: float = -1,
) -> torch.Tensor:
    r"""Discounted cumulative gain at each rank of ``ats`` (the list length when ``None``).

    .. math:: \mathrm{DCG@}k = \sum_{r=1}^{k} \frac{g(y_{\pi(r)})}{\log_2(r + 1)}

    where :math:`\pi` orders the items by descending ``y_pred`` and :math:`g` is ``gain_function``.

    Shape:
        - y_pred, y_true: :math:`(*, n)`; padded slots have ``y_true == padding_indicator``.
        - output: :math:`(*, \text{len(ats)})` (``(B, len(ats))`` for 2-d inputs), compute dtype.

    Example:
        >>> import torch
        >>> from rankwise.metrics import dcg
        >>> dcg(torch.tensor([[0.5, 0.2]]), torch.tensor([[0.0, 1.0]]))
        tensor([[0.6309]])
    """
    p, t, valid = _flat_lists(y_pred, y_true, padding_indicator)
    return _unflatten(_dcg_flat(p, t, valid, _check_ats(ats, p.shape[-1]), gain_function), y_pred, p, valid)


def ndcg(
    y_pred: torch.Tensor,
    y_true: torch.Tensor,
    *,
    ats: Sequence[int] | int | None = None,
    gain_function: Callable[[torch.Tensor], torch.Tensor] = power_gain,
    padding_indicator: float = -1,
    filler_value: float = 1.0,
) -> torch.Tensor:
    r"""Normalised DCG at each rank of ``ats``: :math:`\mathrm{DCG@}k / \mathrm{IDCG@}k`.

    IDCG is the DCG of the labels sorted by themselves. A list whose IDCG is 0 (no item with a
    positive gain, or only padding) gets ``filler_value`` (allRank's convention, default 1.0).

    Shape:
        - y_pred, y_true: :math:`(*, n)`; padded slots have ``y_true == padding_indicator``.
        - output: :math:`(*, \text{len(ats)})`, compute dtype.

    Example:
        >>> import torch
        >>> from rankwise.metrics import ndcg
        >>> y_true = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, -1.0]])
        >>> ndcg(torch.tensor([[0.5, 0.2, 0.1], [0.5, 0.2, 1.0]]), y_true, ats=[1, 3])
        tensor([[1.0000, 0.9197],
                [0.0000, 0.6309]])
    """
    if isinstance(filler_value, bool) or not isinstance(filler_value, (int, float)):
        raise TypeError(f"`filler_value` must be a number, got {type(filler_value).__name__}")
    p, t, valid = _flat_lists(y_pred, y_true, padding_indicator)
    a = _check_ats(ats, p.shape[-1])
    ideal = _dcg_flat(t, t, valid, a, gain_function)
    got = _dcg_flat(p, t, valid, a, gain_function)
    zero = ideal == 0
    out = torch.where(zero, torch.full_like(got, float(filler_value)), got / torch.where(zero, 1.0, ideal))
    return _unflatten(out, y_pred, p, valid)


def mrr(
    y_pred: torch.Tensor,
    y_true: torch.Tensor,
    *,
    ats: Sequence[int] | int | None = None,
    padding_indicator: float = -1,
) -> torch.Tensor:
    r"""Reciprocal rank of the first item holding the list's highest label, cut at each rank of ``ats``.

    :math:`1 / r^\ast` if :math:`r^\ast \le k`, else 0, where :math:`r^\ast` is the (1-based) rank under
    descending ``y_pred`` of the first item whose label equals the list's maximum label (the relevant
    item for binary labels). A list whose labels are all <= 0 (nothing relevant) or only padding gets 0.

    allRank 1.4.3 applies that zero only when the labels of the **whole batch** are all 0 (a list
    without relevant items in a batch with some gets :math:`1/r^\ast` of its first item there); this
    function decides per list, so the two agree on every batch where each list has a relevant item
    or none has.

    Shape:
        - y_pred, y_true: :math:`(*, n)`; padded slots have ``y_true == padding_indicator``.
        - output: :math:`(*, \text{len(ats)})`, compute dtype.

    Example:
        >>> import torch
        >>> from rankwise.metrics import mrr
        >>> mrr(torch.tensor([[0.5, 0.2], [0.2, 0.5]]), torch.tensor([[0.0, 1.0], [0.0, 1.0]]), ats=[1, 2])
        tensor([[0.0000, 0.5000],
                [1.0000, 1.0000]])
    """
    p, t, valid = _flat_lists(y_pred, y_true, padding_indicator)
    a = _check_ats(ats, max(p.shape[-1], 1)) if ats is not None else [p.shape[-1]]
    ts, _ = _true_sorted_by_pred(p, t, valid)
    if ts.shape[-1] == 0:
        return _unflatten(ts.new_zeros(ts.shape[0], len(a)), y_pred, p, valid)
    best, first = ts.max(dim=-1)
    rank = first.to(ts.dtype) + 1.0
    rr = torch.where(best > 0, 1.0 / rank, torch.zeros_like(rank))
    at = torch.tensor(a, device=ts.device, dtype=ts.dtype)
    out = rr[:, None] * (rank[:, None] <= at).to(ts.dtype)
    return _unflatten(out, y_pred, p, valid)


def map_at_k(
    y_pred: torch.Tensor,
    y_true: torch.Tensor,
    *,
    ats: Sequence[int] | int | None = None,
    padding_indicator: float = -1,
    filler_value: float = 0.0,
) -> torch.Tensor:
    r"""Average precision at each rank of ``ats`` (items with ``y_true > 0`` are relevant).

    .. math::
        \mathrm{AP@}k = \frac{1}{\min(k, R)} \sum_{r=1}^{k} \mathrm{P@}r \cdot \mathrm{rel}_{\pi(r)}

    with :math:`R` the number of relevant items of the list and :math:`\mathrm{P@}r` the fraction of
    relevant items among the top :math:`r` (descending ``y_pred``). With ``ats=None`` (:math:`k = n`) this is
    the average precision of ``sklearn.metrics.average_precision_score`` on untied scores. Lists
    without a relevant item get ``filler_value``. The mean over the batch is MAP@k.

    Shape:
        - y_pred, y_true: :math:`(*, n)`; padded slots have ``y_true == padding_indicator``.
        - output: :math:`(*, \text{len(ats)})`, compute dtype.

    Example:
        >>> import torch
        >>> from rankwise.metrics import map_at_k
        >>> map_at_k(torch.tensor([[0.9, 0.8, 0.7, 0.1]]), torch.tensor([[1.0, 0.0, 2.0, -1.0]]), ats=[1, 3])
        tensor([[1.0000, 0.8333]])
    """
    if isinstance(filler_value, bool) or not isinstance(filler_value, (int, float)):
        raise TypeError(f"`filler_value` must be a number, got {type(filler_value).__name__}")
    p, t, valid = _flat_lists(y_pred, y_true, padding_indicator)
    n = p.shape[-1]
    a = _check_ats(ats, max(n, 1)) if ats is not None else [max(n, 1)]
    if n == 0:
        return _unflatten(p.new_full((p.shape[0], len(a)), float(filler_value)), y_pred, p, valid)
    ts, vs = _true_sorted_by_pred(p, t, valid)
    rel = ((ts > 0) & vs).to(p.dtype)
    hits = torch.cumsum(rel, dim=-1)
    pos = torch.arange(1, n + 1, device=p.device, dtype=p.dtype)
    cum_ap = torch.cumsum(rel * hits / pos, dim=-1)
    at = torch.tensor(a, device=p.device)
    n_rel = rel.sum(-1, keepdim=True)
    denom = torch.minimum(at.to(p.dtype)[None, :], n_rel)
    got = cum_ap[:, at - 1]
    out = torch.where(denom > 0, got / denom.clamp(min=1.0), torch.full_like(got, float(filler_value)))
    return _unflatten(out, y_pred, p, valid)
