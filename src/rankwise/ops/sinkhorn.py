r"""Optimal-transport soft sort and rank (Cuturi, Teboul & Vert, NeurIPS 2019).

"Differentiable Ranks and Sorting using Optimal Transport": the ``n`` inputs, squashed into
``(0, 1)``, are transported onto ``m`` sorted targets by an entropy-regularized optimal transport
plan :math:`P`; the soft CDF (ranks) and the soft sorted values are read off :math:`P`.

Registers the soft method ``"sinkhorn"`` (``rankwise.soft_rank(x, method="sinkhorn", ...)``) and
the operators ``sinkhorn_transport``, ``soft_rank_sinkhorn`` and ``soft_sort_sinkhorn``.

Conventions (those of the authors' code, google-research ``soft_sort/``):

* squashing: :math:`\tilde x = \sigma\bigl((x - \bar x) / (\max(\mathrm{std}(x), 10^{-6}) \sqrt 3/\pi)\bigr)`
  with the population standard deviation, per row;
* targets :math:`y_j = j / \max(1, m - 1)`, :math:`j = 0..m-1` (reversed when ``descending``);
  uniform weights :math:`a = 1_n / n`, :math:`b = 1_m / m`;
* cost :math:`C_{ij} = |\tilde x_i - y_j|^p`; plan
  :math:`P = \arg\min_{P 1 = a,\, P^\top 1 = b} \langle P, C\rangle - \varepsilon H(P)`;
* soft CDF :math:`= (P\,\mathrm{cumsum}(b)) / a`, soft ranks :math:`= n\,\mathrm{CDF}` (1-based,
  in :math:`[n/m, n]`), soft sort :math:`= (P^\top x) / b` on the original ``x`` (length ``m``).

Solver (forward). The plan is :math:`P_{ij} = a_i\,\mathrm{softmax}_j((g_j - C_{ij})/\varepsilon)`
(rows exact) where the column potential ``g`` solves the column-marginal equation
:math:`r(g) = P^\top 1 - b = 0`. It is found in two phases, both in the log domain:

1. epsilon scaling (the authors' schedule): Sinkhorn sweeps with
   :math:`\varepsilon_k = \max(0.1 \cdot 0.95^k, \varepsilon)`, then a few sweeps at ``epsilon``
   (45 sweeps in all at ``epsilon=1e-2``, 90 at ``1e-3``; no host synchronization);
2. Newton's method on the semi-dual (Sinkhorn-Newton, Brauer et al. 2017): the Jacobian of ``r`` is
   :math:`\varepsilon^{-1} S` with :math:`S = \mathrm{diag}(P^\top 1) - P^\top \mathrm{diag}(a)^{-1} P`
   (symmetric, positive semi-definite, null vector :math:`1`, numerically singular on blocks of
   targets the plan leaves nearly uncoupled at small ``epsilon``); each step solves
   :math:`(S + \delta I)\,\Delta g = -\varepsilon r` (an ``m x m`` symmetric LDL solve per row, jitter
   :math:`\delta = 10u/m`), keeps per row the best of the step lengths 1, 1/2, 1/4, 1/8 and 0, then
   applies one Sinkhorn sweep (which keeps progress guaranteed where a Newton step is rejected).
   Quadratic convergence: 2 to 4 steps reach 1e-10 in float64 for ``epsilon`` in [1e-3, 0.1] and n
   from 16 to 128 (``benchmarks/sinkhorn_convergence.py``), where the authors' plain iteration needs
   about 50 (``epsilon=0.1``), 450 (``1e-2``) and 3,700 to over 20,000 (``1e-3``) sweeps.

All exponents are taken after subtracting the row's (or column's) largest ``g_j - C_ij`` and only then
divided by ``epsilon``, so the rows of the plan sum to ``a`` up to the dtype's round-off at every
``epsilon`` and nothing overflows. ``epsilon`` must be at least :func:`epsilon_floor` of the compute
dtype (512 machine epsilons: 6.1e-5 in float32, 1.14e-13 in float64); below it the plan's relative
round-off ``u / (2 epsilon)`` exceeds 1e-3 (ties and near-ties no longer balance the marginals) and
a ``ValueError`` names the floor. Below ``epsilon`` = 1e-6 the schedule decays by 1/100 per sweep.

Rows whose standard deviation is below the authors' floor (1e-6, in the units of ``x``) squash to
nearly one value and so get nearly equal soft ranks (the authors' convention); a ``RuntimeWarning``
says so once per process (all-tied rows are exact and do not warn).

Under ``torch.compile`` (``fullgraph=True`` works) and on non-CPU devices (CUDA) the solver reads
nothing on the host: the same warm-up sweeps, then a fixed budget of ``min(max_iter, 6)`` Newton
steps with the eager loop's stopping rule (below) kept as a flag on the device (the steps after the
stop leave the potential unchanged), and no warning; where the eager loop stops within the budget
(2 to 4 steps; none for all-tied rows) the potential is the eager loop's, bit for bit. On a non-CPU device an invalid
plan (below) fails as a device-side assertion (``torch._assert_async``) instead of a ``ValueError``.

The loop stops when the marginal error :math:`\max_j |(P^\top 1)_j - b_j| / b_j` (the authors'
relative error; rows are exact) of every row is at most ``tol``, when it stops decreasing for 3
steps (float round-off), or after ``max_iter`` Newton steps; a ``RuntimeWarning`` reports a plan
left above the tolerance. Host synchronization (CPU eager mode only): one read of the batch's largest
error per Newton step, none in the warm-up phase.

Gradients (backward) are the derivatives of the converged map by implicit differentiation: with
:math:`v = \partial L/\partial g` and :math:`S w = \varepsilon v`,
:math:`\partial L/\partial C_{ij} \mathrel{+}= (P_{ij}/\varepsilon)\,(w_j - (P w)_i / a_i)`; the
remaining dependence (``P`` on ``g`` and ``C``, ``C`` on ``x``) is ordinary autograd. The tests
check these gradients against automatic differentiation of unrolled Sinkhorn iterations run to
convergence in float64.

Cost per row: O(n m) memory for ``P`` plus O(m²) for ``S``; O(n m) per sweep and O(n m² + m³) per
Newton step.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Literal, overload

import torch

from rankwise._kernels._custom import constant_result
from rankwise._registry import RelaxationInfo
from rankwise._twin import FunctionModule
from rankwise._validation import (
    autocast_off,
    check_dim,
    check_floating_nd,
    check_positive,
    compute_dtype,
    rank_dtype,
    to_compute,
)
from rankwise.ops._registry import register_op
from rankwise.ops.soft import register_soft_method

__all__ = [
    "SinkhornSoftRank",
    "SinkhornSoftSort",
    "SinkhornTransport",
    "epsilon_floor",
    "sinkhorn_transport",
    "soft_rank_sinkhorn",
    "soft_sort_sinkhorn",
]

#: the authors' epsilon-scaling schedule: start at 0.1, multiply by 0.95 per sweep
_EPS0 = 0.1
_DECAY = 0.95
#: below this epsilon the schedule decays by _FAST_DECAY per sweep
_FAST_BELOW = 1e-6
_FAST_DECAY = 1e-2
#: sweeps at the target epsilon after the decay, before Newton
_EXTRA_SWEEPS = 5
#: the authors' floor on the standard deviation in the squashing map
_MIN_STD = 1e-6
#: Newton step lengths tried (per row; 0 = keep the current potential)
_STEPS = (1.0, 0.5, 0.25, 0.125)
#: Newton steps of a solve without host reads (traced by torch.compile, or on a non-CPU device): no
#: data-dependent stop; 2 to 4 reach the tolerance
_COMPILED_NEWTON_STEPS = 6
#: stop when the batch's error has not decreased for this many consecutive Newton steps
_STALL = 3

#: a plan whose relative column-marginal error stays above this (default ``tol``) is refused
_INVALID_PLAN = 1e-2

#: default ``tol`` per compute dtype (relative column-marginal error)
_DEFAULT_TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def _default_tol(dtype: torch.dtype, eps: float) -> tuple[float, float]:
    """``(target, accepted)`` for ``tol=None``: iterate towards ``target``; warn only above ``accepted``.

    ``target`` is 1e-10 (float64) or 1e-5 (float32). The entries of ``P`` are ``exp((g - C) / eps)``
    with ``|g - C|`` up to about 0.5 where they matter (``C`` and ``g`` live on the unit interval's
    scale), so their relative round-off, and the smallest column-marginal error one can reach, is
    about ``u / (2 eps)`` (``u`` the machine epsilon): a plan whose error stalls below
    ``accepted = max(target, u / (2 eps))`` is as converged as the dtype allows (float32 at
    ``eps < 6e-3``, float64 at ``eps < 1e-6``).
    """
    target = _DEFAULT_TOL.get(dtype, 1e-5)
    return target, max(target, 0.5 * torch.finfo(dtype).eps / eps)


@dataclass(frozen=True)
class SolveInfo:
    """Diagnostics of one solve: warm-up sweeps, Newton steps, final max marginal error (eager mode)."""

    sweeps: int
    newton_steps: int
    error: float
    converged: bool


#: the information of a solve that did not run (no entries, or no rows)
_NO_SOLVE = SolveInfo(sweeps=0, newton_steps=0, error=0.0, converged=True)


# --------------------------------------------------------------------------------------------------
# problem set-up
# --------------------------------------------------------------------------------------------------
def epsilon_floor(dtype: torch.dtype) -> float:
    """The smallest ``epsilon`` accepted for a computation in ``dtype`` (float16/bfloat16: float32):
    512 times its machine epsilon ``u`` (float32: 6.10e-5, float64: 1.14e-13). The entries of the plan are
    ``exp((g - C) / epsilon)`` with ``g`` and ``C`` on the unit interval's scale, so their relative round-off
    is about ``u / (2 epsilon)``: at the floor, 1e-3 (ties and near-ties then no longer balance the
    marginals; distinct inputs already give the hard permutation there)."""
    return 512.0 * torch.finfo(compute_dtype(dtype)).eps


_std_floor_warned = False


def _warn_std_floor(floored: torch.Tensor) -> None:
    """Warn once per process when a row with distinct entries had its spread below the std floor."""
    global _std_floor_warned
    if _std_floor_warned or floored.numel() == 0 or not bool(floored.any()):
        return
    _std_floor_warned = True
    warnings.warn(
        "rankwise.sinkhorn: a row's standard deviation is below the authors' floor of 1e-6 (in the units of x), "
        "so its entries squash to nearly the same value and get (nearly) equal soft ranks; rescale x (e.g. "
        "divide by its spread) to rank such rows. This warning is shown once.",
        RuntimeWarning,
        stacklevel=5,
    )


def _squash(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sigmoid of the standardized rows (population std floored at 1e-6), scaled by sqrt(3)/pi.

    Standardization is invariant to scaling and shifting each row, so it is computed on
    ``x / c - x_0 / c`` (both detached): ``c`` is the largest power of two not above ``max|x|`` (an exact
    division; large float32 inputs no longer overflow in the variance) and ``x_0`` is the row's first
    entry (an exact subtraction for entries within a factor 2 of it: inputs with a large offset
    relative to their spread, e.g. ``3 + 1e-4 * randn`` in float32, keep their differences exactly
    instead of losing digits in the mean). The floor becomes ``1e-6 / c``. Values and gradients are
    those of the formula.
    """
    amax = x.detach().abs().amax(dim=-1, keepdim=True)
    c = torch.ldexp(torch.ones_like(amax), torch.frexp(amax).exponent - 1)  # 2^e, max|x| / c in [1, 2)
    xs = x / c  # exact: a power of two
    xs = xs - xs[..., :1].detach()  # |xs| < 4: no overflow
    mu = xs.mean(dim=-1, keepdim=True)
    var = (xs - mu).square().mean(dim=-1, keepdim=True)
    # max(std, floor) with a finite gradient when all entries tie (sqrt is never taken at 0), and
    # without squaring the floor (1e-6 / c overflows float32 when squared for inputs below ~1e-25)
    floor = _MIN_STD / c
    root = torch.where(var > 0, var, torch.ones_like(var)).sqrt()
    std = torch.where((var > 0) & (root > floor), root, floor)
    floored = (var > 0) & ~(root > floor)  # distinct entries whose spread the floor flattens
    return torch.sigmoid((xs - mu) / (std * (math.sqrt(3.0) / math.pi))), floored


def _targets(m: int, descending: bool, like: torch.Tensor) -> torch.Tensor:
    y = torch.arange(m, dtype=like.dtype, device=like.device) / max(1, m - 1)
    return y.flip(0) if descending else y


def _cost(xs: torch.Tensor, y: torch.Tensor, p: float) -> torch.Tensor:
    diff = xs.unsqueeze(-1) - y
    if p == 2.0:
        return diff.square()
    if p == 1.0:
        return diff.abs()
    return diff.abs().pow(p)


# --------------------------------------------------------------------------------------------------
# solver (log domain; rows of P exact by construction)
# --------------------------------------------------------------------------------------------------
def _log_plan(g: torch.Tensor, cost: torch.Tensor, eps: float) -> torch.Tensor:
    """``log P`` with rows summing to ``a = 1/n``: ``log a + log_softmax_j((g_j - C_ij) / eps)``."""
    n = cost.shape[-2]
    d = g.unsqueeze(-2) - cost
    # shifted by the row's largest (g_j - C_ij) before dividing by eps: the entries that matter keep
    # exponents of order 1 (no u / eps round-off from large |z|), so the rows sum to a exactly up to u;
    # (z - logsumexp) rather than log_softmax: the same values, and much faster on small CPU tensors
    z = (d - d.detach().amax(dim=-1, keepdim=True).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)) / eps
    return z - (torch.logsumexp(z, dim=-1, keepdim=True) + math.log(n))


def _col_error(log_p: torch.Tensor) -> torch.Tensor:
    """Per row of the batch: ``max_j |colsum_j - b_j| / b_j`` with ``b = 1/m``."""
    m = log_p.shape[-1]
    return (torch.logsumexp(log_p, dim=-2).exp() * m - 1.0).abs().amax(dim=-1)


def _sweep(g: torch.Tensor, cost: torch.Tensor, eps: float) -> torch.Tensor:
    """One Sinkhorn sweep: the column update ``g`` given the exact row potential ``f(g)``."""
    n, m = cost.shape[-2:]
    f = -math.log(n) * eps - _soft_max(g.unsqueeze(-2) - cost, eps, -1)
    return -math.log(m) * eps - _soft_max(f.unsqueeze(-1) - cost, eps, -2)


def _soft_max(d: torch.Tensor, eps: float, dim: int) -> torch.Tensor:
    """``eps * logsumexp(d / eps)`` along ``dim``, shifted by the largest ``d`` before dividing (exponents
    of order 1: no round-off of order ``u |d| / eps``, and no overflow of ``d / eps`` at any ``eps``)."""
    top = d.amax(dim=dim, keepdim=True).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    return top.squeeze(dim) + eps * torch.logsumexp((d - top) / eps, dim=dim)


def _jittered_schur(p: torch.Tensor) -> torch.Tensor:
    """``S + delta I`` with ``S = diag(P^T 1) - P^T diag(a)^{-1} P = diag(P^T 1) - n P^T P`` (``a = 1/n``).

    ``S`` is ``eps`` times the Jacobian of the column residual w.r.t. ``g``. It is positive
    semi-definite with ``S 1 = 0`` (the rows of ``P`` sum to ``a``), and at small ``eps`` it is
    numerically singular on every block of targets that the plan leaves (nearly) uncoupled from the
    others. The residual (and ``dL/dg``) has no component along those per-block constants, so the
    jitter ``delta = 10 * machine_eps / m`` (``S``'s spectrum is on the scale ``1/m``) only keeps
    the solve finite there.
    """
    n, m = p.shape[-2:]
    s = torch.matmul(p.mT, p).mul_(-float(n))
    s.diagonal(dim1=-2, dim2=-1).add_(p.sum(dim=-2) + 10.0 * torch.finfo(p.dtype).eps / m)
    return s


def _solve_sym(s: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """``s^{-1} rhs`` for symmetric ``s`` (batched LDL^T with Bunch-Kaufman pivoting) without host
    synchronization; a failed solve gives non-finite entries.

    Not ``torch.linalg.solve``: on CPU with more than one thread, torch's batched LU has returned
    invalid pivots for matrices of size 256 and more (``solve`` then raises "Pivots given to
    lu_solve must all be greater or equal to 1"); the symmetric factorization is unaffected, and
    is the natural one for this symmetric system anyway.
    """
    ld, pivots, _ = torch.linalg.ldl_factor_ex(s)
    return torch.linalg.ldl_solve(ld, pivots, rhs.unsqueeze(-1)).squeeze(-1)


def _worst_tensor(err: torch.Tensor) -> torch.Tensor:
    """The batch's largest marginal error as a 0-d tensor (rows with NaN inputs excluded: their output is
    NaN anyway; 0 for an empty batch)."""
    return err.nan_to_num(nan=0.0).amax() if err.numel() else err.new_zeros(())


def _worst(err: torch.Tensor) -> float:
    """:func:`_worst_tensor` read on the host."""
    return float(_worst_tensor(err))


def _make_decay_values() -> tuple[float, ...]:
    """The epsilon-scaling values without the floor: ``0.1 * 0.95^k`` down to ``_FAST_BELOW``, then a factor
    1/100 per value, down to the smallest subnormal (384 values)."""
    out = []
    e = _EPS0
    while e > 0.0:
        out.append(e)
        nxt = e * (_DECAY if e > _FAST_BELOW else _FAST_DECAY)
        if nxt >= e:  # (a subnormal product may round back to e)
            break
        e = nxt
    return tuple(out)


_DECAY_VALUES = _make_decay_values()


@constant_result
def _decay_values() -> tuple[float, ...]:
    """:data:`_DECAY_VALUES`; under ``torch.compile`` a constant of the trace (the tracer calls it eagerly)."""
    return _DECAY_VALUES


def _schedule(eps: float) -> list[float]:
    """The epsilon-scaling schedule: the authors' ``max(0.1 * 0.95^k, eps)`` down to ``_FAST_BELOW``,
    then a factor 1/100 per sweep (about 160 sweeps from 1e-6 down to the smallest subnormal, where
    0.95 per sweep would need 14,000, and a product that rounds back to itself would never end).

    The decaying values are constants (:func:`_decay_values`), each only compared with ``eps``: under
    ``torch.compile(dynamic=True)`` ``eps`` (and every module-level float the traced code reads) is a
    symbolic float, and a schedule computed as ``max(e * decay, eps)`` nested one symbolic product and
    ``Max`` per sweep (tracing took over 10 minutes at ``eps=1e-3``); compared with constants, ``eps``
    only gets one guard ``eps < value`` per sweep."""
    out = []
    for e in _decay_values():
        if not e > eps:
            break
        out.append(e)
    out.append(eps)
    return out


def _solve(
    cost: torch.Tensor, eps: float, tol: float, max_iter: int, fixed: bool
) -> tuple[torch.Tensor, torch.Tensor, SolveInfo]:
    """Column potential ``g`` (B, m) of the entropic plan for ``cost`` (B, n, m) and its per-row marginal
    error; no autograd. ``fixed``: a fixed budget of Newton steps and no host read (traced, or a
    non-CPU device), else the early-stopping loop that reads the batch's error once per step."""
    sweeps = 0
    g = torch.zeros(cost.shape[0], cost.shape[-1], dtype=cost.dtype, device=cost.device)
    for e in _schedule(eps):  # epsilon scaling: a fixed schedule of sweeps (depends on eps only)
        g = _sweep(g, cost, e)
        sweeps += 1
    for _ in range(_EXTRA_SWEEPS):
        g = _sweep(g, cost, eps)
        sweeps += 1

    err = _col_error(_log_plan(g, cost, eps))
    if fixed:  # a fixed budget of Newton steps, no host read: the eager loop's stop as a flag in the graph
        # the same stopping rule as below, evaluated on the device: once the batch's error is within tol
        # (or has stalled), the remaining steps leave g unchanged, so the result is the eager loop's
        # whenever that stops within the budget (all-tied rows, converged at the warm-up: no step at all)
        worst_d = _worst_tensor(err)
        active = worst_d > tol
        best_d = torch.full_like(worst_d, math.inf)
        stalled_d = torch.zeros_like(worst_d)
        for _ in range(min(max_iter, _COMPILED_NEWTON_STEPS)):
            g_new, err_new = _newton_step(g, err, cost, eps)
            g = torch.where(active, g_new, g)
            err = torch.where(active, err_new, err)
            worst_d = _worst_tensor(err)
            better = worst_d < best_d
            best_d = torch.where(active & better, worst_d, best_d)
            stalled_d = torch.where(active, torch.where(better, 0.0, stalled_d + 1.0), stalled_d)
            active = active & (worst_d > tol) & (stalled_d < _STALL)
        return (
            g,
            err,
            SolveInfo(sweeps=sweeps, newton_steps=min(max_iter, _COMPILED_NEWTON_STEPS), error=-1.0, converged=True),
        )
    best = math.inf
    stalled = 0
    steps = 0
    worst = _worst(err)  # host sync: one per Newton step
    while worst > tol and steps < max_iter:
        g, err = _newton_step(g, err, cost, eps)
        steps += 1
        worst = _worst(err)
        if worst < best:
            best, stalled = worst, 0
        else:
            stalled += 1
            if stalled >= _STALL:
                break
    return g, err, SolveInfo(sweeps=sweeps, newton_steps=steps, error=worst, converged=worst <= tol)


def _newton_step(
    g: torch.Tensor, err: torch.Tensor, cost: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One Newton step on the column potential (the best of the step lengths per row, 0 included), then one
    Sinkhorn sweep; returns the new potential and its per-row marginal error."""
    m = cost.shape[-1]
    p = _log_plan(g, cost, eps).exp()
    resid = p.sum(dim=-2) - 1.0 / m
    delta = _solve_sym(_jittered_schur(p), -eps * resid)
    delta = torch.nan_to_num(delta, nan=0.0, posinf=0.0, neginf=0.0)
    g_best, e_best = g, err
    for t in _STEPS:
        g_t = g + t * delta
        e_t = _col_error(_log_plan(g_t, cost, eps))
        better = e_t < e_best  # False for NaN: a failed solve is never taken
        g_best = torch.where(better.unsqueeze(-1), g_t, g_best)
        e_best = torch.where(better, e_t, e_best)
    g = _sweep(g_best, cost, eps)
    return g, _col_error(_log_plan(g, cost, eps))


class _ColumnPotential(torch.autograd.Function):
    """``g*(C)``: the converged column potential ``g`` (solved by :func:`_solve`, outside the graph) as a
    function of the cost, differentiated implicitly (see the module docstring)."""

    @staticmethod
    def forward(ctx: Any, cost: torch.Tensor, g: torch.Tensor, eps: float) -> torch.Tensor:  # type: ignore[override]
        ctx.eps = eps
        ctx.save_for_backward(cost, g)
        return g

    @staticmethod
    def backward(ctx: Any, grad_g: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        cost, g = ctx.saved_tensors
        eps = ctx.eps
        n = cost.shape[-2]
        with autocast_off(cost.device):  # a backward run inside an autocast region: still float32
            p = _log_plan(g, cost, eps).exp()
            v = (grad_g - grad_g.mean(dim=-1, keepdim=True)).to(cost.dtype)  # orthogonal to the gauge direction 1
            # (P / eps) (w_j - n (P w)_i) with S w = eps v, written with w' = w / eps = S^{-1} v: no division
            # by eps (P / eps overflowed to inf, times 0, at subnormal eps)
            w = _solve_sym(_jittered_schur(p), v)
            pw = (p @ w.unsqueeze(-1)).squeeze(-1)
            grad_cost = p * (w.unsqueeze(-2) - n * pw.unsqueeze(-1))
        return grad_cost, None, None


# --------------------------------------------------------------------------------------------------
# public functions
# --------------------------------------------------------------------------------------------------
def _check_options(
    epsilon: Any, p: Any, num_targets: Any, tol: Any, max_iter: Any, descending: Any
) -> tuple[float, float, float | None, int]:
    eps = check_positive(epsilon, "epsilon")
    pw = check_positive(p, "p")
    if pw < 1.0:
        raise ValueError(f"`p` must be >= 1 (the cost |x - y|^p needs a finite gradient at 0), got {p!r}")
    if num_targets is not None and (isinstance(num_targets, bool) or not isinstance(num_targets, int)):
        raise TypeError(f"`num_targets` must be an int or None, got {type(num_targets).__name__}")
    if num_targets is not None and num_targets < 1:
        raise ValueError(f"`num_targets` must be >= 1 or None, got {num_targets}")
    t = None if tol is None else check_positive(tol, "tol")
    if isinstance(max_iter, bool) or not isinstance(max_iter, int):
        raise TypeError(f"`max_iter` must be an int, got {type(max_iter).__name__}")
    if max_iter < 0:
        raise ValueError(f"`max_iter` must be >= 0, got {max_iter}")
    if not isinstance(descending, bool):
        raise TypeError(f"`descending` must be a bool, got {type(descending).__name__}")
    return eps, pw, t, max_iter


def _plan_last(
    x: torch.Tensor,
    *,
    epsilon: float,
    p: float,
    num_targets: int | None,
    descending: bool,
    tol: float | None,
    max_iter: int,
) -> tuple[torch.Tensor, torch.Tensor, SolveInfo]:
    """``(x in the compute dtype, P, the solve's SolveInfo)`` for ``x`` (..., n): ``P`` is (..., n, m)."""
    eps, pw, t, it = _check_options(epsilon, p, num_targets, tol, max_iter, descending)
    xc = to_compute(x)
    n = x.shape[-1]
    m = n if num_targets is None else num_targets
    lead = x.shape[:-1]
    if n == 0:
        if m > 0:
            raise ValueError(f"`x` has no entries along `dim`, so it cannot be transported onto num_targets={m}")
        return xc, xc.new_zeros((*lead, 0, 0)) + xc.sum() * 0, _NO_SOLVE
    flat = xc.reshape(-1, n)
    if flat.shape[0] == 0:
        return xc, flat.new_zeros((*lead, n, m)) + flat.sum() * 0, _NO_SOLVE
    floor = epsilon_floor(flat.dtype)
    if eps < floor:
        raise ValueError(
            f"`epsilon` must be >= {floor:.3g} for {str(flat.dtype).replace('torch.', '')} computation "
            f"(512 x the machine epsilon u: below it the plan's round-off, u / (2 epsilon), exceeds 1e-3), "
            f"got {epsilon!r}; raise `epsilon` or compute in float64 (floor {epsilon_floor(torch.float64):.3g})"
        )
    tol_, accepted = (t, t) if t is not None else _default_tol(flat.dtype, eps)
    squashed, floored = _squash(flat)
    cost = _cost(squashed, _targets(m, descending, flat), pw)
    host = flat.device.type == "cpu" and not torch.compiler.is_compiling()  # host reads allowed
    if host:
        _warn_std_floor(floored)
    invalid = max(_INVALID_PLAN, accepted) if t is None else math.inf
    with torch.no_grad():
        g, err, info = _solve(cost.detach(), eps, tol_, it, fixed=not host)
    if cost.device.type != "cpu" and invalid < math.inf:
        # the refusal of an invalid plan without a host read: a device-side assertion
        torch._assert_async(
            (err.nan_to_num(nan=0.0) <= invalid).all(),
            "rankwise.sinkhorn: the transport plan's column marginals stay off by more than 1%: "
            "`epsilon` is too small for these inputs in this dtype; raise it or compute in float64",
        )
    g = _ColumnPotential.apply(cost, g, eps)
    if host and info.error > invalid:
        # marginals off by more than 1%: an invalid plan (e.g. tied inputs spread over fewer targets at an
        # epsilon near the floor) is refused rather than returned
        raise ValueError(
            f"`epsilon`={eps:g} is too small for these inputs in {str(flat.dtype).replace('torch.', '')}: the "
            f"transport plan's column marginals stay off by {info.error:.2g} (relative) after max_iter={it} "
            "Newton steps; raise `epsilon` or compute in float64"
        )
    if host and info.error > accepted:
        # the message holds only the options, so that Python's warning filter shows it once per call site
        warnings.warn(
            f"rankwise.sinkhorn: the transport plan did not reach tol={accepted:g} at epsilon={eps:g} within "
            f"max_iter={it} Newton steps; increase `max_iter`, `tol` or `epsilon`, or compute in float64",
            RuntimeWarning,
            stacklevel=4,
        )
    plan = _log_plan(g, cost, eps).exp()
    return xc, plan.reshape(*lead, n, m), info


def _rank_from_plan(plan: torch.Tensor) -> torch.Tensor:
    n, m = plan.shape[-2:]
    cum_b = torch.arange(1, m + 1, dtype=plan.dtype, device=plan.device) / m
    # soft CDF = P cumsum(b) / a with a = 1/n; ranks = n * CDF
    return (plan @ cum_b) * (n * n)


def _sort_from_plan(xc: torch.Tensor, plan: torch.Tensor) -> torch.Tensor:
    """``P^T x / b`` computed as ``P^T (x - c) / b + c (P^T 1) / b`` with ``c`` the row mean.

    The same value. For the derivative, ``c`` and the column sums ``P^T 1`` are constants: the column
    sums of the converged plan are ``b`` whatever ``x`` is, so their derivative is exactly zero, and
    then so is the one through ``c``. Autograd would instead form it from large terms that cancel
    (``x``'s offset times the derivative of ``P``): in float32, inputs whose offset is large relative
    to their spread (e.g. ``3 + 1e-4 * randn``) got gradients wrong by several times their size.
    """
    m = plan.shape[-1]
    c = xc.detach().mean(dim=-1, keepdim=True)
    centred = ((xc - c).unsqueeze(-2) @ plan).squeeze(-2)
    return (centred + c * plan.detach().sum(dim=-2)) * m


def _soft_rank_last(
    x: torch.Tensor,
    *,
    descending: bool = False,
    epsilon: float = 1e-2,
    p: float = 2.0,
    num_targets: int | None = None,
    tol: float | None = None,
    max_iter: int = 50,
) -> torch.Tensor:
    with autocast_off(x.device):  # the whole solve in the compute dtype (no half LDL^T under autocast)
        _, plan, _ = _plan_last(
            x, epsilon=epsilon, p=p, num_targets=num_targets, descending=descending, tol=tol, max_iter=max_iter
        )
        return _rank_from_plan(plan).to(rank_dtype(x.dtype))  # ranks reach n: float32 for fp16/bf16


def _soft_sort_last(
    x: torch.Tensor,
    *,
    descending: bool = False,
    epsilon: float = 1e-2,
    p: float = 2.0,
    num_targets: int | None = None,
    tol: float | None = None,
    max_iter: int = 50,
) -> torch.Tensor:
    with autocast_off(x.device):  # the whole solve in the compute dtype (no half LDL^T under autocast)
        xc, plan, _ = _plan_last(
            x, epsilon=epsilon, p=p, num_targets=num_targets, descending=descending, tol=tol, max_iter=max_iter
        )
        return _sort_from_plan(xc, plan).to(x.dtype)


@overload
def sinkhorn_transport(
    x: torch.Tensor,
    *,
    epsilon: float = ...,
    p: float = ...,
    num_targets: int | None = ...,
    descending: bool = ...,
    tol: float | None = ...,
    max_iter: int = ...,
    dim: int = ...,
    return_info: Literal[False] = ...,
) -> torch.Tensor: ...


@overload
def sinkhorn_transport(
    x: torch.Tensor,
    *,
    epsilon: float = ...,
    p: float = ...,
    num_targets: int | None = ...,
    descending: bool = ...,
    tol: float | None = ...,
    max_iter: int = ...,
    dim: int = ...,
    return_info: Literal[True],
) -> tuple[torch.Tensor, SolveInfo]: ...


def sinkhorn_transport(
    x: torch.Tensor,
    *,
    epsilon: float = 1e-2,
    p: float = 2.0,
    num_targets: int | None = None,
    descending: bool = False,
    tol: float | None = None,
    max_iter: int = 50,
    dim: int = -1,
    return_info: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, SolveInfo]:
    r"""Entropic optimal transport plan from the squashed inputs to sorted targets (Cuturi et al., 2019).

    With :math:`\tilde x = \sigma\bigl((x - \bar x)/(\max(\mathrm{std}(x), 10^{-6})\sqrt 3/\pi)\bigr)`
    (population std), targets :math:`y_j = j/\max(1, m-1)` (reversed when ``descending``), uniform
    weights :math:`a = 1_n/n`, :math:`b = 1_m/m` and cost :math:`C_{ij} = |\tilde x_i - y_j|^p`,

    .. math::
        P = \arg\min_{P \ge 0,\ P 1 = a,\ P^\top 1 = b} \langle P, C\rangle
            + \varepsilon \sum_{ij} P_{ij} (\log P_{ij} - 1).

    Row ``i`` is input ``x_i``; column ``j`` is the ``j``-th position of the requested order (the
    smallest values first, or the largest first when ``descending``). As :math:`\varepsilon \to 0`,
    :math:`nP` tends to the sorting permutation matrix (``m = n``, distinct inputs).

    The plan is solved to convergence (relative column-marginal error at most ``tol``; rows are
    exact) by epsilon scaling and Newton's method in the log domain, and it is differentiated
    implicitly (the derivative of the converged map); see :mod:`rankwise.ops.sinkhorn`. ``tol=None``
    means 1e-10 in float64 and 1e-5 in float32, and accepts errors up to :math:`u/(2\varepsilon)`
    (``u`` the machine epsilon; float32 below ``epsilon`` = 6e-3) where round-off stalls the solver
    above it; ``max_iter`` bounds the Newton steps (a ``RuntimeWarning`` reports a plan left above the
    tolerance). ``return_info=True`` returns ``(P, info)``, ``info`` the solve's :class:`SolveInfo`
    (warm-up sweeps, Newton steps, final relative column-marginal error, converged); on a non-CPU
    device or under ``torch.compile`` the error is not read on the host (``error=-1.0``).

    Degenerate inputs: ``n = 0`` gives an empty plan (``num_targets`` must then be ``None``);
    ``n = 1`` gives :math:`P = b^\top`; all ties give :math:`P = a b^\top` (every input squashes to 1/2).

    Cost per row: O(n m) memory plus O(m²) for the Newton system; about 50 (``epsilon=1e-2``) to 100
    (``1e-3``) log-domain sweeps, then 1 to 5 Newton steps of O(n m² + m³) each.

    Shape:
        - x: :math:`(*, n, *)` floating; sorted along ``dim``.
        - output: :math:`(*', n, m)` with :math:`*'` the shape of ``x`` without ``dim`` and ``m``
          ``num_targets`` (default ``n``); dtype of ``x`` (float16/bfloat16 computed in float32).

    Example:
        >>> import torch, rankwise
        >>> x = torch.tensor([[0.2, -1.0, 3.0]])
        >>> (rankwise.sinkhorn_transport(x, epsilon=1e-3) * 3).round(decimals=3)
        tensor([[[0., 1., 0.],
                 [1., 0., 0.],
                 [0., 0., 1.]]])
    """
    check_floating_nd(x, "x")
    d = check_dim(x, dim)
    if not isinstance(return_info, bool):
        raise TypeError(f"`return_info` must be a bool, got {type(return_info).__name__}")
    with autocast_off(x.device):  # the whole solve in the compute dtype (no half LDL^T under autocast)
        _, plan, info = _plan_last(
            x.movedim(d, -1),
            epsilon=epsilon,
            p=p,
            num_targets=num_targets,
            descending=descending,
            tol=tol,
            max_iter=max_iter,
        )
    return (plan.to(x.dtype), info) if return_info else plan.to(x.dtype)


def soft_rank_sinkhorn(
    x: torch.Tensor,
    *,
    epsilon: float = 1e-2,
    p: float = 2.0,
    num_targets: int | None = None,
    descending: bool = False,
    tol: float | None = None,
    max_iter: int = 50,
    dim: int = -1,
) -> torch.Tensor:
    r"""Optimal-transport soft ranks (Cuturi, Teboul & Vert, NeurIPS 2019), 1-based, in :math:`[n/m, n]`.

    With the plan :math:`P` of :func:`sinkhorn_transport` the soft CDF is
    :math:`(P\,\mathrm{cumsum}(b))_i / a_i` and the soft rank is :math:`n` times it:

    .. math:: r_i = n^2 \sum_j P_{ij}\,\frac{j}{m}, \qquad j = 1..m.

    Ascending (the smallest value gets the rank nearest ``n/m``) unless ``descending``. As
    ``epsilon → 0`` (with ``m = n``) the result tends to ``rankwise.rank(x)`` (ties averaged); all ties
    give :math:`n(m+1)/(2m)` everywhere. The input is squashed per row before transport, so the
    result is invariant to shifting and positively scaling ``x`` and ``epsilon`` is scale-free.
    Gradients are exact derivatives of the converged plan (implicit differentiation). Options,
    degenerate inputs and cost as in :func:`sinkhorn_transport`; ``n = 0`` gives an empty result.

    Shape:
        - x: :math:`(*, n, *)` floating; ranked along ``dim``.
        - output: same shape as ``x``; dtype of ``x``, float32 for float16/bfloat16 (ranks reach n;
          docs/conventions.md).

    Example:
        >>> import torch, rankwise
        >>> x = torch.tensor([[0.2, -1.0, 3.0]])
        >>> rankwise.soft_rank_sinkhorn(x, epsilon=1e-3).round(decimals=3)
        tensor([[2., 1., 3.]])
        >>> rankwise.soft_rank_sinkhorn(x, epsilon=0.1).round(decimals=3)
        tensor([[1.8110, 1.2400, 2.9490]])
    """
    check_floating_nd(x, "x")
    d = check_dim(x, dim)
    out = _soft_rank_last(
        x.movedim(d, -1),
        descending=descending,
        epsilon=epsilon,
        p=p,
        num_targets=num_targets,
        tol=tol,
        max_iter=max_iter,
    )
    return out.movedim(-1, d)


def soft_sort_sinkhorn(
    x: torch.Tensor,
    *,
    epsilon: float = 1e-2,
    p: float = 2.0,
    num_targets: int | None = None,
    descending: bool = False,
    tol: float | None = None,
    max_iter: int = 50,
    dim: int = -1,
) -> torch.Tensor:
    r"""Optimal-transport soft sort (Cuturi, Teboul & Vert, NeurIPS 2019): ``m`` soft sorted values.

    With the plan :math:`P` of :func:`sinkhorn_transport`, the ``j``-th value is the
    :math:`P`-weighted mean of the inputs sent to target ``j``, on the original (unsquashed) ``x``:

    .. math:: s_j = \frac{(P^\top x)_j}{b_j} = m \sum_i P_{ij}\,x_i, \qquad j = 1..m.

    Ascending unless ``descending``. As ``epsilon → 0`` (with ``m = n``) the result tends to
    ``torch.sort(x).values``; with ``m < n`` (``num_targets``) each output averages about ``n/m``
    inputs (a soft quantization). All ties give ``x``. Gradients are exact derivatives of the
    converged plan (implicit differentiation). Options, degenerate inputs and cost as in
    :func:`sinkhorn_transport`.

    Shape:
        - x: :math:`(*, n, *)` floating; sorted along ``dim``.
        - output: the shape of ``x`` with ``dim`` of size ``m`` (``num_targets``, default ``n``);
          dtype of ``x`` (float16/bfloat16 computed in float32).

    Example:
        >>> import torch, rankwise
        >>> x = torch.tensor([[0.2, -1.0, 3.0]])
        >>> rankwise.soft_sort_sinkhorn(x, epsilon=1e-3).round(decimals=3)
        tensor([[-1.0000,  0.2000,  3.0000]])
        >>> rankwise.soft_sort_sinkhorn(x, descending=True, num_targets=2, epsilon=1e-3).round(decimals=3)
        tensor([[ 2.0670, -0.6000]])
    """
    check_floating_nd(x, "x")
    d = check_dim(x, dim)
    out = _soft_sort_last(
        x.movedim(d, -1),
        descending=descending,
        epsilon=epsilon,
        p=p,
        num_targets=num_targets,
        tol=tol,
        max_iter=max_iter,
    )
    return out.movedim(-1, d)


# --------------------------------------------------------------------------------------------------
# module twins
# --------------------------------------------------------------------------------------------------
class _SinkhornModule(FunctionModule):
    """Shared module twin: holds the options of a Sinkhorn operator."""

    _options = ("epsilon", "p", "num_targets", "descending", "tol", "max_iter", "dim")

    def __init__(
        self,
        *,
        epsilon: float = 1e-2,
        p: float = 2.0,
        num_targets: int | None = None,
        descending: bool = False,
        tol: float | None = None,
        max_iter: int = 50,
        dim: int = -1,
    ) -> None:
        super().__init__()
        self.epsilon, self.p, self.tol, self.max_iter = _check_options(
            epsilon, p, num_targets, tol, max_iter, descending
        )
        self.num_targets, self.descending, self.dim = num_targets, descending, dim


class SinkhornTransport(_SinkhornModule):
    """Module twin of :func:`sinkhorn_transport`."""

    _function = staticmethod(sinkhorn_transport)


class SinkhornSoftRank(_SinkhornModule):
    """Module twin of :func:`soft_rank_sinkhorn`."""

    _function = staticmethod(soft_rank_sinkhorn)


class SinkhornSoftSort(_SinkhornModule):
    """Module twin of :func:`soft_sort_sinkhorn`."""

    _function = staticmethod(soft_sort_sinkhorn)


# --------------------------------------------------------------------------------------------------
# registration
# --------------------------------------------------------------------------------------------------
register_soft_method("sinkhorn", sort=_soft_sort_last, rank=_soft_rank_last)


#: ``n`` times the plan to ``n`` descending targets is doubly stochastic; ``P[i, j]``: input ``i``, target ``j``
_SINKHORN_RELAXATION = RelaxationInfo(
    "sinkhorn",
    orientation="columns",
    mass="uniform",
    fixed={"descending": True},
    options={"epsilon": 0.1, "p": 2.0, "max_iter": 200},
    straight_through=True,
    description="optimal-transport sort: n x the Sinkhorn plan to n targets "
    "(rankwise.sinkhorn_transport, Cuturi et al.)",
)
for _name, _fn, _mod in (
    ("sinkhorn_transport", sinkhorn_transport, SinkhornTransport),
    ("soft_rank_sinkhorn", soft_rank_sinkhorn, SinkhornSoftRank),
    ("soft_sort_sinkhorn", soft_sort_sinkhorn, SinkhornSoftSort),
):
    register_op(
        _name,
        module=_mod,
        gradient="exact",
        relaxation=_SINKHORN_RELAXATION if _name == "sinkhorn_transport" else None,
    )(_fn)
