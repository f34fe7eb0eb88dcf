r"""LapSum: soft rank, soft sort and soft top-k from sums of Laplace CDFs.

Struski et al., ICML 2025, "LapSum - One Method to Differentiate Them All: Ranking, Sorting and
Top-k Selection". With the Laplace CDF :math:`F(t) = \tfrac12 e^{t}` (:math:`t \le 0`),
:math:`1 - \tfrac12 e^{-t}` (:math:`t > 0`) and the scale ``alpha`` (:math:`\alpha > 0`), the
*LapSum* of a slice :math:`x_1..x_n` is the increasing function

.. math::
    G(b) = \sum_{j=1}^{n} F\!\left(\frac{b - x_j}{\alpha}\right), \qquad G: \mathbb{R} \to (0, n).

* soft rank: :math:`r_i = G(x_i) + \tfrac12` (ranks 1..n; ties get equal ranks);
* soft sort: :math:`s_i = G^{-1}(i - \tfrac12)`, :math:`i = 1..n` (the i-th soft order statistic);
* soft top-k: :math:`p_j = F((x_j - b)/\alpha)` with :math:`b` the solution of
  :math:`\sum_j F((x_j - b)/\alpha) = k`, so :math:`\sum_j p_j = k` and :math:`0 < p_j < 1`.

After one sort of the slice, :math:`G` at the sorted points follows from prefix sums
:math:`A_m = \sum_{j \le m} e^{(x_j - x_m)/\alpha}` and suffix sums
:math:`B_m = \sum_{j \ge m} e^{(x_m - x_j)/\alpha}` (:math:`G(x_m) = m - \tfrac12 + (B_m - A_m)/2`,
1-based), and between two consecutive sorted points :math:`G(b) = w` is a quadratic in
:math:`e^{b/\alpha}`: the inverse is closed-form. Everything is O(n log n) time (the sort) and O(n)
memory per slice; gradients are those of the closed forms (by autograd, O(n) too; first derivatives
only: a backward pass with ``create_graph=True`` raises), equal to the
implicit-function gradients of the paper (e.g. :math:`\partial s_i / \partial x_j =
f(s_i - x_j) / \sum_l f(s_i - x_l)`, :math:`f` the Laplace density).

``descending=True`` applies the ascending operator to ``-x`` (ranks: the largest gets 1; sort: largest
first; top-k: the largest scores are selected, the default of :func:`lapsum_topk`). The authors'
code encodes the direction in the sign of ``alpha`` (negative: descending); here ``alpha > 0`` and the
direction is ``descending``.

Backends: float32/float64 CPU inputs take the numba kernels of :mod:`rankwise._kernels.lapsum`
(one sort and one float64 pass per row; the backward is the analytic vector-Jacobian product
above, O(n) after the saved sort order) once they are loaded (``RANKWISE_NUMBA``, see
:mod:`rankwise._kernels._loader`); other devices and dtypes, and calls before the kernels are
loaded, take the torch-ops path below (same values and gradients to float rounding).

Precision (torch path): the prefix sums are running ``logcumsumexp`` of :math:`x/\alpha` (centred on the middle
element of the sorted slice), whose relative error is about ``eps * (max(x) - min(x)) / alpha``; they
are computed in float64 for every input dtype (float32 inputs: the rest in float32).
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any

import torch

from rankwise._kernels import lapsum as kernels
from rankwise._registry import RelaxationInfo
from rankwise._twin import FunctionModule
from rankwise._validation import (
    check_bool,
    check_dim,
    check_floating_nd,
    check_positive,
    compute_dtype,
    nan_slices,
)
from rankwise.ops._registry import register_op
from rankwise.ops.soft import register_soft_method

__all__ = ["LapSumRank", "LapSumSort", "LapSumTopK", "lapsum_rank", "lapsum_sort", "lapsum_topk"]


# --------------------------------------------------------------------------------------------------
# the LapSum machinery (inputs: compute dtype, the slice along the last dim)
# --------------------------------------------------------------------------------------------------
def _laplace_cdf(t: torch.Tensor) -> torch.Tensor:
    """:math:`F(t)` with the density :math:`\tfrac12 e^{-|t|}` as gradient everywhere, ``t = 0`` included
    (``-|t|`` as a ``torch.where``: ``abs`` and ``clamp`` have a zero gradient there)."""
    neg = t <= 0
    e = torch.exp(torch.where(neg, t, -t))
    return torch.where(neg, 0.5 * e, 1 - 0.5 * e)


class _LogCumSumExp(torch.autograd.Function):
    """``torch.logcumsumexp`` along the last dim with a first-order backward that is finite for zero
    incoming gradients (PyTorch's own is, but its second derivative is NaN there, e.g. for the sparse
    gradients that ``gather`` sends back): a backward pass that builds a graph raises instead."""

    @staticmethod
    def forward(ctx: Any, z: torch.Tensor) -> torch.Tensor:
        out = torch.logcumsumexp(z, dim=-1)
        ctx.save_for_backward(z, out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():  # backward(create_graph=True): the result would miss second-order terms
            raise RuntimeError(
                "LapSum operators have first derivatives only: a backward pass with create_graph=True "
                "(second derivatives) is not supported"
            )
        # dL_m/dz_j = exp(z_j - L_m) for j <= m: grad_j = sum_{m >= j} g_m exp(z_j - L_m), the positive
        # and the negative parts of g each as a reversed running log-sum-exp
        z, out = ctx.saved_tensors
        ninf = torch.full((), -math.inf, dtype=z.dtype, device=z.device)
        result = torch.zeros_like(z)
        for sign in (1.0, -1.0):
            part = grad * sign
            mask = part > 0
            log_part = torch.where(mask, torch.log(torch.where(mask, part, torch.ones_like(part))), ninf)
            acc = torch.logcumsumexp((log_part - out).flip(-1), dim=-1).flip(-1)
            result = result + sign * torch.exp(acc + z)
        return result


def _logcumsumexp(z: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = _LogCumSumExp.apply(z)
    return out


def _prefix_suffix(xs: torch.Tensor, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``A_m = sum_{j<=m} exp((x_j - x_m)/alpha)`` and ``B_m = sum_{j>=m} exp((x_m - x_j)/alpha)`` of an
    ascending slice ``xs`` (last dim, n >= 1)."""
    n = xs.shape[-1]
    x64 = xs.to(torch.float64)  # the running log-sum-exps lose eps * |z|: float64 inside
    z = (x64 - x64[..., n // 2 : n // 2 + 1].detach()) / alpha
    log_a = _logcumsumexp(z) - z
    log_b = _logcumsumexp((-z).flip(-1)).flip(-1) + z
    return torch.exp(log_a).to(xs.dtype), torch.exp(log_b).to(xs.dtype)


def _knots(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``G(x_m)`` at the sorted points, 0-based ``m``: ``m + 1/2 + (B_m - A_m) / 2``."""
    m = torch.arange(a.shape[-1], device=a.device, dtype=a.dtype)
    return m + 0.5 + 0.5 * (b - a)


def _inverse(xs: torch.Tensor, a: torch.Tensor, b: torch.Tensor, w: torch.Tensor, alpha: float) -> torch.Tensor:
    """The solutions ``t`` of ``G(t) = w`` (``w`` in (0, n), shape ``(..., m)``) for the ascending slice
    ``xs`` with prefix/suffix sums ``a``, ``b``; closed form on the segment of sorted points holding ``t``."""
    n = xs.shape[-1]
    g = _knots(a, b).detach()
    seg = torch.searchsorted(g.contiguous(), w.detach().contiguous(), side="left") - 1  # in [-1, n-1]
    lo, hi = seg.clamp(min=0), (seg + 1).clamp(max=n - 1)
    r, s = xs.gather(-1, lo), xs.gather(-1, hi)
    # on [r, s]: G(t) = c - P/2 exp(-(t - r)/alpha) + Q/2 exp((t - s)/alpha), c = seg + 1
    zero = torch.zeros((), dtype=xs.dtype, device=xs.device)
    p = torch.where(seg >= 0, a.gather(-1, lo), zero)
    q = torch.where(seg <= n - 2, b.gather(-1, hi), zero)
    d = w - (seg + 1).to(xs.dtype)
    pos, neg = d > 0, d < 0
    one = torch.ones((), dtype=xs.dtype, device=xs.device)
    pqe = p * q * torch.exp((r - s) / alpha)
    root = torch.sqrt(torch.where(pos | neg, d * d + pqe, one))  # d = 0: unused (pqe may underflow to 0)
    # every branch gets finite arguments (the unused ones a placeholder 1), so gradients stay finite
    log_p = torch.log(torch.where(pos, one, p))
    log_q = torch.log(torch.where(neg, one, q))
    t_pos = s - alpha * log_q + alpha * torch.log(torch.where(pos, d + root, one))
    t_neg = r + alpha * log_p - alpha * torch.log(torch.where(neg, root - d, one))
    t_mid = 0.5 * (r + s) + 0.5 * alpha * (log_p - log_q)
    return torch.where(pos, t_pos, torch.where(neg, t_neg, t_mid))


def _rank_last(x: torch.Tensor, *, descending: bool = False, alpha: float = 1.0) -> torch.Tensor:
    """Soft ranks 1..n along the last dim (compute dtype in, same dtype out)."""
    alpha = check_positive(alpha, "alpha")
    if x.shape[-1] == 0:
        return x * 0
    if _use_kernels(x):
        return _kernel_call(x, "rank", alpha, descending, 0.0)
    y = -x if descending else x
    ys, idx = torch.sort(y, dim=-1)
    a, b = _prefix_suffix(ys, alpha)
    ranks_sorted = _knots(a, b) + 0.5
    return torch.zeros_like(ranks_sorted).scatter(-1, idx, ranks_sorted)


def _sort_last(x: torch.Tensor, *, descending: bool = False, alpha: float = 1.0) -> torch.Tensor:
    """Soft sort along the last dim (compute dtype in, same dtype out)."""
    alpha = check_positive(alpha, "alpha")
    n = x.shape[-1]
    if n == 0:
        return x * 0
    if _use_kernels(x):
        return _kernel_call(x, "sort", alpha, descending, 0.0)
    y = -x if descending else x
    ys = torch.sort(y, dim=-1).values
    a, b = _prefix_suffix(ys, alpha)
    w = (torch.arange(n, device=x.device, dtype=x.dtype) + 0.5).expand(ys.shape)
    out = _inverse(ys, a, b, w, alpha)
    return -out if descending else out


def _topk_last(x: torch.Tensor, k: float, *, descending: bool, alpha: float) -> torch.Tensor:
    n = x.shape[-1]
    if k >= n:  # G(b) = n only as b -> inf: every element is selected
        return x * 0 + 1
    if _use_kernels(x):
        return _kernel_call(x, "topk", alpha, descending, k)
    y = -x if descending else x
    ys = torch.sort(y, dim=-1).values
    a, b = _prefix_suffix(ys, alpha)
    w = torch.full((*ys.shape[:-1], 1), float(k), dtype=x.dtype, device=x.device)
    threshold = _inverse(ys, a, b, w, alpha)
    return _laplace_cdf((threshold - y) / alpha)


# --------------------------------------------------------------------------------------------------
# CPU: one sort and one fused kernel pass per row, forward and backward (rankwise._kernels.lapsum)
# --------------------------------------------------------------------------------------------------
def _use_kernels(x: torch.Tensor) -> bool:
    """Whether the CPU kernels serve ``x`` (float32/float64 CPU rows on the last dim) now."""
    return x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and kernels.ready()


class _LapSumCPU(torch.autograd.Function):
    """LapSum's rank / sort / top-k of the rows of ``x`` (CPU) by the kernels: the forward sorts
    each row once and evaluates the closed forms in one pass; the backward is the analytic
    vector-Jacobian product (:mod:`rankwise._kernels._numba_lapsum`) from the saved input and sort
    order. First derivatives only, as the torch path."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, kind: str, alpha: float, descending: bool, k: float) -> torch.Tensor:  # type: ignore[override]
        x2 = x.reshape(-1, x.shape[-1])
        out, perm = kernels.forward(x2, kernels.KINDS[kind], alpha, descending, k)
        ctx.save_for_backward(x2, perm)
        ctx.cfg = (kind, alpha, descending, k)
        return out.reshape(x.shape)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        if torch.is_grad_enabled():  # backward(create_graph=True)
            raise RuntimeError(
                "LapSum operators have first derivatives only: a backward pass with create_graph=True "
                "(second derivatives) is not supported"
            )
        x2, perm = ctx.saved_tensors
        kind, alpha, descending, k = ctx.cfg
        g = kernels.backward(grad.reshape(x2.shape), x2, perm, kernels.KINDS[kind], alpha, descending, k)
        return g.reshape(grad.shape), None, None, None, None


def _nan_slices(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The NaN policy: NaN slices where ``x`` holds a NaN or inf (the kernels write them already)."""
    return out if _use_kernels(x) else nan_slices(out, x)


def _kernel_call(x: torch.Tensor, kind: str, alpha: float, descending: bool, k: float) -> torch.Tensor:
    out: torch.Tensor = _LapSumCPU.apply(x, kind, alpha, descending, k)
    return out


# --------------------------------------------------------------------------------------------------
# public functions
# --------------------------------------------------------------------------------------------------
def _check_common(x: Any, name: str, dim: Any, descending: Any, alpha: Any) -> tuple[int, float]:
    check_floating_nd(x, name)
    check_bool(descending, "descending")
    return check_dim(x, dim), check_positive(alpha, "alpha")


def lapsum_rank(x: torch.Tensor, alpha: float = 1.0, *, dim: int = -1, descending: bool = False) -> torch.Tensor:
    r"""LapSum soft ranks (1..n, ascending unless ``descending``) of ``x`` along ``dim``.

    .. math::
        r_i = \tfrac12 + \sum_{j=1}^{n} F\!\left(\frac{x_i - x_j}{\alpha}\right),

    :math:`F` the Laplace CDF with scale ``alpha`` (Struski et al., ICML 2025, "LapSum - One Method to
    Differentiate Them All: Ranking, Sorting and Top-k Selection"). O(n log n). The ranks sum to
    :math:`n(n+1)/2`, tied inputs get equal ranks, and as ``alpha → 0`` they tend to
    ``rankwise.rank(x)`` (average ranks for ties); as ``alpha`` grows they tend to ``(n + 1) / 2``.
    Also ``rankwise.soft_rank(x, method="lapsum", alpha=...)``. The authors' ``soft_rank`` returns
    0-based ranks, ``r - 1``, and its ``alpha < 0`` is ``descending=True`` here.

    Shape:
        - x: :math:`(*, n, *)` floating, ranked along ``dim``.
        - output: same shape as ``x``; dtype of ``x``, float32 for float16/bfloat16 (ranks reach n).

    A slice (along ``dim``) holding a NaN or inf gives NaN for the whole slice (docs/conventions.md).

    Example:
        >>> import torch, rankwise
        >>> x = torch.tensor([[3.0, 1.0, 2.0]])
        >>> rankwise.lapsum_rank(x, 0.01)
        tensor([[3., 1., 2.]])
        >>> rankwise.lapsum_rank(x, 1.0, descending=True)
        tensor([[1.2516, 2.7484, 2.0000]])
    """
    d, a = _check_common(x, "x", dim, descending, alpha)
    xm = x.movedim(d, -1).to(compute_dtype(x.dtype))
    out = _nan_slices(_rank_last(xm, descending=descending, alpha=a), xm)
    return out.movedim(-1, d)


def lapsum_sort(x: torch.Tensor, alpha: float = 1.0, *, dim: int = -1, descending: bool = False) -> torch.Tensor:
    r"""LapSum soft sort of ``x`` along ``dim``: the inverse of the sum of Laplace CDFs at half-integers.

    .. math::
        s_i = G^{-1}\!\left(i - \tfrac12\right), \quad G(t) = \sum_{j=1}^{n} F\!\left(\frac{t - x_j}{\alpha}\right),
        \quad i = 1..n,

    in closed form on the segment of sorted inputs holding :math:`s_i` (Struski et al., ICML 2025,
    "LapSum - One Method to Differentiate Them All: Ranking, Sorting and Top-k Selection"). O(n log n);
    the output is increasing (decreasing if ``descending``), its gradient
    :math:`\partial s_i / \partial x_j = e^{-|s_i - x_j|/\alpha} / \sum_l e^{-|s_i - x_l|/\alpha}` is a
    stochastic matrix, and as ``alpha → 0`` it tends to ``torch.sort(x).values``. A constant slice is
    returned unchanged. Also ``rankwise.soft_sort(x, method="lapsum", alpha=...)``.

    Shape:
        - x: :math:`(*, n, *)` floating, sorted along ``dim``.
        - output: same shape and dtype as ``x`` (float16/bfloat16 computed in float32).

    A slice (along ``dim``) holding a NaN or inf gives NaN for the whole slice (docs/conventions.md).

    Example:
        >>> import torch, rankwise
        >>> x = torch.tensor([[3.0, 1.0, 2.0]])
        >>> rankwise.lapsum_sort(x, 0.01)
        tensor([[1., 2., 3.]])
        >>> rankwise.lapsum_sort(x, 0.01, descending=True)
        tensor([[3., 2., 1.]])
    """
    d, a = _check_common(x, "x", dim, descending, alpha)
    xm = x.movedim(d, -1)
    xc = xm.to(compute_dtype(x.dtype))
    out = _nan_slices(_sort_last(xc, descending=descending, alpha=a), xc)
    return out.to(x.dtype).movedim(-1, d)


def _check_k(k: Any, n: int) -> float:
    if isinstance(k, bool) or not isinstance(k, Real):
        raise TypeError(f"`k` must be an int or a float, got {type(k).__name__}")
    v = float(k)
    if not 0 < v <= n:
        raise ValueError(f"`k` must be in (0, {n}] (n = {n} along `dim`), got {k!r}")
    return v


def lapsum_topk(
    scores: torch.Tensor, k: float, alpha: float = 1.0, *, dim: int = -1, descending: bool = True
) -> torch.Tensor:
    r"""LapSum soft top-``k`` membership of ``scores`` along ``dim``.

    .. math::
        p_j = F\!\left(\frac{x_j - b}{\alpha}\right), \qquad \sum_{j=1}^{n} F\!\left(\frac{x_j - b}{\alpha}\right) = k,

    :math:`F` the Laplace CDF, the threshold :math:`b` in closed form after one sort (Struski et al.,
    ICML 2025, "LapSum - One Method to Differentiate Them All: Ranking, Sorting and Top-k Selection").
    O(n log n) time, O(n) memory. :math:`0 < p_j < 1` and :math:`\sum_j p_j = k` (to rounding) for every
    ``alpha``; ``k`` may be any real in ``(0, n]`` (``k = n`` gives all ones). As ``alpha → 0`` ``p`` tends
    to the 0/1 indicator of the ``k`` largest scores (``descending=False``: the ``k`` smallest); tied
    scores share. Equals the authors' ``soft_topk(x, k, alpha, largest=descending)``.

    Shape:
        - scores: :math:`(*, n, *)` floating, selected along ``dim``.
        - output: same shape and dtype as ``scores`` (float16/bfloat16 computed in float32).

    A slice (along ``dim``) holding a NaN or inf gives NaN for the whole slice (docs/conventions.md).

    Example:
        >>> import torch, rankwise
        >>> s = torch.tensor([0.3, 2.0, -1.0, 1.5])
        >>> rankwise.lapsum_topk(s, 2, 0.01).round(decimals=4)
        tensor([0., 1., 0., 1.])
        >>> round(float(rankwise.lapsum_topk(s, 2, 1.0).sum()), 6)
        2.0
    """
    d, a = _check_common(scores, "scores", dim, descending, alpha)
    kk = _check_k(k, scores.shape[d])
    sm = scores.movedim(d, -1)
    sc = sm.to(compute_dtype(scores.dtype))
    out = _nan_slices(_topk_last(sc, kk, descending=descending, alpha=a), sc)
    return out.to(scores.dtype).movedim(-1, d)


# --------------------------------------------------------------------------------------------------
# module twins
# --------------------------------------------------------------------------------------------------
class LapSumRank(FunctionModule):
    """Module twin of :func:`lapsum_rank`."""

    _function = staticmethod(lapsum_rank)
    _options = ("alpha", "dim", "descending")

    def __init__(self, alpha: float = 1.0, *, dim: int = -1, descending: bool = False) -> None:
        super().__init__()
        self.alpha = check_positive(alpha, "alpha")
        self.dim, self.descending = dim, check_bool(descending, "descending")


class LapSumSort(FunctionModule):
    """Module twin of :func:`lapsum_sort`."""

    _function = staticmethod(lapsum_sort)
    _options = ("alpha", "dim", "descending")

    def __init__(self, alpha: float = 1.0, *, dim: int = -1, descending: bool = False) -> None:
        super().__init__()
        self.alpha = check_positive(alpha, "alpha")
        self.dim, self.descending = dim, check_bool(descending, "descending")


class LapSumTopK(FunctionModule):
    """Module twin of :func:`lapsum_topk` holding ``k`` and its options."""

    _function = staticmethod(lapsum_topk)
    _options = ("alpha", "dim", "descending")
    _positional = ("k",)

    def __init__(self, k: float, alpha: float = 1.0, *, dim: int = -1, descending: bool = True) -> None:
        super().__init__()
        if isinstance(k, bool) or not isinstance(k, Real):
            raise TypeError(f"`k` must be an int or a float, got {type(k).__name__}")
        if not float(k) > 0:
            raise ValueError(f"`k` must be > 0, got {k!r}")
        self.k = k
        self.alpha = check_positive(alpha, "alpha")
        self.dim, self.descending = dim, check_bool(descending, "descending")


# --------------------------------------------------------------------------------------------------
# registration
# --------------------------------------------------------------------------------------------------
def _soft_rank_impl(x: torch.Tensor, *, descending: bool = False, alpha: float = 1.0) -> torch.Tensor:
    return _rank_last(x, descending=descending, alpha=alpha)


def _soft_sort_impl(x: torch.Tensor, *, descending: bool = False, alpha: float = 1.0) -> torch.Tensor:
    xc = x.to(compute_dtype(x.dtype))
    return _sort_last(xc, descending=descending, alpha=alpha).to(x.dtype)


register_soft_method("lapsum", sort=_soft_sort_impl, rank=_soft_rank_impl)

_LAPSUM_RELAXATION = RelaxationInfo(
    "lapsum",
    returns="soft_rank",
    options={"alpha": 1.0},
    description="LapSum soft ranks from sums of Laplace CDFs (Struski et al.); loss = mean (soft rank - rank)^2",
)
register_op("lapsum_rank", module=LapSumRank, relaxation=_LAPSUM_RELAXATION)(lapsum_rank)
register_op("lapsum_sort", module=LapSumSort)(lapsum_sort)
register_op("lapsum_topk", module=LapSumTopK)(lapsum_topk)
