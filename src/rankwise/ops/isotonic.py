"""Isotonic soft sort / soft rank (Blondel et al., ICML'20): projections onto the permutahedron.

Registers the soft method ``"isotonic"`` (``rankwise.soft_rank(x, method="isotonic", ...)``) and the
operators ``soft_rank_isotonic`` and ``soft_sort_isotonic`` (``regularization="l2"`` or ``"kl"``).

Backends: on CPU the pool-adjacent-violators (PAV) kernels of :mod:`rankwise._kernels.isotonic`
(O(n) after the O(n log n) sort; loaded as ``RANKWISE_NUMBA`` says, see
:mod:`rankwise._kernels._loader`); on CUDA a Triton PAV kernel (``rankwise._kernels.triton_isotonic``;
O(n) time and memory per row after ``torch.sort``, rows in parallel, no host sync); on other devices,
or before / without those kernels, a vectorized PyTorch formulation based on the min-max
characterization of isotonic regression (O(n^2) time and memory per row, no host sync).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch

from rankwise._autograd import graph_vjp
from rankwise._kernels import isotonic as kernels
from rankwise._registry import RelaxationInfo
from rankwise._twin import FunctionModule
from rankwise._validation import (
    check_bool,
    check_choice,
    check_dim,
    check_floating_nd,
    check_positive,
    nan_slices,
    rank_dtype,
    to_compute,
)
from rankwise.ops._registry import register_op
from rankwise.ops._sort import sorted_values_last
from rankwise.ops.soft import register_soft_method

__all__ = ["IsotonicSoftRank", "IsotonicSoftSort", "soft_rank_isotonic", "soft_sort_isotonic"]

Regularization = Literal["l2", "kl"]
_REGULARIZATIONS = ("l2", "kl")

#: "auto": numba on CPU tensors when available, Triton on CUDA tensors (rows of at least
#: ``_TRITON_MIN_N``), PyTorch otherwise; "torch" forces the vectorized PyTorch path (used by the
#: tests to check it against the numba path on CPU); "triton" forces the Triton projection on every
#: device (CPU tensors need ``TRITON_INTERPRET=1``: the tests run the kernels so without a GPU).
_BACKEND: Literal["auto", "torch", "triton"] = "auto"

#: CUDA rows of at least this length use the Triton projection, shorter ones the O(n^2) min-max
#: formulation. ``benchmarks/gpu.py`` times both (its "crossover" section, figures in
#: benchmarks/results/gpu.json): Triton was faster, and used O(n) instead of O(n^2) memory, at every
#: length it measured (n >= 8); shorter rows were not measured.
_TRITON_MIN_N = 8

#: two block values count as tied (and are pooled) when the left one exceeds the right one by at most
#: ``_TIE_TOL * (m_left + m_right)``, ``m`` = the block's largest ``|s|`` + largest ``|w|`` (``kl``: plus
#: ``|lse(s_B)| + |lse(w_B)| + 1``): a few ulps of the local magnitudes, never growing with n; the same
#: rule as the CPU kernels (``rankwise._kernels._numba_isotonic.TIE_ULPS``)
_TIE_ULPS = 4.0
_TIE_TOL = _TIE_ULPS * torch.finfo(torch.float64).eps

#: element budget (rows * n * n) of one chunk of the O(n^2) PyTorch path
_MINMAX_BUDGET = 1 << 24


# --------------------------------------------------------------------------------------------------
# segment helpers (blocks are contiguous runs; ``flat`` = block id + row * n)
# --------------------------------------------------------------------------------------------------
def _flat_ids(ids: torch.Tensor) -> torch.Tensor:
    rows, n = ids.shape
    offs = torch.arange(rows, device=ids.device, dtype=ids.dtype).unsqueeze(-1) * n
    return (ids + offs).reshape(-1)


def _seg_sum(x: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """Per-position sum of ``x`` over its block, shape of ``x``."""
    sums = torch.zeros(x.numel(), dtype=x.dtype, device=x.device).index_add_(0, flat, x.reshape(-1))
    return sums.index_select(0, flat).reshape(x.shape)


def _seg_logsumexp(x: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """Per-position logsumexp of ``x`` over its block, shape of ``x`` (stable: max-shifted)."""
    xf = x.reshape(-1)
    m = torch.full_like(xf, -math.inf).scatter_reduce_(0, flat, xf, reduce="amax", include_self=True)
    m_pos = m.index_select(0, flat)
    sums = torch.zeros_like(xf).index_add_(0, flat, torch.exp(xf - m_pos))
    return (m_pos + torch.log(sums.index_select(0, flat))).reshape(x.shape)


def _projection_from_blocks(s: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, reg: str) -> torch.Tensor:
    """``mu = s - v`` given the block structure of the isotonic solution ``v``, computed in float64."""
    flat = _flat_ids(ids)
    s64, w64 = s.double(), w.double().expand_as(s)
    if reg == "l2":
        v = _seg_sum(s64 - w64, flat) / _seg_sum(torch.ones_like(s64), flat)
    else:
        v = _seg_logsumexp(s64, flat) - _seg_logsumexp(w64, flat)
    return (s64 - v).to(s.dtype)


# --------------------------------------------------------------------------------------------------
# block structure of the decreasing isotonic regression
# --------------------------------------------------------------------------------------------------
def _segment_magnitude(s: torch.Tensor, w: torch.Tensor, j: torch.Tensor, l: torch.Tensor) -> torch.Tensor:
    """``max |s_{j..l}| + max |w_{j..l}|`` for sorted ``s``, ``w`` (the largest magnitude sits at an end)."""
    abs_s, abs_w = s.abs(), w.abs()
    return torch.maximum(abs_s.gather(-1, j), abs_s.gather(-1, l)) + torch.maximum(
        abs_w.gather(-1, j), abs_w.gather(-1, l)
    )


def _block_ids_minmax(s: torch.Tensor, w: torch.Tensor, reg: str) -> torch.Tensor:
    r"""Block index of every position, by the min-max characterization (vectorized, no host sync).

    With :math:`\gamma(j..l)` the value of the pooled block ``j..l`` (mean of ``s - w`` for l2,
    ``lse(s_{j..l}) - lse(w_{j..l})`` for kl), a block boundary lies between ``k`` and ``k + 1`` iff
    :math:`\min_{j \le k} \gamma(j..k) > \max_{l > k} \gamma(k+1..l)` beyond the tie tolerance of the
    two minimizing/maximizing segments (the rule the PAV kernel applies to the blocks it compares).
    Every :math:`\gamma(j..l)` is accumulated from its own first element (a cumulative sum along ``l``
    for each ``j``), so its round-off is local to the segment, as in PAV; kl uses
    :math:`\mathrm{lse}(s_{j..l}) = s_j + \log\sum_{i=j}^{l} e^{s_i - s_j}` (terms <= 1: ``s`` and ``w``
    are sorted decreasingly). O(n^2) time and memory per row, processed in chunks of rows.
    """
    rows, n = s.shape
    dev = s.device
    idx = torch.arange(n, device=dev)
    upper = idx.unsqueeze(-1) <= idx.unsqueeze(0)  # [j, l]: j <= l
    length = (idx.unsqueeze(0) - idx.unsqueeze(-1) + 1).clamp_min(1).to(torch.float64)
    w_full = w.expand(rows, n)
    chunk = max(1, _MINMAX_BUDGET // max(n * n, 1))
    parts = []
    for r0 in range(0, rows, chunk):  # a fixed number of chunks (shape-dependent), not a loop over rows
        sc = s[r0 : r0 + chunk].double()
        wc = w_full[r0 : r0 + chunk].double()
        zero = sc.new_zeros(())
        if reg == "l2":
            g = torch.where(upper, (sc - wc).unsqueeze(-2), zero).cumsum(-1) / length  # [r, j, l]
            lse_s = lse_w = None
        else:
            es = torch.where(upper, torch.exp(sc.unsqueeze(-2) - sc.unsqueeze(-1)), zero).cumsum(-1)
            ew = torch.where(upper, torch.exp(wc.unsqueeze(-2) - wc.unsqueeze(-1)), zero).cumsum(-1)
            lse_s = sc.unsqueeze(-1) + torch.log(es)
            lse_w = wc.unsqueeze(-1) + torch.log(ew)
            del es, ew
            g = lse_s - lse_w
        # lo[k] = min_{j<=k} gamma(j..k) (segment j_lo[k]..k); hi[j] = max_{l>=j} gamma(j..l) (segment j..l_hi[j])
        lo, j_lo = torch.where(upper, g, math.inf).min(dim=-2)
        hi, l_hi = torch.where(upper, g, -math.inf).max(dim=-1)
        # tolerance: local magnitudes of the two segments
        k = idx.expand_as(lo)
        m_left = _segment_magnitude(sc, wc, j_lo, k)  # segment j_lo[k]..k
        m_right = _segment_magnitude(sc, wc, k, l_hi)  # segment j..l_hi[j]
        if lse_s is not None and lse_w is not None:
            flat_l = lse_s.flatten(-2)
            flat_w = lse_w.flatten(-2)
            at_left = j_lo * n + k
            at_right = k * n + l_hi
            m_left = m_left + flat_l.gather(-1, at_left).abs() + flat_w.gather(-1, at_left).abs() + 1.0
            m_right = m_right + flat_l.gather(-1, at_right).abs() + flat_w.gather(-1, at_right).abs() + 1.0
        start = torch.ones_like(lo, dtype=torch.bool)
        start[:, 1:] = lo[:, :-1] - hi[:, 1:] > _TIE_TOL * (m_left[:, :-1] + m_right[:, 1:])
        parts.append(torch.cumsum(start, dim=-1) - 1)
    return torch.cat(parts, dim=0)


# --------------------------------------------------------------------------------------------------
# CUDA: Triton PAV kernels (imported on the first CUDA tensor)
# --------------------------------------------------------------------------------------------------
_tk: Any = None  # rankwise._kernels.triton_isotonic once imported (None: not yet, or Triton is unavailable)
_tk_tried = False


def _triton_kernels() -> Any:
    """The Triton kernels module (imported on the first call), or ``None`` (with one warning)."""
    global _tk, _tk_tried
    if not _tk_tried:
        _tk_tried = True
        try:
            from rankwise._kernels import triton_isotonic

            _tk = triton_isotonic
        except Exception as exc:  # no Triton (e.g. a CPU-only build of torch): the min-max path
            import warnings

            warnings.warn(
                f"rankwise: Triton is unavailable ({exc!r}); isotonic soft sort/rank use the slower "
                "O(n^2)-memory PyTorch path on CUDA",
                RuntimeWarning,
                stacklevel=3,
            )
    return _tk


def _triton_for(s: torch.Tensor) -> Any:
    """The Triton kernels when the projection of ``s`` (rows, n) runs on them (see ``_BACKEND``)."""
    if _BACKEND == "triton" or (_BACKEND == "auto" and s.device.type == "cuda" and s.shape[-1] >= _TRITON_MIN_N):
        return _triton_kernels()
    return None


def _isotonic(s: torch.Tensor, w: torch.Tensor, reg: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``mu = s - v`` and the block ids of the decreasing isotonic regression ``v`` (no autograd)."""
    if _cpu_kernels(s, call=False):
        mu, ids = kernels.pav(s.detach(), w.detach(), reg == "kl")
        return mu, ids
    with torch.no_grad():
        ids = _block_ids_minmax(s.detach(), w.detach(), reg)
        return _projection_from_blocks(s.detach(), w.detach(), ids, reg), ids


class _PermutahedronProjection(torch.autograd.Function):
    r"""``mu = s - v(s, w)`` with ``v`` the decreasing isotonic regression (both sorted decreasingly).

    Jacobians are block-diagonal (per PAV block ``B``): l2: :math:`\partial\mu/\partial s = I - M`,
    :math:`\partial\mu/\partial w = M` with ``M`` the block-averaging matrix; kl:
    :math:`\partial\mu/\partial s = I - 1_B \mathrm{softmax}_B(s)^\top`,
    :math:`\partial\mu/\partial w = 1_B \mathrm{softmax}_B(w)^\top`.
    """

    @staticmethod
    def forward(ctx, s: torch.Tensor, w: torch.Tensor, reg: str) -> torch.Tensor:  # type: ignore[override]
        ctx.reg = reg
        ctx.w_shared = w.shape[0] != s.shape[0]
        tk = _triton_for(s)
        if tk is not None:  # CUDA: Triton PAV; saves block ids, starts and statistics
            mu, state = tk.projection_forward(s, w, reg == "kl")
            ctx.triton = tk
            ctx.save_for_backward(s, w, *state)
            return mu
        mu, ids = _isotonic(s, w, reg)
        ctx.triton = None
        ctx.save_for_backward(s, w, ids)
        return mu

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        s, w, ids, *state = ctx.saved_tensors
        grad = grad.to(s.dtype)
        need_s, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if ctx.triton is not None:
            # l2 only: on a GPU the kl backward kernel gave wrong gradients on a small fraction of the
            # entries of long rows, so kl takes the O(n) segment ops below
            if not grad.requires_grad and ctx.reg == "l2":
                grads = ctx.triton.projection_backward(grad, s, w, (ids, *state), False, need_s, need_w)
                return grads[0], grads[1], None
            ids = ids.long()  # kl and double backward: the differentiable segment ops below
        elif not grad.requires_grad and _cpu_kernels(s, call=False):  # CPU: one pass over the blocks
            gs, gw = kernels.pav_backward(grad, s, w, ids, ctx.reg == "kl", need_s, need_w)
            return (gs if need_s else None), (gw if need_w else None), None
        flat = _flat_ids(ids)
        gsum = _seg_sum(grad, flat)
        grad_s: torch.Tensor | None = None
        grad_w: torch.Tensor | None = None
        if ctx.reg == "l2":
            mean = gsum / _seg_sum(torch.ones_like(grad), flat)
            if need_s:
                grad_s = grad - mean
            if need_w:
                grad_w = mean
        else:
            if need_s:
                grad_s = grad - torch.exp(s - _seg_logsumexp(s, flat)) * gsum
            if need_w:
                wf = w.expand_as(s)
                grad_w = torch.exp(wf - _seg_logsumexp(wf, flat)) * gsum
        if grad_w is not None and ctx.w_shared:
            grad_w = grad_w.sum(0, keepdim=True)
        return grad_s, grad_w, None


def _centred(grad: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """``grad`` minus its block maximum: exactly 0 where ``grad`` is constant on a block, so the
    Jacobian products below do not turn the round-off of a constant cotangent into ``u / eps``."""
    gf = grad.reshape(-1)
    top = torch.full_like(gf, -math.inf).scatter_reduce_(0, flat, gf, reduce="amax", include_self=True)
    return grad - top.index_select(0, flat).reshape(grad.shape)


class _KLRankProjection(torch.autograd.Function):
    r"""``r = exp(s - v(s, w))`` (KL soft ranks, both sorted decreasingly; ``w`` receives no gradient).

    Per PAV block ``B``, :math:`r_i = p_i \sum_B e^{w}` with :math:`p = \mathrm{softmax}_B(s)`, so the
    vector-Jacobian product is :math:`r_j (g_j - \sum_{i \in B} p_i g_i)`, evaluated on the block-centred
    cotangent: exactly 0 for a cotangent constant on each block (the sum of the ranks is constant), where
    ``g * r - p * sum(g * r)`` left a round-off of ``u |s|`` that ``1 / eps`` scales past the float16 range.
    """

    @staticmethod
    def forward(ctx, s: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        tk = _triton_for(s)
        if tk is not None:
            mu, state = tk.projection_forward(s, w, True)
            ids = state[0].long()
        else:
            mu, ids = _isotonic(s, w, "kl")
        r = torch.exp(mu)
        ctx.save_for_backward(s, w, ids, r)
        return r

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        s, w, ids, r = ctx.saved_tensors
        flat = _flat_ids(ids)
        s64 = s.double()  # as the forward's block statistics: softmax of |s| ~ 1e3 loses u |s| in float32
        if grad.requires_grad or s.requires_grad:  # double backward: r from differentiable ops of s
            r = torch.exp(s64 - _seg_logsumexp(s64, flat) + _seg_logsumexp(w.double().expand_as(s), flat))
        d = _centred(grad.double(), flat)
        p = torch.exp(s64 - _seg_logsumexp(s64, flat))
        return (r.double() * (d - _seg_sum(p * d, flat))).to(s.dtype), None


# --------------------------------------------------------------------------------------------------
# conditioning: far-apart entries and large offsets (the strength negligible relative to the spread)
# --------------------------------------------------------------------------------------------------
#: inputs whose largest ``|x| / eps`` exceeds this many gap limits take the conditioned path on CPU
_CONDITION_FACTOR = 64.0


def _gap_limit(n: int, kl: bool) -> float:
    r"""A gap between consecutive sorted ``z = x / eps`` beyond which PAV never pools across it.

    With ``w`` the sorted weights (``rho`` or ``log rho``, spread ``n - 1`` or ``log n``), every pooled
    value :math:`\gamma(j..k)` lies within ``[s_k - w_0 - log n, s_j - w_{n-1} + log n]`` (l2 without the
    ``log n``), so a gap larger than ``spread(w) + 2 log n`` always separates two blocks; doubled (plus 2)
    for a margin far above the tie tolerance."""
    spread = math.log(n) if kl else n - 1.0
    return 2.0 * (spread + 2.0 * math.log(max(n, 1)) + 1.0)


def _sort_gap_limit(w: torch.Tensor, n: int, kl: bool) -> torch.Tensor:
    """Per row of the sorted ``x`` (``w``, rows x n): the gap of the soft sort's targets ``rho / eps``
    (their gaps are ``1 / eps``) beyond which no block pools: twice the spread of ``w`` for l2 (exactly
    scale-free), :func:`_gap_limit`'s margin with the spread of ``w`` for kl."""
    spread = (w[:, :1] - w[:, -1:]).abs()
    if not kl:
        return 2.0 * spread
    return 2.0 * (spread + 2.0 * math.log(max(n, 1)) + 1.0)


def _condition_rank_inputs(y: torch.Tensor, eps: float, limit: float) -> torch.Tensor:
    r"""``s = y / eps`` for decreasingly sorted rows ``y``, as PAV should see them at any magnitude.

    The projection depends on ``s`` only through the differences inside runs of gaps at most ``limit``
    (:func:`_gap_limit`): a wider gap always separates blocks, and a constant added to a run shifts
    its ``v`` by the same constant, leaving ``mu = s - v`` unchanged. Rows whose largest ``|s|``
    exceeds ``_CONDITION_FACTOR * limit`` (where ``s - (s - w)`` would round ``w`` away: 1e18-scale
    inputs gave ranks of 0) are replaced by runs laid out from 0 with gaps of exactly ``limit``
    between them: ``(y_i - y_{start}) / eps`` (exact differences of nearby floats, never ``x / eps``
    itself, which can overflow) plus the run's offset. The offsets are constants of the run, which
    the projection's Jacobian annihilates, so the derivative is the plain ``1 / eps``. Same values as
    the unconditioned formula in exact arithmetic; no host sync.
    """
    rows, n = y.shape
    s = y / eps
    if n < 2:
        return s
    yd = y.detach()
    far = (yd.abs().amax(dim=-1, keepdim=True) / eps) > _CONDITION_FACTOR * limit
    cut = (yd[:, :-1] - yd[:, 1:]) > limit * eps  # NaN gaps (non-finite rows, NaN-ed later) never cut
    start = torch.cat([torch.ones_like(cut[:, :1]), cut], dim=-1)
    idx = torch.arange(n, device=y.device).expand(rows, n)
    first = torch.where(start, idx, 0).cummax(dim=-1).values
    local = (y - yd.gather(-1, first)) / eps
    ld = local.detach()
    step = torch.zeros_like(ld)
    step[:, 1:] = torch.where(cut, ld[:, :-1] - limit, 0.0)
    return torch.where(far, local + step.cumsum(dim=-1), s)


def _conditioned_rows(xc: torch.Tensor, eps: float, kl: bool) -> torch.Tensor:
    """``xc`` with each row whose magnitude needs :func:`_condition_rank_inputs` (where the fused soft-rank
    kernels would round the soft part away: 1e20-scale float32 rows gave ranks of 0) replaced by its
    conditioned values times ``eps``, back in the input order: the same soft ranks, and the
    derivative of the identity (the conditioning's offsets are constants of each run). Tensor ops only
    (no host read): the soft-rank path of a traced (``torch.compile``) CPU call."""
    n = xc.shape[-1]
    limit = _gap_limit(n, kl)
    y, perm = sorted_values_last(xc, descending=True)
    s = _condition_rank_inputs(y, eps, limit)
    far = (xc.detach().abs().amax(dim=-1, keepdim=True) / eps) > _CONDITION_FACTOR * limit
    return torch.where(far, torch.empty_like(s).scatter(-1, perm, s * eps), xc)


def _rank_far(magnitude: float, n: int, eps: float, kl: bool) -> bool:
    """Whether soft ranks of rows whose largest finite ``|x|`` is ``magnitude`` need the conditioning
    of the composite path (magnitudes where the fused kernels would lose the soft part)."""
    return n >= 2 and magnitude / eps > _CONDITION_FACTOR * _gap_limit(n, kl)


def _sort_checks(xc: torch.Tensor, eps: float, kl: bool) -> tuple[bool, bool]:
    """Soft sort on CPU, one host read: ``(far, finite)``. ``far``: ``1 / eps`` beyond some row's gap
    limit (the composite path returns the sorted rows exactly); ``finite``: every entry is finite
    (then no row needs NaN-ing). (Soft ranks read both from :func:`kernels.rank_forward_checked`.)"""
    n = xc.shape[-1]
    xd = xc.detach()
    lo, hi = torch.aminmax(xd, dim=-1)
    limit = _sort_gap_limit(torch.stack([hi, lo], dim=-1).nan_to_num(nan=0.0), n, kl)
    # an overflowing sum of finite rows only takes the NaN-ing path needlessly
    least, total = torch.stack([limit.amin(), lo.sum() + hi.sum()]).tolist()
    return n >= 2 and 1.0 / eps > _CONDITION_FACTOR * least, math.isfinite(total)


# --------------------------------------------------------------------------------------------------
# soft rank / soft sort on the last dim
# --------------------------------------------------------------------------------------------------
def _check_options(regularization: str, regularization_strength: float) -> float:
    check_choice(regularization, "regularization", _REGULARIZATIONS)
    return check_positive(regularization_strength, "regularization_strength")


def _nan_rows(out: torch.Tensor, xc: torch.Tensor, finite: bool) -> torch.Tensor:
    """:func:`nan_slices` of the rows of ``xc``, skipped when ``finite`` (known on CPU from
    :func:`kernels.rank_forward_checked` / :func:`_sort_checks`: no device to synchronize with, and
    no extra autograd node)."""
    return out if finite else nan_slices(out, xc)


def _isotonic_last(
    x: torch.Tensor,
    cpu_op: Any,
    composite: Any,
    out_dtype: torch.dtype,
    descending: bool,
    regularization: Regularization,
    regularization_strength: float,
) -> torch.Tensor:
    """Soft ranks or sorts of ``x`` along its last dim: ``cpu_op`` (an autograd Function around the
    fused CPU kernels) on CPU when the kernels are loaded, else ``composite`` (torch ops); a NaN/inf in a row makes the
    whole row NaN (KL with -inf gave finite values); the result in ``out_dtype``."""
    eps = _check_options(regularization, regularization_strength)
    check_bool(descending, "descending")
    n = x.shape[-1]
    if x.numel() == 0:
        return (x * 0).to(out_dtype)
    xc = to_compute(x)
    if xc.dim() != 2:
        xc = xc.reshape(-1, n)
    kl = regularization == "kl"
    cpu = _cpu_kernels(xc)
    if not cpu and n >= 2 and _triton_for(xc) is not None:  # CUDA: sort + Triton PAV, float64 inside
        fused = _SoftRankTriton if composite is _soft_rank_composite else _SoftSortTriton
        out = fused.apply(xc, eps, descending, kl)
        out = out.reshape(x.shape) if out.shape != x.shape else out
        return out if out.dtype == out_dtype else out.to(out_dtype)
    far, finite, done = False, False, None
    compiling = torch.compiler.is_compiling()
    if cpu and not compiling:
        if cpu_op is _SoftRankCPU:  # the kernel reads the magnitudes while it divides: no extra pass
            out, z, perm, ids, magnitude, finite = kernels.rank_forward_checked(xc, eps, descending, kl)
            far, done = _rank_far(magnitude, n, eps, kl), (out, z, perm, ids)
        else:
            far, finite = _sort_checks(xc, eps, kl)
    if far:
        # magnitudes where the fused kernels would lose the soft part: the conditioned composite, in float64
        out = composite(xc.double(), eps, descending, regularization).to(xc.dtype)
    elif cpu and compiling and composite is _soft_rank_composite and n >= 2:
        # traced: no host read to choose the path; far rows become values the fused kernel reads exactly
        out = cpu_op.apply(_conditioned_rows(xc, eps, kl), eps, descending, kl)
    elif cpu:
        out = cpu_op.apply(xc, eps, descending, kl) if done is None else cpu_op.apply(xc, eps, descending, kl, done)
    else:
        out = composite(xc, eps, descending, regularization)
    out = _nan_rows(out, xc, finite)
    if out.shape != x.shape:
        out = out.reshape(x.shape)
    return out if out.dtype == out_dtype else out.to(out_dtype)


def _soft_rank_last(
    x: torch.Tensor,
    *,
    descending: bool = False,
    regularization: Regularization = "l2",
    regularization_strength: float = 1.0,
) -> torch.Tensor:
    # float32 ranks for half inputs
    return _isotonic_last(
        x, _SoftRankCPU, _soft_rank_composite, rank_dtype(x.dtype), descending, regularization, regularization_strength
    )


def _soft_rank_composite(xc: torch.Tensor, eps: float, descending: bool, regularization: str) -> torch.Tensor:
    """Soft ranks of the rows of ``xc`` from differentiable torch ops around the projection; the sorted
    ``x / eps`` are conditioned first (:func:`_condition_rank_inputs`)."""
    n = xc.shape[-1]
    y, perm = sorted_values_last(-xc if descending else xc, descending=True)
    s = _condition_rank_inputs(y, eps, _gap_limit(n, regularization == "kl"))
    w = _rank_weights(n, xc.dtype, xc.device, regularization == "kl")
    if regularization == "kl":
        r = _KLRankProjection.apply(s, w)
        return torch.empty_like(r).scatter(-1, perm, r)
    mu = _PermutahedronProjection.apply(s, w, regularization)
    return torch.empty_like(mu).scatter(-1, perm, mu)


def _rank_weights(n: int, dtype: torch.dtype, device: torch.device, kl: bool) -> torch.Tensor:
    """``rho = (n, ..., 1)`` as a (1, n) row, or ``log rho`` for kl."""
    rho = torch.arange(n, 0, -1, dtype=dtype, device=device).unsqueeze(0)
    return torch.log(rho) if kl else rho


def _soft_sort_last(
    x: torch.Tensor,
    *,
    descending: bool = False,
    regularization: Regularization = "l2",
    regularization_strength: float = 1.0,
) -> torch.Tensor:
    return _isotonic_last(
        x, _SoftSortCPU, _soft_sort_composite, x.dtype, descending, regularization, regularization_strength
    )


def _soft_sort_composite(xc: torch.Tensor, eps: float, descending: bool, regularization: str) -> torch.Tensor:
    """Soft sort of the rows of ``xc`` from differentiable torch ops around the projection."""
    n = xc.shape[-1]
    if not descending:  # ascending sort = -(descending sort of -x), as torchsort / fast-soft-sort
        xc = -xc
    w, _ = sorted_values_last(xc, descending=True)
    rho = torch.arange(n, 0, -1, dtype=xc.dtype, device=xc.device)
    # 1 / eps beyond the row's gap limit: every block is a single entry and the result is exactly the
    # sorted row (the projection's s - (s - w) would round w away at the magnitude of rho / eps)
    limit = _sort_gap_limit(w.detach(), n, regularization == "kl")
    hard = 1.0 / eps > limit
    s = torch.where(hard, rho * limit, rho / eps)  # (no inf in the branch left unused)
    mu = torch.where(hard, w, _PermutahedronProjection.apply(s, w, regularization))
    return mu if descending else -mu


#: log of the zero weights of the top-k permutahedron in its KL projection: e^-1e4 is 0 in float64, so
#: the result is the projection onto the permutahedron of (1^k, 0^(n-k)) to float64 rounding
_KL_ZERO_LOG_WEIGHT = -1.0e4


def isotonic_topk_mask(
    x: torch.Tensor, k: int, *, regularization: Regularization = "l2", regularization_strength: float = 1.0
) -> torch.Tensor:
    r"""Relaxed top-``k`` mask of the rows of ``x`` (last dim): the projection of ``x / eps`` onto the
    permutahedron of :math:`w = (1^k, 0^{n-k})` (Blondel et al., ICML 2020, applied to top-k), Euclidean
    (``"l2"``: :math:`\mu = z - v(z, w)`) or KL (``"kl"``: :math:`\mu = e^{z - v(z, \log w)}`), with ``v``
    the decreasing isotonic regression of the sorted ``z = x / eps`` computed by the PAV kernels
    (float64 inside). That permutahedron is the capped simplex :math:`\{y \in [0,1]^n: \sum y = k\}`."""
    eps = _check_options(regularization, regularization_strength)
    n = x.shape[-1]
    if x.numel() == 0:
        return x * 0
    shape, dtype = x.shape, x.dtype
    y, perm = sorted_values_last(x.reshape(-1, n).double(), descending=True)
    s = y / eps
    top = torch.arange(n, device=x.device).unsqueeze(0) < k
    if regularization == "l2":
        mu = _PermutahedronProjection.apply(s, top.double(), "l2")
    else:
        logw = torch.where(top, 0.0, _KL_ZERO_LOG_WEIGHT).double()
        mu = _KLRankProjection.apply(s, logw)
    out = torch.empty_like(mu).scatter(-1, perm, mu)
    return out.to(dtype).reshape(shape)


# --------------------------------------------------------------------------------------------------
# CPU: sort + one fused kernel pass per row, forward and backward (rankwise._kernels.isotonic)
# --------------------------------------------------------------------------------------------------
def _cpu_kernels(x: torch.Tensor, *, call: bool = True) -> bool:
    """Whether the CPU kernels serve ``x`` (rows on the last dim) now; ``call``: an operator call
    (counted towards their background load), not a step inside one."""
    if _BACKEND != "auto" or x.device.type != "cpu":
        return False
    return kernels.ready(math.prod(x.shape[:-1]), x.shape[-1], call=call)


class _SoftRankCPU(torch.autograd.Function):
    """Soft ranks of the rows of ``xc`` (CPU): ``z = x / eps`` (negated for descending), one sort,
    then gather, PAV and scatter (and ``exp`` for kl) in one kernel pass per row; backward is one
    kernel pass too. Double backward recomputes the composite path from the saved input."""

    @staticmethod
    def forward(ctx, xc: torch.Tensor, eps: float, descending: bool, kl: bool, done: Any = None) -> torch.Tensor:  # type: ignore[override]
        # ``done``: the kernel's results when the caller ran it already (with its magnitude check)
        out, z, perm, ids = kernels.rank_forward(xc, eps, descending, kl) if done is None else done
        ctx.save_for_backward(xc, z, perm, ids, out)
        ctx.cfg = (eps, descending, kl)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        xc, z, perm, ids, out = ctx.saved_tensors
        eps, descending, kl = ctx.cfg
        if grad.requires_grad:  # double backward: through the differentiable composite path
            g = graph_vjp(_soft_rank_composite, grad, xc, eps, descending, "kl" if kl else "l2")
            return g, None, None, None, None
        scale = (-1.0 if descending else 1.0) / eps
        return kernels.rank_backward(grad, z, perm, ids, out, kl, scale), None, None, None, None


class _SoftSortCPU(torch.autograd.Function):
    """Soft sort of the rows of ``xc`` (CPU): one sort of ``sign * x``, then gather and PAV in one
    kernel pass per row; backward is one kernel pass. Double backward as in :class:`_SoftRankCPU`."""

    @staticmethod
    def forward(ctx, xc: torch.Tensor, eps: float, descending: bool, kl: bool) -> torch.Tensor:  # type: ignore[override]
        out, perm, ids = kernels.sort_forward(xc, eps, descending, kl)
        ctx.save_for_backward(xc, perm, ids)
        ctx.cfg = (eps, descending, kl)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        xc, perm, ids = ctx.saved_tensors
        eps, descending, kl = ctx.cfg
        if grad.requires_grad:  # double backward: through the differentiable composite path
            return graph_vjp(_soft_sort_composite, grad, xc, eps, descending, "kl" if kl else "l2"), None, None, None
        return kernels.sort_backward(grad, xc, perm, ids, descending, kl), None, None, None


# --------------------------------------------------------------------------------------------------
# CUDA: sort + the Triton projection in float64, the torch ops around it recorded by no autograd node
# --------------------------------------------------------------------------------------------------
class _SoftRankTriton(torch.autograd.Function):
    """Soft ranks of the rows of ``xc`` through the Triton kernels: one sort, then one kernel for
    ``s = x / eps`` in float64 (divided in the input dtype, as the CPU kernels divide: the same
    blocks; rows of large ``|x| / eps`` conditioned as :func:`_condition_rank_inputs` does), the
    weights and the rows' NaN/inf flags, the projection in float64, and one kernel that writes the
    ranks in the input order; backward: one gathering kernel, the projection's vector-Jacobian
    product and one scattering kernel (the conditioning's derivative is the plain ``1 / eps``). Rows
    holding a NaN or an inf are NaN, with zero gradients. Double backward through the composite
    path."""

    @staticmethod
    def forward(ctx, xc: torch.Tensor, eps: float, descending: bool, kl: bool) -> torch.Tensor:  # type: ignore[override]
        tk = _triton_kernels()
        limit = _gap_limit(xc.shape[-1], kl)
        # y = x sorted decreasingly (-x for descending: the increasing sort of x, negated in the kernel)
        v, perm = sorted_values_last(xc, descending=not descending)
        s, w, flags = tk.rank_prologue(v, eps, limit, _CONDITION_FACTOR * limit, descending, kl)
        mu, state = tk.projection_forward(s, w, kl)
        ctx.save_for_backward(xc, s, w, perm, mu, flags, *state)
        ctx.cfg = (eps, descending, kl)
        return tk.operator_epilogue(mu, w, perm, flags, True, kl, descending, xc.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        xc, s, w, perm, mu, flags, *state = ctx.saved_tensors
        eps, descending, kl = ctx.cfg
        if grad.requires_grad:  # double backward: through the differentiable composite path
            g = graph_vjp(_soft_rank_composite, grad, xc, eps, descending, "kl" if kl else "l2")
            return g, None, None, None
        tk = _triton_kernels()
        g = tk.rank_grad_gather(grad, perm, mu, kl)  # times exp(mu) for kl (r = exp(mu))
        gs, _ = tk.projection_backward(g, s, w, tuple(state), kl, True, False)
        scale = (-1.0 if descending else 1.0) / eps
        return tk.scatter_grad(gs, grad, perm, flags, scale, True, xc.dtype), None, None, None


class _SoftSortTriton(torch.autograd.Function):
    """Soft sort of the rows of ``xc`` through the Triton kernels: one sort, one kernel for the
    targets ``rho / eps`` and the weights (the sorted row, in float64; rows whose gaps all exceed the
    limit of :func:`_sort_gap_limit` are the sorted row exactly), the projection and one kernel for
    the output; backward: the projection's product for ``w`` and one scattering kernel. Rows holding
    a NaN or an inf are NaN, with zero gradients. Double backward through the composite path."""

    @staticmethod
    def forward(ctx, xc: torch.Tensor, eps: float, descending: bool, kl: bool) -> torch.Tensor:  # type: ignore[override]
        tk = _triton_kernels()
        # w = the sorted row, decreasing: x sorted decreasingly, or -x (x sorted increasingly, negated)
        v, perm = sorted_values_last(xc, descending=descending)
        s, w64, flags = tk.sort_prologue(v, eps, descending, kl)
        mu, state = tk.projection_forward(s, w64, kl)
        ctx.save_for_backward(xc, s, w64, perm, flags, *state)
        ctx.cfg = (eps, descending, kl)
        return tk.operator_epilogue(mu, w64, perm, flags, False, kl, descending, xc.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        xc, s, w64, perm, flags, *state = ctx.saved_tensors
        eps, descending, kl = ctx.cfg
        if grad.requires_grad:  # double backward: through the differentiable composite path
            return graph_vjp(_soft_sort_composite, grad, xc, eps, descending, "kl" if kl else "l2"), None, None, None
        # the two sign flips (of x before the sort, of the sorted values after) cancel
        _, gw = _triton_kernels().projection_backward(grad, s, w64, tuple(state), kl, False, True)
        assert gw is not None
        return _triton_kernels().scatter_grad(gw, grad, perm, flags, 1.0, False, xc.dtype), None, None, None


def _prepare(x: torch.Tensor, dim: int) -> int:
    check_floating_nd(x, "x")
    return check_dim(x, dim)


def soft_rank_isotonic(
    x: torch.Tensor,
    *,
    regularization: Regularization = "l2",
    regularization_strength: float = 1.0,
    descending: bool = False,
    dim: int = -1,
) -> torch.Tensor:
    r"""Soft ranks by projection onto the permutahedron (Blondel et al., ICML'20).

    With :math:`\rho = (n, n-1, \dots, 1)` and strength :math:`\varepsilon`, the ascending soft rank is

    * ``"l2"``: :math:`r(x) = \arg\min_{\mu \in \mathcal P(\rho)} \tfrac12 \lVert \mu - x/\varepsilon \rVert^2`,
    * ``"kl"``: :math:`r(x) = \exp P_E(x/\varepsilon, \log\rho)` with
      :math:`P_E(z, w) = \log \arg\min_{\mu \in \mathcal P(e^w)} \mathrm{KL}(\mu \Vert e^z)`,

    where :math:`\mathcal P(w)` is the permutahedron (convex hull of the permutations of ``w``).
    Both reduce to a sort plus a decreasing isotonic regression solved by pool-adjacent-violators;
    the Jacobian is block-constant. ``descending=True`` uses :math:`-x` (the largest value gets the
    soft rank nearest 1). As :math:`\varepsilon \to 0` the result tends to ``rankwise.rank(x)``; as
    :math:`\varepsilon \to \infty` it tends to the constant :math:`(n + 1) / 2`. The strength is
    scale-dependent (it divides ``x``). Ascending values and gradients equal ``torchsort.soft_rank``;
    KL is computed in log space, so it stays finite at small strengths where torchsort's gives NaN.

    Magnitudes: the projection only depends on differences of ``x / eps`` within runs of sorted entries
    less than a gap limit apart (about ``2n``, or ``6 log n`` for ``"kl"``); rows whose ``|x| / eps`` is
    far beyond it (1e18-scale inputs, tiny strengths) are laid out run by run before PAV (in float64 on
    CPU), so soft ranks stay in ``[1, n]`` and equal the exact ranks where the strength is negligible
    relative to the gaps (torchsort returns ranks of 0 there).

    Degenerate inputs: empty -> empty; ``n = 1`` -> 1; all ties -> :math:`(n+1)/2` everywhere; a row
    (along ``dim``) holding a NaN or inf -> NaN for the whole row.

    Cost: CPU tensors use a numba PAV kernel, CUDA tensors Triton PAV kernels (one program per
    row, or, for a few long rows, pieces of each row in parallel and a merge of their blocks), both
    O(n log n) time and O(n) memory per row; other devices use a vectorized PyTorch
    min-max formulation, O(n^2) time and memory per row (rows are processed in chunks). No host
    synchronization on CUDA.

    Shape:
        - x: :math:`(*, n, *)` floating; ranked along ``dim``.
        - output: same shape as ``x``; dtype of ``x``, except float32 for float16/bfloat16 (computed in
          float32; soft ranks reach n, beyond the exact range of the half formats).

    Example:
        >>> import torch, rankwise
        >>> x = torch.tensor([[3.0, 1.0, 2.0]])
        >>> rankwise.soft_rank_isotonic(x, regularization_strength=0.1)
        tensor([[3., 1., 2.]])
        >>> rankwise.soft_rank_isotonic(x, regularization_strength=2.0)
        tensor([[2.5000, 1.5000, 2.0000]])
    """
    d = _prepare(x, dim)
    last = d == x.dim() - 1
    out = _soft_rank_last(
        x if last else x.movedim(d, -1),
        descending=descending,
        regularization=regularization,
        regularization_strength=regularization_strength,
    )
    return out if last else out.movedim(-1, d)


def soft_sort_isotonic(
    x: torch.Tensor,
    *,
    regularization: Regularization = "l2",
    regularization_strength: float = 1.0,
    descending: bool = False,
    dim: int = -1,
) -> torch.Tensor:
    r"""Soft sort by projection onto the permutahedron (Blondel et al., ICML'20).

    The descending soft sort projects :math:`\rho/\varepsilon` (:math:`\rho = (n, \dots, 1)`) onto
    the permutahedron of ``x``:

    * ``"l2"``: :math:`s(x) = \arg\min_{\mu \in \mathcal P(x)} \tfrac12 \lVert \mu - \rho/\varepsilon \rVert^2`,
    * ``"kl"``: :math:`s(x) = P_E(\rho/\varepsilon, x)` (see :func:`soft_rank_isotonic`);

    the ascending one is :math:`-s(-x)` (torchsort's convention). As :math:`\varepsilon \to 0`
    it tends to ``torch.sort(x).values``; as :math:`\varepsilon \to \infty` every entry tends to
    the mean of ``x`` (l2). Ascending values and gradients equal ``torchsort.soft_sort``.

    Magnitudes: where ``1 / eps`` exceeds the row's gap limit (twice its spread for ``"l2"``, plus
    ``2 log n + 1`` for ``"kl"``) every block is a single entry and the result is exactly the sorted
    row, at any magnitude. ``"kl"`` works in absolute units (it projects ``exp(x)``): its soft part has
    absolute round-off of about ``u n log n`` (``u`` the machine epsilon), so rows far below 1 in
    magnitude keep only that absolute accuracy.

    Degenerate inputs: empty -> empty; ``n = 1`` -> ``x``; all ties -> ``x``; a row holding a NaN or
    inf (``-inf`` included, for ``"kl"`` too) -> NaN for the whole row. Cost as in
    :func:`soft_rank_isotonic`.

    Shape:
        - x: :math:`(*, n, *)` floating; sorted along ``dim``.
        - output: same shape and dtype as ``x`` (float16/bfloat16 are computed in float32).

    Example:
        >>> import torch, rankwise
        >>> x = torch.tensor([[3.0, 1.0, 2.0]])
        >>> rankwise.soft_sort_isotonic(x, regularization_strength=0.1)
        tensor([[1., 2., 3.]])
        >>> rankwise.soft_sort_isotonic(x, descending=True, regularization_strength=2.0)
        tensor([[2.5000, 2.0000, 1.5000]])
    """
    d = _prepare(x, dim)
    last = d == x.dim() - 1
    out = _soft_sort_last(
        x if last else x.movedim(d, -1),
        descending=descending,
        regularization=regularization,
        regularization_strength=regularization_strength,
    )
    return out if last else out.movedim(-1, d)


class _IsotonicModule(FunctionModule):
    """Shared module twin: holds the options of an isotonic soft operator."""

    _options = ("regularization", "regularization_strength", "descending", "dim")
    _shown = ("regularization!r", "regularization_strength", "descending", "dim")

    def __init__(
        self,
        *,
        regularization: Regularization = "l2",
        regularization_strength: float = 1.0,
        descending: bool = False,
        dim: int = -1,
    ) -> None:
        super().__init__()
        self.regularization_strength = _check_options(regularization, regularization_strength)
        check_bool(descending, "descending")
        self.regularization, self.descending, self.dim = regularization, descending, dim


class IsotonicSoftRank(_IsotonicModule):
    """Module twin of :func:`soft_rank_isotonic`."""

    _function = staticmethod(soft_rank_isotonic)


class IsotonicSoftSort(_IsotonicModule):
    """Module twin of :func:`soft_sort_isotonic`."""

    _function = staticmethod(soft_sort_isotonic)


# --------------------------------------------------------------------------------------------------
# registration
# --------------------------------------------------------------------------------------------------
register_soft_method("isotonic", sort=_soft_sort_last, rank=_soft_rank_last, handles_nonfinite=True)


_ISOTONIC_RELAXATION = RelaxationInfo(
    "isotonic",
    returns="soft_rank",
    options={"regularization": "l2", "regularization_strength": 1.0},
    description="soft ranks by projection on the permutahedron (Blondel et al.); loss = mean (soft rank - rank)^2",
)
register_op("soft_rank_isotonic", module=IsotonicSoftRank, relaxation=_ISOTONIC_RELAXATION)(soft_rank_isotonic)
register_op("soft_sort_isotonic", module=IsotonicSoftSort)(soft_sort_isotonic)
