"""Exact ranks and blackbox-differentiable ranks."""

from __future__ import annotations

from typing import Literal

import torch

from rankwise._twin import FunctionModule
from rankwise._validation import (
    check_bool,
    check_choice,
    check_dim,
    check_floating,
    check_positive,
    check_real,
    nan_slices,
    rank_dtype,
    to_compute,
)
from rankwise.ops._registry import register_op
from rankwise.ops._sort import sort_last as _sort_last
from rankwise.ops._sort import sorted_values_last as _sorted_values_last

__all__ = ["BlackboxRank", "Rank", "blackbox_rank", "rank"]

Ties = Literal["ordinal", "average", "min", "max", "dense"]
_TIES = ("ordinal", "average", "min", "max", "dense")


def _out_dtype(x: torch.Tensor) -> torch.dtype:
    # ranks are exact integers up to n: float32 for fp16/bf16 (exact only to 2048 / 256 there)
    return rank_dtype(x.dtype)


def rank_last(
    x: torch.Tensor, descending: bool, ties: str, normalize: bool = False, *, nan_check: bool = True
) -> torch.Tensor:
    """Ranks (1..n, float; divided by n when ``normalize``) along the last dim of ``x`` (any leading dims).

    ``nan_check=False`` skips the NaN-slice pass (callers whose result is NaN anyway for a NaN input)."""
    n = x.shape[-1]
    out_dtype = _out_dtype(x)
    if x.numel() == 0:
        return torch.empty(x.shape, dtype=out_dtype, device=x.device)
    # stable sort: among ties the earlier index comes first in both orders
    if ties == "ordinal":
        _, perm = _sort_last(x, descending)
        # the ordinal ranks of the sorted positions are the same for every row: one (n,) vector
        ranks_sorted = torch.arange(1, n + 1, dtype=out_dtype, device=x.device)
    else:
        sorted_vals, perm = _sorted_values_last(x, descending)
        pos = torch.arange(n, device=x.device).expand_as(perm)
        new_group = torch.ones_like(perm, dtype=torch.bool)
        new_group[..., 1:] = sorted_vals[..., 1:] != sorted_vals[..., :-1]
        if ties == "dense":
            ranks_sorted = new_group.cumsum(-1).to(out_dtype)
        else:
            # first position of each element's tie group: running max of group starts
            first = torch.where(new_group, pos, torch.zeros_like(pos)).cummax(-1).values
            # last position: next group's start - 1, computed right to left
            ends = torch.full_like(pos, n - 1)
            ends[..., :-1] = torch.where(new_group[..., 1:], pos[..., :-1], torch.full_like(pos[..., :-1], n - 1))
            last = ends.flip(-1).cummin(-1).values.flip(-1)
            if ties == "min":
                ranks_sorted = first.to(out_dtype) + 1
            elif ties == "max":
                ranks_sorted = last.to(out_dtype) + 1
            else:  # average
                ranks_sorted = (first + last).to(out_dtype) / 2 + 1
    if normalize:
        ranks_sorted = ranks_sorted / n
    out = torch.empty(perm.shape, dtype=out_dtype, device=x.device).scatter_(-1, perm, ranks_sorted.expand_as(perm))
    # NaN policy (scipy.stats.rankdata(nan_policy="propagate")): a slice holding a NaN is all NaN
    return nan_slices(out, x, nan_only=True) if nan_check else out


def rank(
    x: torch.Tensor,
    *,
    dim: int = -1,
    descending: bool = False,
    ties: Ties = "ordinal",
    normalize: bool = False,
) -> torch.Tensor:
    r"""Exact ranks :math:`1..n` along ``dim`` (not differentiable).

    ``rank(x)[..., j]`` is the position of ``x[..., j]`` in the sorted order, counted from 1.
    Ties follow ``scipy.stats.rankdata(method=ties)``:

    * ``"ordinal"`` — stable: among equal values the earlier index gets the smaller rank;
    * ``"average"`` — fractional ranks (mean of the positions a tie group occupies);
    * ``"min"`` / ``"max"`` — lowest / highest position of the tie group;
    * ``"dense"`` — like ``"min"`` but consecutive groups get consecutive ranks.

    With ``descending=True`` the largest value gets rank 1. With ``normalize=True`` ranks are
    divided by ``n`` (so they lie in ``(0, 1]``).

    Mapping to the reference code: ``rank(x, descending=True, normalize=True)`` is RankSim's
    ``rank_normalised`` and SoDeep's ``get_rank`` (largest -> ``1/n``; they break ties in
    argsort order, rankwise breaks them stably); with ``ties="average"`` it is ``get_tiedrank``.

    Shape:
        - x: :math:`(*, n, *)` — any real shape; ranked along ``dim``.
        - output: same shape as ``x``; dtype of ``x``, except float32 for float16/bfloat16 input (ranks
          above 2048 / 256 are not representable there) and the default float dtype for integer input.

    Degenerate inputs: an empty tensor gives an empty result; ``n = 1`` gives rank 1; all-equal
    values give ``1..n`` (ordinal) or ``(n+1)/2`` (average). Non-finite values follow
    ``scipy.stats.rankdata(nan_policy="propagate")``: a slice (along ``dim``) holding a NaN is all
    NaN; ``-inf`` / ``+inf`` are ranked as the smallest / largest values.

    Example:
        >>> import torch, rankwise
        >>> rankwise.rank(torch.tensor([9.0, 5.0, 11.0, 6.0]), descending=True)
        tensor([2., 4., 1., 3.])
        >>> rankwise.rank(torch.tensor([1.0, 1.0, 2.0]), ties="average")
        tensor([1.5000, 1.5000, 3.0000])
    """
    check_real(x, "x")
    check_choice(ties, "ties", _TIES)
    check_bool(descending, "descending")
    check_bool(normalize, "normalize")
    if x.dim() == 0:
        raise ValueError("`x` must have at least 1 dimension, got a 0-d tensor")
    d = check_dim(x, dim)
    xt = x.detach().movedim(d, -1)
    return rank_last(xt, descending, ties, normalize).movedim(-1, d)


class BlackboxRankFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, lambda_val: float, descending: bool, normalize: bool, nan_check: bool = True):  # type: ignore[override]
        r = rank_last(x, descending, "ordinal", normalize, nan_check=nan_check).to(x.dtype)
        ctx.lambda_val = lambda_val
        ctx.descending = descending
        ctx.normalize = normalize
        ctx.nan_check = nan_check
        ctx.save_for_backward(x, r)
        return r

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):  # type: ignore[override]
        x, r = ctx.saved_tensors
        lam = ctx.lambda_val
        x_prime = x + lam * grad_output.to(x.dtype)
        r_prime = rank_last(x_prime, ctx.descending, "ordinal", ctx.normalize, nan_check=ctx.nan_check)
        return (r_prime - r).mul_(1.0 / lam), None, None, None, None


def blackbox_rank(
    x: torch.Tensor,
    lambda_val: float,
    *,
    dim: int = -1,
    descending: bool = False,
    normalize: bool = False,
) -> torch.Tensor:
    r"""Exact ranks forward, blackbox-differentiation gradients backward.

    Forward returns :func:`rank` (ordinal ties). Backward uses the interpolation of Vlastelica
    et al. (ICLR'20) as applied to ranking by Rolínek et al. (CVPR'20) and RankSim (eq. 6-7):

    .. math::
        \frac{\partial L}{\partial x} = -\frac{1}{\lambda}
        \bigl(\mathrm{rk}(x) - \mathrm{rk}(x + \lambda\,\tfrac{\partial L}{\partial \mathrm{rk}})\bigr)

    ``lambda_val`` (> 0) is the interpolation strength. RankSim uses
    ``blackbox_rank(s, lambda_val, descending=True, normalize=True)`` on each row of the
    feature-similarity matrix (its ``TrueRanker``). The reference adds ``1e-8`` to ``lambda``;
    rankwise validates ``lambda_val > 0`` instead, so values differ by a relative ``1e-8``.

    Shape:
        - x: :math:`(*, n, *)` floating; ranked along ``dim``.
        - output: same shape as ``x``; dtype of ``x``, float32 for float16/bfloat16 (exact ranks).

    Non-finite values as in :func:`rank`: a slice holding a NaN is all NaN, ``+-inf`` are ordered.

    Example:
        >>> import torch, rankwise
        >>> s = torch.tensor([[0.3, 0.9, 0.1]], requires_grad=True)
        >>> r = rankwise.blackbox_rank(s, 2.0, descending=True, normalize=True)
        >>> r
        tensor([[0.6667, 0.3333, 1.0000]], grad_fn=<...>)
        >>> ((r - torch.tensor([[1 / 3, 2 / 3, 1.0]])) ** 2).sum().backward()
        >>> s.grad.shape
        torch.Size([1, 3])
    """
    check_floating(x, "x")
    lam = check_positive(lambda_val, "lambda_val")
    check_bool(descending, "descending")
    check_bool(normalize, "normalize")
    if x.dim() == 0:
        raise ValueError("`x` must have at least 1 dimension, got a 0-d tensor")
    d = check_dim(x, dim)
    xt = to_compute(x.movedim(d, -1))  # fp16/bf16: ranks (and their blackbox backward) in float32
    if xt.numel() == 0:
        return xt * 0
    r = BlackboxRankFunction.apply(xt, lam, descending, normalize)
    return r.movedim(-1, d)


class Rank(FunctionModule):
    """Module twin of :func:`rank`."""

    _function = staticmethod(rank)
    _options = ("dim", "descending", "ties", "normalize")
    _shown = ("dim", "descending", "ties!r", "normalize")

    def __init__(
        self, *, dim: int = -1, descending: bool = False, ties: Ties = "ordinal", normalize: bool = False
    ) -> None:
        super().__init__()
        check_choice(ties, "ties", _TIES)
        check_bool(descending, "descending")
        check_bool(normalize, "normalize")
        self.dim, self.descending, self.ties, self.normalize = dim, descending, ties, normalize


class BlackboxRank(FunctionModule):
    """Module twin of :func:`blackbox_rank` holding ``lambda_val``."""

    _function = staticmethod(blackbox_rank)
    _options = ("dim", "descending", "normalize")
    _positional = ("lambda_val",)

    def __init__(
        self, lambda_val: float = 2.0, *, dim: int = -1, descending: bool = False, normalize: bool = False
    ) -> None:
        super().__init__()
        self.lambda_val = check_positive(lambda_val, "lambda_val")
        check_bool(descending, "descending")
        check_bool(normalize, "normalize")
        self.dim, self.descending, self.normalize = dim, descending, normalize


register_op(
    "rank",
    module=Rank,
    gradient="none",
    nonfinite="order",
)(rank)
register_op(
    "blackbox_rank",
    module=BlackboxRank,
    gradient="surrogate",
    nonfinite="order",
)(blackbox_rank)
