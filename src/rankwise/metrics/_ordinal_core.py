"""The float64 cores of the ordinal metrics, shared by :mod:`rankwise.metrics.ordinal` (functional) and
:mod:`rankwise.metrics.streaming` (torchmetrics): no argument checks, no host sync."""

from __future__ import annotations

import math
from typing import Literal

import torch

from rankwise._stats import pearson
from rankwise.ops.ranking import rank

KappaWeights = Literal["quadratic", "linear"] | None

#: the shot groups of :func:`rankwise.imbalanced.shot_groups`, in the order of the streaming states
SHOT_GROUPS = ("many", "medium", "few")

F64 = torch.float64
NAN = math.nan


def any_nan(*xs: torch.Tensor) -> torch.Tensor:
    """0-dim bool: some element of some ``x`` is NaN (no host sync)."""
    out = torch.zeros((), dtype=torch.bool, device=xs[0].device)
    for x in xs:
        out = out | torch.isnan(x).any()
    return out


def nan_where(bad: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    return torch.where(bad, torch.full_like(value, NAN), value)


def kappa_from_confusion(confusion: torch.Tensor, weights: KappaWeights = "quadratic") -> torch.Tensor:
    """Weighted kappa of a ``(K, K)`` confusion matrix of counts (rows targets, columns predictions),
    with the defined values of :func:`rankwise.metrics.quadratic_weighted_kappa` (float64, no host sync)."""
    c = confusion.to(F64)
    k = c.shape[0]
    idx = torch.arange(k, dtype=F64, device=c.device)
    diff = idx[:, None] - idx[None, :]
    if weights is None:
        w = (diff != 0).to(F64)
    elif weights == "linear":
        w = diff.abs()
    else:
        w = diff.square()
    n = c.sum()
    observed = (w * c).sum()
    expected = (w * (c.sum(1)[:, None] * c.sum(0)[None, :])).sum() / n.clamp(min=1)
    defined = 1.0 - observed / torch.where(expected > 0, expected, torch.ones_like(expected))
    # expected == 0 with N > 0: every target and prediction in the same class, so observed == 0 too
    undefined = torch.where(observed == 0, torch.ones_like(observed), torch.zeros_like(observed))
    out = torch.where(expected > 0, defined, undefined)
    return nan_where(n == 0, out)


def spearman_rho(p: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    if p.numel() < 2:
        return torch.full((), NAN, dtype=F64, device=p.device)
    return pearson(rank(p, ties="average"), rank(t, ties="average"))


def _tied_pairs(new_group: torch.Tensor) -> torch.Tensor:
    """Number of pairs inside the groups of a sorted sequence (``new_group[i]``: element ``i`` starts one)."""
    pos = torch.arange(new_group.numel(), device=new_group.device)
    first = torch.where(new_group, pos, torch.zeros_like(pos)).cummax(0).values
    return (pos - first).sum()  # each element pairs with the earlier members of its group


def _new_groups(sorted_values: torch.Tensor) -> torch.Tensor:
    new = torch.ones(sorted_values.shape, dtype=torch.bool, device=sorted_values.device)
    new[1:] = sorted_values[1:] != sorted_values[:-1]
    return new


def _group_bounds(group: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """First and one-past-last index of each element's run of equal values in a sorted ``group`` (O(N))."""
    n = group.numel()
    new = torch.ones(n, dtype=torch.bool, device=group.device)
    new[1:] = group[1:] != group[:-1]
    last = torch.ones_like(new)
    last[:-1] = new[1:]
    start = torch.where(new, pos, torch.zeros_like(pos)).cummax(0).values
    end = torch.where(last, pos + 1, torch.full_like(pos, n)).flip(0).cummin(0).values.flip(0)
    return start, end


def _inversions(r: torch.Tensor) -> torch.Tensor:
    """Number of pairs ``i < j`` with ``r[i] > r[j]`` of integers ``0 <= r < N`` (O(N log N) time, O(N) memory).

    A pair is counted at the highest bit where ``r[i]`` and ``r[j]`` differ: there the two share the
    higher bits (one group) and ``r[i]`` has a 1, ``r[j]`` a 0. The bits are visited from the highest
    down, the elements kept in order of their higher bits (stably: each group in position order); at
    each bit a cumulative sum counts, for each element with a 0, the earlier elements of its group with
    a 1, then each group is split stably by that bit (a radix step: positions from cumulative sums, no sort).
    """
    n = r.numel()
    pos = torch.arange(n, device=r.device)
    order = pos  # sorted by r >> nbits == 0: position order
    total = torch.zeros((), dtype=torch.long, device=r.device)
    for b in reversed(range(max(1, (n - 1).bit_length()))):
        rv = r[order]
        group, bit = rv >> (b + 1), (rv >> b) & 1  # group is non-decreasing along `order`
        start, end = _group_bounds(group, pos)
        ones_incl = bit.cumsum(0)
        ones_excl = ones_incl - bit
        ones_before = ones_excl - ones_excl[start]  # earlier 1s of the same group
        total = total + (ones_before * (1 - bit)).sum()
        group_zeros = (end - start) - (ones_incl[end - 1] - ones_excl[start])
        zeros_before = (pos - start) - ones_before
        new_pos = start + torch.where(bit == 0, zeros_before, group_zeros + ones_before)
        order = torch.empty_like(order).index_copy_(0, new_pos, order)
    return total


def kendall_tau_b(p: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    n = p.numel()
    if n < 2:
        return torch.full((), NAN, dtype=F64, device=p.device)
    order = torch.argsort(t, stable=True)
    order = order[torch.argsort(p[order], stable=True)]  # lexicographic by (p, t)
    ps, ts = p[order], t[order]
    new_p, new_pt = _new_groups(ps), _new_groups(ts)
    new_pt = new_pt | new_p
    x_ties = _tied_pairs(new_p)
    y_ties = _tied_pairs(_new_groups(t.sort().values))
    joint_ties = _tied_pairs(new_pt)
    dense_t = rank(ts, ties="dense").to(torch.long) - 1
    discordant = _inversions(dense_t)  # pairs with p_i <= p_j and t_i > t_j: p_i < p_j (lexicographic order)
    total = n * (n - 1) // 2
    con_minus_dis = total - x_ties - y_ties + joint_ties - 2 * discordant
    den_x, den_y = (total - x_ties).to(F64), (total - y_ties).to(F64)
    undefined = (den_x == 0) | (den_y == 0)
    safe = torch.ones_like(den_x)
    tau = (
        con_minus_dis.to(F64) / torch.where(undefined, safe, den_x).sqrt() / torch.where(undefined, safe, den_y).sqrt()
    )
    tau = tau.clamp(-1.0, 1.0)  # as SciPy: rounding may leave |tau| a hair above 1
    return nan_where(undefined | any_nan(p, t), tau)
