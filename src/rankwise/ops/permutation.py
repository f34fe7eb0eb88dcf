r"""Relaxed permutation matrices: NeuralSort (deterministic and stochastic) and SoftSort.

All matrices here follow the NeuralSort convention: row ``i`` (0-based) of :math:`\hat P` softly
selects the ``(i+1)``-th *largest* entry, so ``P̂ @ s`` is a soft descending sort of ``s`` and
``P̂ → P`` (the exact sorting permutation) as ``tau → 0``.

The methods ``"neuralsort"`` and ``"softsort"`` of :func:`rankwise.soft_sort` /
:func:`rankwise.soft_rank` are registered here.
"""

from __future__ import annotations

from typing import Any

import torch

from rankwise._random import rand_from
from rankwise._registry import RelaxationInfo
from rankwise._twin import FunctionModule
from rankwise._validation import (
    check_bool,
    check_dim,
    check_floating_nd,
    check_generator,
    check_int,
    check_positive,
    nan_slices,
    to_compute,
)
from rankwise.ops._registry import register_op
from rankwise.ops._sort import sort_last
from rankwise.ops.soft import SoftRank, SoftSort, register_soft_method, soft_rank, soft_sort

__all__ = [
    "NeuralSort",
    "SoftSortMatrix",
    "StochasticNeuralSort",
    "neural_sort",
    "softsort_matrix",
    "stochastic_neural_sort",
]


# ----------------------------------------------------------------------------------------------
# helpers (shared with rankwise.ops.topk)
# ----------------------------------------------------------------------------------------------
_check_bool = check_bool


def _abs_row_sum(s: torch.Tensor) -> torch.Tensor:
    r"""``B_j = sum_k |s_j - s_k|`` along the last dim in O(n log n) time and O(n) memory.

    With ``v`` the ascending sort of ``s`` and ``C_r = v_0 + ... + v_{r-1}``:
    ``B(v_r) = (2r - n) v_r + T - 2 C_r`` where ``T`` is the total. This is ``A_s 1`` of NeuralSort
    without ever forming the ``n x n`` matrix ``A_s``.
    """
    n = s.shape[-1]
    v, perm = torch.sort(s, dim=-1)
    prefix = torch.cumsum(v, dim=-1) - v  # exclusive prefix sums
    total = v.sum(dim=-1, keepdim=True)
    r = torch.arange(n, device=s.device, dtype=s.dtype)
    b_sorted = (2 * r - n) * v + total - 2 * prefix
    return torch.zeros_like(b_sorted).scatter(-1, perm, b_sorted)


def neural_sort_rows(s: torch.Tensor, tau: float, rows: int | None = None) -> torch.Tensor:
    r"""First ``rows`` rows (all if ``None``) of NeuralSort's :math:`\hat P` for ``s`` (..., n).

    ``s`` must already be in the compute dtype. Time and memory O(rows * n) (+ a sort).
    """
    n = s.shape[-1]
    m = n if rows is None else rows
    # P̂ is invariant to adding a constant to s (A_s is unchanged and each row's logits shift by a
    # constant), so centre s for numerical accuracy; the detached mean keeps gradients exact.
    if n > 0:
        s = s - s.detach().mean(dim=-1, keepdim=True)
    b = _abs_row_sum(s)
    coef = n + 1 - 2 * torch.arange(1, m + 1, device=s.device, dtype=s.dtype)  # (m,)
    out: torch.Tensor = _RankOneSoftmax.apply(s / tau, b / tau, coef)
    return out


class _RankOneSoftmax(torch.autograd.Function):
    """``softmax(c u^T - 1 w^T)`` row-wise, i.e. ``P[..., i, j] = softmax_j(c_i u_j - w_j)``.

    A fused version of what autograd would do: one ``m x n`` temporary in the forward pass, and a
    backward pass that saves only ``P`` and reduces with one matrix product. ``c`` gets no gradient.
    Second derivatives work (the backward is written with differentiable ops when grad mode is on).
    """

    @staticmethod
    def forward(ctx: Any, u: torch.Tensor, w: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        logits = torch.addcmul(w.neg().unsqueeze(-2), c.unsqueeze(-1), u.unsqueeze(-2))  # (..., m, n)
        p = torch.softmax(logits, dim=-1)
        ctx.save_for_backward(p, c)
        return p

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        p, c = ctx.saved_tensors
        gp = grad * p
        if torch.is_grad_enabled():  # double backward: stay out-of-place
            dl = gp - p * gp.sum(dim=-1, keepdim=True)
        else:
            dl = gp.addcmul_(p, gp.sum(dim=-1, keepdim=True), value=-1.0)
        # one product gives both reductions over rows: [c; -1] @ dl
        weights = torch.stack([c, torch.full_like(c, -1.0)])  # (2, m)
        red = torch.matmul(weights, dl)  # (..., 2, n)
        return red[..., 0, :], red[..., 1, :], None


def _hard_rows(order_by: torch.Tensor, rows: int | None = None) -> torch.Tensor:
    """Exact permutation matrix rows (descending, stable: among ties the earlier index first)."""
    n = order_by.shape[-1]
    m = n if rows is None else rows
    perm = sort_last(order_by.detach(), descending=True)[1][..., :m]
    shape = (*order_by.shape[:-1], m, n)
    hard = torch.zeros(shape, dtype=order_by.dtype, device=order_by.device)
    return hard.scatter(-1, perm.unsqueeze(-1), 1.0)


def _straight_through(hard: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:
    # forward is exactly ``hard`` (soft - soft.detach() is exactly 0); backward is soft's
    return hard + (soft - soft.detach())


def gumbel_noise(shape: tuple[int, ...], like: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    u = rand_from(shape, generator, device=like.device, dtype=like.dtype)
    tiny = torch.finfo(like.dtype).tiny
    return -torch.log(-torch.log(u.clamp_min(tiny)))


# ----------------------------------------------------------------------------------------------
# NeuralSort
# ----------------------------------------------------------------------------------------------
def neural_sort(scores: torch.Tensor, *, tau: float = 1.0, hard: bool = False, dim: int = -1) -> torch.Tensor:
    r"""NeuralSort's relaxed (unimodal, row-stochastic) permutation matrix (Grover et al., ICLR'19).

    For scores :math:`s \in \mathbb{R}^n` along ``dim``, with :math:`A_s[j,k] = |s_j - s_k|`:

    .. math::
        \hat P[i, :] = \operatorname{softmax}\Bigl(\frac{(n + 1 - 2i)\,s - A_s \mathbf 1}{\tau}\Bigr),
        \qquad i = 1..n,

    so row ``i`` softly selects the ``i``-th largest score and ``P̂ @ s`` is a soft descending sort.
    :math:`A_s \mathbf 1` is computed as a row sum in O(n log n) (sort + prefix sums), never as the
    O(n³) product with :math:`\mathbf 1 \mathbf 1^\top` of the reference code; the whole operator is
    O(n²) time and memory (the size of its output).

    Properties: entries are >= 0 (> 0 up to underflow), every row sums to 1, the row argmaxes form the sorting
    permutation whenever the scores are distinct, and :math:`\hat P \to P` as ``tau → 0``.
    Columns do **not** sum to 1 in general (:math:`\hat P` is not doubly stochastic): the column
    sums average exactly 1 and tend to 1 as ``tau → 0`` or ``tau → ∞``.

    ``hard=True`` returns the exact permutation matrix (descending; ties broken stably, the
    earlier index first) in the forward pass and differentiates through :math:`\hat P`
    (straight-through estimator).

    Shape:
        - scores: :math:`(*, n, *)` floating, scored along ``dim``.
        - output: :math:`(*', n, n)` where :math:`*'` is ``scores.shape`` without ``dim``; dtype of
          ``scores`` (float16/bfloat16 are computed in float32 and cast back).

    Degenerate inputs: ``n = 0`` gives an ``(*', 0, 0)`` tensor, ``n = 1`` gives ``[[1.]]``; all-equal
    scores give rows that are uniform over the tied entries (and the identity when ``hard``).

    Example:
        >>> import torch, rankwise
        >>> s = torch.tensor([0.1, 2.0, -1.0])
        >>> rankwise.neural_sort(s, tau=0.1).argmax(dim=-1)
        tensor([1, 0, 2])
        >>> rankwise.neural_sort(s, hard=True)
        tensor([[0., 1., 0.],
                [1., 0., 0.],
                [0., 0., 1.]])
        >>> (rankwise.neural_sort(s, tau=0.01) @ s).round(decimals=3)
        tensor([ 2.0000,  0.1000, -1.0000])
    """
    check_floating_nd(scores, "scores")
    t = check_positive(tau, "tau")
    _check_bool(hard, "hard")
    d = check_dim(scores, dim)
    s = to_compute(scores.movedim(d, -1))
    p = neural_sort_rows(s, t)
    if hard:
        p = _straight_through(_hard_rows(s), p)
    return nan_slices(p, s, out_dims=2).to(scores.dtype)


def stochastic_neural_sort(
    scores: torch.Tensor,
    *,
    tau: float = 1.0,
    hard: bool = False,
    n_samples: int = 1,
    generator: torch.Generator | None = None,
    log_scores: bool = False,
    dim: int = -1,
) -> torch.Tensor:
    r"""Relaxed samples of Plackett-Luce permutations (stochastic NeuralSort, Grover et al., ICLR'19).

    A Plackett-Luce distribution with positive scores :math:`s` is sampled exactly by sorting the
    Gumbel-perturbed log-scores :math:`\log s + g`, :math:`g_j \sim \mathrm{Gumbel}(0, 1)` i.i.d.
    Each sample is relaxed with :func:`neural_sort`:

    .. math::
        \hat P^{(m)} = \mathrm{NeuralSort}_\tau(\log s + g^{(m)}), \qquad m = 1..\text{n\_samples},

    and gradients flow through :math:`\log s` (reparameterization; the noise is constant).
    With ``log_scores=True`` ``scores`` already are the log-scores (any real values).

    Scores must be > 0 when ``log_scores=False``. On CPU this is checked (``ValueError``); on
    other devices the check would need a host sync, so it is skipped and non-positive scores give
    NaN in the output. The noise is drawn from ``generator`` (which must live on the device of
    ``scores``) or from the global RNG, so equal generator seeds give equal samples.
    ``hard=True`` returns the exact permutation of each perturbed sample (straight-through).

    Shape:
        - scores: :math:`(*, n, *)` floating, scored along ``dim``.
        - output: :math:`(\text{n\_samples}, *', n, n)`, :math:`*'` = ``scores.shape`` without
          ``dim``; dtype of ``scores`` (float16/bfloat16 computed in float32).

    Example:
        >>> import torch, rankwise
        >>> g = torch.Generator().manual_seed(0)
        >>> p = rankwise.stochastic_neural_sort(torch.tensor([1.0, 5.0, 2.0]), n_samples=4, generator=g)
        >>> p.shape
        torch.Size([4, 3, 3])
        >>> torch.allclose(p.sum(-1), torch.ones(4, 3))
        True
    """
    check_floating_nd(scores, "scores")
    t = check_positive(tau, "tau")
    _check_bool(hard, "hard")
    _check_bool(log_scores, "log_scores")
    m = check_int(n_samples, "n_samples", low=1)
    d = check_dim(scores, dim)
    gen = check_generator(generator, scores)
    s = to_compute(scores.movedim(d, -1))
    if not log_scores:
        if s.device.type == "cpu" and s.numel() > 0 and bool((s.detach() <= 0).any()):
            raise ValueError(
                "`scores` must be > 0 for the Plackett-Luce model (pass log_scores=True for log-scores), "
                f"got min {float(s.detach().min())}"
            )
        s = torch.log(s)
    perturbed = s.unsqueeze(0) + gumbel_noise((m, *s.shape), s, gen)
    p = neural_sort_rows(perturbed, t)
    if hard:
        p = _straight_through(_hard_rows(perturbed), p)
    return nan_slices(p, perturbed, out_dims=2).to(scores.dtype)


# ----------------------------------------------------------------------------------------------
# SoftSort
# ----------------------------------------------------------------------------------------------
def _dist_derivative(d: torch.Tensor, power: float, inplace: bool) -> torch.Tensor:
    """d/dd of ``|d| ** power``, with the value 0 at ``d = 0`` (also for power < 1)."""
    if power == 1.0:
        return d.sign_() if inplace else d.sign()
    if power == 2.0:
        return d.mul_(2.0) if inplace else d * 2.0
    a = d.abs()
    nz = a > 0
    mag = torch.where(nz, a, torch.ones_like(a)).pow(power - 1.0) * power
    return torch.where(nz, mag * d.sign(), torch.zeros_like(a))


class _SoftSortSoftmax(torch.autograd.Function):
    """``P[..., i, j] = softmax_j(-|v_i - s_j| ** power / tau)``, fused (saves ``P``, ``v``, ``s``)."""

    @staticmethod
    def forward(ctx: Any, v: torch.Tensor, s: torch.Tensor, tau: float, power: float) -> torch.Tensor:
        dist = (v.unsqueeze(-1) - s.unsqueeze(-2)).abs_()  # (..., m, n)
        if power == 2.0:
            dist.square_()
        elif power != 1.0:
            dist.pow_(power)  # 0 ** power = 0 for power > 0
        p = torch.softmax(dist.mul_(-1.0 / tau), dim=-1)
        ctx.save_for_backward(p, v, s)
        ctx.tau, ctx.power = tau, power
        return p

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        p, v, s = ctx.saved_tensors
        inplace = not torch.is_grad_enabled()  # double backward: stay out-of-place
        gp = grad * p
        if inplace:
            dl = gp.addcmul_(p, gp.sum(dim=-1, keepdim=True), value=-1.0)
        else:
            dl = gp - p * gp.sum(dim=-1, keepdim=True)
        deriv = _dist_derivative(v.unsqueeze(-1) - s.unsqueeze(-2), ctx.power, inplace)
        h = dl.mul_(deriv) if inplace else dl * deriv  # dL/d(dist) = -h / tau
        scale = -1.0 / ctx.tau
        return h.sum(dim=-1) * scale, h.sum(dim=-2) * (-scale), None, None


def softsort_rows(s: torch.Tensor, tau: float, power: float, rows: int | None = None) -> torch.Tensor:
    n = s.shape[-1]
    m = n if rows is None else rows
    if m == n:
        v = torch.sort(s, dim=-1, descending=True).values
    else:
        v = torch.topk(s, m, dim=-1).values
    out: torch.Tensor = _SoftSortSoftmax.apply(v, s, tau, power)
    return out


def softsort_matrix(
    scores: torch.Tensor, *, tau: float = 1.0, power: float = 1.0, hard: bool = False, dim: int = -1
) -> torch.Tensor:
    r"""SoftSort's relaxed permutation matrix (Prillo & Eisenschlos, ICML'20).

    .. math::
        \hat P = \operatorname{softmax}\Bigl(\frac{-\bigl|\mathrm{sort}_\downarrow(s)\,\mathbf 1^\top
        - \mathbf 1\, s^\top\bigr|^{p}}{\tau}\Bigr) \quad\text{(row-wise)},

    i.e. row ``i`` is a softmax over the original entries of minus their distance (to the power
    ``power``) to the ``i``-th largest score. Gradients flow through the sorted values as in the
    paper. Same conventions as :func:`neural_sort` (descending, row-stochastic, not doubly
    stochastic, ``P̂ → P`` as ``tau → 0``; ``hard=True`` is straight-through); cheaper than
    NeuralSort (one ``n x n`` distance matrix).

    Shape:
        - scores: :math:`(*, n, *)` floating, scored along ``dim``.
        - output: :math:`(*', n, n)`, :math:`*'` = ``scores.shape`` without ``dim``; dtype of ``scores``.

    Degenerate inputs as for :func:`neural_sort`.

    Example:
        >>> import torch, rankwise
        >>> s = torch.tensor([0.1, 2.0, -1.0])
        >>> rankwise.softsort_matrix(s, tau=0.1).argmax(dim=-1)
        tensor([1, 0, 2])
        >>> (rankwise.softsort_matrix(s, tau=0.01) @ s).round(decimals=3)
        tensor([ 2.0000,  0.1000, -1.0000])
    """
    check_floating_nd(scores, "scores")
    t = check_positive(tau, "tau")
    pw = check_positive(power, "power")
    _check_bool(hard, "hard")
    d = check_dim(scores, dim)
    s = to_compute(scores.movedim(d, -1))
    p = softsort_rows(s, t, pw)
    if hard:
        p = _straight_through(_hard_rows(s), p)
    return nan_slices(p, s, out_dims=2).to(scores.dtype)


# ----------------------------------------------------------------------------------------------
# soft_sort / soft_rank methods "neuralsort" and "softsort"
# ----------------------------------------------------------------------------------------------
def _sort_from_p(x: torch.Tensor, p: torch.Tensor, descending: bool) -> torch.Tensor:
    out = (p @ x.unsqueeze(-1)).squeeze(-1)  # soft descending sort
    return out if descending else out.flip(-1)


def _rank_from_p(p: torch.Tensor, descending: bool) -> torch.Tensor:
    n = p.shape[-1]
    pos = torch.arange(1, n + 1, device=p.device, dtype=p.dtype)
    r = (pos.unsqueeze(-1) * p).sum(dim=-2)  # soft descending rank of each element
    return r if descending else (n + 1) - r


def _neuralsort_soft_sort(x: torch.Tensor, *, descending: bool, tau: float = 1.0) -> torch.Tensor:
    xc = to_compute(x)
    return _sort_from_p(xc, neural_sort_rows(xc, check_positive(tau, "tau")), descending).to(x.dtype)


def _neuralsort_soft_rank(x: torch.Tensor, *, descending: bool, tau: float = 1.0) -> torch.Tensor:
    xc = to_compute(x)
    return _rank_from_p(neural_sort_rows(xc, check_positive(tau, "tau")), descending).to(x.dtype)


def _softsort_soft_sort(x: torch.Tensor, *, descending: bool, tau: float = 1.0, power: float = 1.0) -> torch.Tensor:
    xc = to_compute(x)
    p = softsort_rows(xc, check_positive(tau, "tau"), check_positive(power, "power"))
    return _sort_from_p(xc, p, descending).to(x.dtype)


def _softsort_soft_rank(x: torch.Tensor, *, descending: bool, tau: float = 1.0, power: float = 1.0) -> torch.Tensor:
    xc = to_compute(x)
    p = softsort_rows(xc, check_positive(tau, "tau"), check_positive(power, "power"))
    return _rank_from_p(p, descending).to(x.dtype)


register_soft_method("neuralsort", sort=_neuralsort_soft_sort, rank=_neuralsort_soft_rank)
register_soft_method("softsort", sort=_softsort_soft_sort, rank=_softsort_soft_rank)


# ----------------------------------------------------------------------------------------------
# Module twins
# ----------------------------------------------------------------------------------------------
class NeuralSort(FunctionModule):
    """Module twin of :func:`neural_sort` holding ``tau``, ``hard`` and ``dim``."""

    _function = staticmethod(neural_sort)
    _options = ("tau", "hard", "dim")

    def __init__(self, *, tau: float = 1.0, hard: bool = False, dim: int = -1) -> None:
        super().__init__()
        self.tau = check_positive(tau, "tau")
        self.hard = _check_bool(hard, "hard")
        self.dim = dim


class StochasticNeuralSort(FunctionModule):
    """Module twin of :func:`stochastic_neural_sort` (the optional ``generator`` is kept by reference)."""

    _function = staticmethod(stochastic_neural_sort)
    _options = ("tau", "hard", "n_samples", "generator", "log_scores", "dim")
    _shown = ("tau", "hard", "n_samples", "log_scores", "dim")

    def __init__(
        self,
        *,
        tau: float = 1.0,
        hard: bool = False,
        n_samples: int = 1,
        generator: torch.Generator | None = None,
        log_scores: bool = False,
        dim: int = -1,
    ) -> None:
        super().__init__()
        self.tau = check_positive(tau, "tau")
        self.hard = _check_bool(hard, "hard")
        self.n_samples = check_int(n_samples, "n_samples", low=1)
        self.generator = generator
        self.log_scores = _check_bool(log_scores, "log_scores")
        self.dim = dim


class SoftSortMatrix(FunctionModule):
    """Module twin of :func:`softsort_matrix` (``rankwise.SoftSort`` is the twin of ``soft_sort``)."""

    _function = staticmethod(softsort_matrix)
    _options = ("tau", "power", "hard", "dim")

    def __init__(self, *, tau: float = 1.0, power: float = 1.0, hard: bool = False, dim: int = -1) -> None:
        super().__init__()
        self.tau = check_positive(tau, "tau")
        self.power = check_positive(power, "power")
        self.hard = _check_bool(hard, "hard")
        self.dim = dim


# ----------------------------------------------------------------------------------------------
# registration
# ----------------------------------------------------------------------------------------------


register_op(
    "neural_sort",
    module=NeuralSort,
    relaxation=RelaxationInfo(
        "neuralsort", params=("tau", "hard"), description="deterministic NeuralSort (rankwise.neural_sort)"
    ),
)(neural_sort)
register_op(
    "stochastic_neural_sort",
    module=StochasticNeuralSort,
    stochastic=True,
    relaxation=RelaxationInfo(
        "stochastic",
        fixed={"log_scores": True},
        params=("tau", "n_samples", "hard"),
        description="stochastic NeuralSort: Plackett-Luce Gumbel samples of the log-scores",
    ),
)(stochastic_neural_sort)
register_op(
    "softsort",
    module=SoftSortMatrix,
    relaxation=RelaxationInfo(
        "softsort",
        params=("tau", "power", "hard"),
        description="SoftSort (rankwise.softsort_matrix), distance power `power`",
    ),
)(softsort_matrix)


# the soft sort / rank front ends (rankwise.ops.soft) over every registered soft method, chosen by `method`
register_op("soft_sort", module=SoftSort)(soft_sort)
register_op("soft_rank", module=SoftRank)(soft_rank)
