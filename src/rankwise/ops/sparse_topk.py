r"""Sparse soft top-k (Sander et al., ICML 2023, "Fast, Differentiable and Sparse Top-k: a Convex
Analysis Perspective") and SOFT top-k by entropic optimal transport (Xie et al., NeurIPS 2020,
"Differentiable Top-k with Optimal Transport").

Both are implementations of ``rankwise.soft_topk(..., method="sparse" | "ot")``; they receive the
scores with the selected dimension last (computation dtype, any leading dims) and select the
``k`` largest.

Sparse top-k. The top-k mask is the gradient of the sum of the ``k`` largest entries,
:math:`\max_{y \in \mathcal P} \langle y, x\rangle` over the permutahedron :math:`\mathcal P` of
:math:`w = (1, \dots, 1, 0, \dots, 0)` (``k`` ones), which is the capped simplex
:math:`\{y \in [0, 1]^n : \sum_i y_i = k\}`. With the p-norm regularization
:math:`\frac{\lambda}{p}\lVert y\rVert_p^p` the relaxed mask is

.. math::
    y^\star = \arg\max_{y \in \mathcal P} \langle y, x\rangle - \frac{\lambda}{p}\lVert y\rVert_p^p,

and its KKT conditions on the capped simplex give the threshold form, with :math:`q = p/(p-1)`,

.. math::
    y_i = \mathrm{clip}\Bigl(\bigl((x_i - \tau)/\lambda\bigr)_+^{\,q-1}, 0, 1\Bigr), \qquad
    \tau \text{ such that } \textstyle\sum_i y_i = k.

In the authors' isotonic formulation this is the solution whose pool-adjacent-violators (PAV)
blocks are singletons except one pooled block around position ``k`` of the sorted scores; the block's
value is ``tau``. ``solver="pav"`` computes it exactly: sort, evaluate :math:`\sum_i y_i` at the
``2n`` breakpoints :math:`\{x_i, x_i - \lambda\}` from prefix sums, and solve the block's equation
on the bracketing interval (linear for ``p = 2``, a monotone cubic for ``p = 4/3``); O(n log n) time,
O(n) memory, no host synchronisation. ``solver="dykstra"`` (``p = 2``) runs the authors' alternative:
Dykstra's alternating projections for the isotonic regression of :math:`s - \lambda w` (``s`` the
sorted scores), ``num_iter`` steps, O(num_iter n). Both are differentiated implicitly:
:math:`\partial\tau/\partial x_i \propto \phi'(x_i - \tau)` on the pooled block (``phi`` the
un-clipped map), the isotonic block averages for Dykstra (blocks read from the solution).

SOFT top-k. With :math:`c_i = -x_i` (``c_i`` smaller for larger scores), the cost
:math:`C_{i0} = c_i^2`, :math:`C_{i1} = (c_i - 1)^2` divided by its largest entry (a constant of
the gradient), the uniform source :math:`\mu_i = 1/n` and the two-point target
:math:`\nu = (k/n, (n-k)/n)`, the entropic plan :math:`\Gamma` of
:math:`\min_\Gamma \langle \Gamma, C\rangle + \varepsilon \sum \Gamma (\log\Gamma - 1)` is
computed by ``max_iter`` log-domain Sinkhorn sweeps (rows, then columns: the column sums are
exact), and the membership is :math:`n \Gamma_{:, 0}`. The backward is implicit (the derivative of
the converged plan: a 2 x 2 bordered system per row, solved by its Schur complement), as in the
authors' code; at a finite ``max_iter`` it is the derivative of the fixed point, not of the sweeps.
"""

from __future__ import annotations

import math

import torch

from rankwise._validation import check_choice, check_int, check_positive

__all__: list[str] = []

_TINY = 1e-300


# --------------------------------------------------------------------------------------------------
# sparse top-k: the threshold of the p-norm regularized mask
# --------------------------------------------------------------------------------------------------
def _mask_from_tau(x: torch.Tensor, tau: torch.Tensor, lam: float, q: float) -> torch.Tensor:
    u = ((x - tau) / lam).clamp(0.0, 1.0)
    return u if q == 2.0 else u.pow(q - 1.0)


def _phi_prime(u: torch.Tensor, lam: float, q: float) -> torch.Tensor:
    """Derivative (up to a constant factor) of the un-clipped map on the pooled block ``0 < u < lam``."""
    inside = (u > 0) & (u < lam)
    d = torch.ones_like(u) if q == 2.0 else (u / lam).clamp_min(0.0).pow(q - 2.0)
    return torch.where(inside, d, torch.zeros_like(d))


def _solve_tau(x: torch.Tensor, k: int, lam: float, q: float) -> torch.Tensor:
    """``tau`` (rows, 1) with ``sum(mask(x, tau)) = k`` for the rows of ``x`` (rows, n), float64 inside.

    ``G(t) = sum_i clip(((s_i - t) / lam)_+^(q-1), 0, 1)`` decreases in ``t``; binary searches over the
    ``2n`` sorted breakpoints ``{s_i, s_i - lam}`` (``G`` evaluated entry by entry: every term is in
    [0, 1], no cancellation) find the interval holding the root, on which the pooled entries are fixed
    and the equation is solved directly. O(n log n) per row."""
    n = x.shape[-1]
    s = x.detach().double()
    if k >= n:  # every entry selected: any tau below min - lam
        return (s.amin(-1, keepdim=True) - 2.0 * lam).to(x.dtype)
    bp, _ = torch.sort(torch.cat([s, s - lam], dim=-1), dim=-1)  # (rows, 2n) ascending

    def g(t: torch.Tensor) -> torch.Tensor:
        u = ((s - t) / lam).clamp(0.0, 1.0)
        return (u if q == 2.0 else u**3).sum(-1, keepdim=True)

    steps = max(1, math.ceil(math.log2(2 * n)) + 1)

    def last_index(pred: str) -> torch.Tensor:
        """The last breakpoint index with ``G >= k`` (``pred="ge"``) or ``G > k`` (``"gt"``, -1 if none)."""
        lo = torch.full_like(bp[:, :1], -1 if pred == "gt" else 0, dtype=torch.long)
        hi = torch.full_like(lo, 2 * n - 1)  # G(max breakpoint) = 0 < k
        for _ in range(steps):
            mid = torch.div(lo + hi + 1, 2, rounding_mode="floor").clamp(max=2 * n - 1)
            val = g(bp.gather(-1, mid.clamp(min=0)))
            ok = (val >= k) if pred == "ge" else (val > k)
            move = ok & (mid < hi)
            lo = torch.where(move, mid, lo)
            hi = torch.where(move | (mid >= hi), hi, mid)
        return lo

    j = last_index("ge").clamp(0, 2 * n - 2)
    lo, hi = bp.gather(-1, j), bp.gather(-1, j + 1)
    mid = 0.5 * (lo + hi)
    # the active sets on (lo, hi): ones where s_i >= mid + lam, pooled where mid < s_i < mid + lam
    ones = (s >= mid + lam).to(s.dtype)
    pooled = ((s > mid) & (s < mid + lam)).to(s.dtype)
    need = k - ones.sum(-1, keepdim=True)
    m = pooled.sum(-1, keepdim=True)
    v = (s - mid) * pooled  # centred on the interval: |v| < lam on the block
    if q == 2.0:
        tau = mid + ((v.sum(-1, keepdim=True) - lam * need) / m.clamp_min(1.0))
    else:
        # sum_B (v_i - y)^3 = lam^3 need, decreasing in y: bisection on the bracket, then Newton steps
        lo_y, hi_y = lo - mid, hi - mid
        target = lam**3 * need
        for _ in range(60):
            y = 0.5 * (lo_y + hi_y)
            f = (((v - y) ** 3) * pooled).sum(-1, keepdim=True) - target
            lo_y = torch.where(f > 0, y, lo_y)
            hi_y = torch.where(f > 0, hi_y, y)
        y = 0.5 * (lo_y + hi_y)
        for _ in range(2):
            f = (((v - y) ** 3) * pooled).sum(-1, keepdim=True) - target
            df = -3 * (((v - y) ** 2) * pooled).sum(-1, keepdim=True)
            y = torch.where(df < 0, y - f / torch.where(df < 0, df, torch.ones_like(df)), y)
        tau = mid + y
    tau = torch.where(m > 0, tau, mid)  # no pooled entry: the mask is 0/1, tau anywhere in the interval
    # G equals k (exactly: every term 0 or 1) on a range of breakpoints: the mask is 0/1 and locally
    # constant there; tau in the middle of that range (its derivative is then 0)
    first = last_index("gt") + 1  # the first breakpoint with G <= k
    flat_lo = bp.gather(-1, first.clamp(max=2 * n - 1))
    flat = (first <= j) & (g(flat_lo) == k)
    tau = torch.where(flat, 0.5 * (flat_lo + lo), tau)
    return tau.to(x.dtype)


class _Threshold(torch.autograd.Function):
    """``tau(x)`` of the sparse top-k mask, differentiated implicitly."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, k: int, lam: float, q: float) -> torch.Tensor:  # type: ignore[override]
        tau = _solve_tau(x, k, lam, q)
        ctx.save_for_backward(x, tau)
        ctx.lam, ctx.q = lam, q
        return tau

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        x, tau = ctx.saved_tensors
        d = _phi_prime(x - tau, ctx.lam, ctx.q)
        den = d.sum(-1, keepdim=True)
        weights = torch.where(den > 0, d / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(d))
        return grad * weights, None, None, None


def _dykstra_isotonic(y: torch.Tensor, num_iter: int) -> torch.Tensor:
    """Decreasing isotonic regression of the rows of ``y`` (rows, n) by Dykstra's alternating projections
    onto the pairwise constraints ``(0, 1), (2, 3), ...`` and ``(1, 2), (3, 4), ...``."""
    n = y.shape[-1]
    if n % 2 == 0:  # odd length: one more, smaller entry (it never pools with the others)
        y = torch.cat([y, y.amin(-1, keepdim=True) - 1.0], dim=-1)

    def pairs(v: torch.Tensor) -> torch.Tensor:  # projection onto v[2i] >= v[2i+1] (even length)
        a, b = v[..., 0::2], v[..., 1::2]
        ok = b - a < 0
        mean = 0.5 * (a + b)
        return torch.stack([torch.where(ok, a, mean), torch.where(ok, b, mean)], dim=-1).flatten(-2)

    v, p, qq = y, torch.zeros_like(y), torch.zeros_like(y)
    for _ in range(num_iter // 2):
        z = v + p
        w = torch.cat([pairs(z[..., :-1]), z[..., -1:]], dim=-1)
        p = z - w
        z = w + qq
        v = torch.cat([z[..., :1], pairs(z[..., 1:])], dim=-1)
        qq = z - v
    return v[..., :n]


class _DykstraIsotonic(torch.autograd.Function):
    """Dykstra's isotonic regression, differentiated as the isotonic regression whose blocks are the
    runs of (nearly) equal solution values: the block averages of the cotangent."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, num_iter: int, tol: float) -> torch.Tensor:  # type: ignore[override]
        v = _dykstra_isotonic(y.detach(), num_iter)
        start = torch.ones_like(v, dtype=torch.bool)
        start[..., 1:] = (v[..., 1:] - v[..., :-1]).abs() > tol
        ids = start.long().cumsum(-1) - 1
        ctx.save_for_backward(ids)
        return v

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        (ids,) = ctx.saved_tensors
        sums = torch.zeros_like(grad).scatter_add_(-1, ids, grad)
        counts = torch.zeros_like(grad).scatter_add_(-1, ids, torch.ones_like(grad))
        return (sums / counts.clamp_min(1.0)).gather(-1, ids), None, None


def sparse_topk_mask(
    x: torch.Tensor,
    k: int,
    *,
    p: float = 2.0,
    regularization_strength: float = 1.0,
    solver: str = "pav",
    num_iter: int = 500,
    tol: float = 1e-4,
) -> torch.Tensor:
    """Sparse soft top-k mask of the rows of ``x`` (last dim), see the module docstring."""
    lam = check_positive(regularization_strength, "regularization_strength")
    check_choice(solver, "solver", ("pav", "dykstra"))
    if isinstance(p, bool) or not isinstance(p, (int, float)):
        raise TypeError(f"`p` must be a float (2 or 4/3), got {type(p).__name__}")
    if not (math.isclose(p, 2.0) or math.isclose(p, 4.0 / 3.0)):
        raise ValueError(f"`p` must be 2 or 4/3 for method='sparse', got {p!r}")
    q = 2.0 if math.isclose(p, 2.0) else 4.0
    shape, n = x.shape, x.shape[-1]
    rows = x.reshape(-1, n)
    if rows.shape[0] == 0:
        return x * 0
    if solver == "dykstra":
        if q != 2.0:
            raise ValueError(f"`solver='dykstra'` supports p = 2 only, got p = {p!r}")
        it = check_int(num_iter, "num_iter", low=1)
        t = check_positive(tol, "tol")
        s, perm = torch.sort(rows, dim=-1, descending=True)
        w = (torch.arange(n, device=x.device) < k).to(x.dtype)
        v = _DykstraIsotonic.apply(s - lam * w, it, t * lam)
        y = (s - v) / lam
        return torch.empty_like(y).scatter(-1, perm, y).reshape(shape)
    tau = _Threshold.apply(rows, k, lam, q)
    return _mask_from_tau(rows, tau, lam, q).reshape(shape)


# --------------------------------------------------------------------------------------------------
# SOFT top-k (entropic optimal transport to {0, 1})
# --------------------------------------------------------------------------------------------------
def _ot_plan(c: torch.Tensor, k: int, eps: float, max_iter: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-domain Sinkhorn plan (rows, n, 2) of the normalized cost of ``c`` (rows, n), no autograd;
    and the normalization (the largest cost of each row, (rows, 1, 1))."""
    n = c.shape[-1]
    c0, c1 = c * c, (c - 1.0) ** 2
    norm = torch.maximum(c0.amax(-1, keepdim=True), c1.amax(-1, keepdim=True))
    norm = norm.clamp_min(torch.finfo(c.dtype).tiny)
    a0, a1 = c0 / (norm * eps), c1 / (norm * eps)  # the cost over epsilon
    log_mu = -math.log(n)
    log_nu0 = math.log(k / n)
    log_nu1 = math.log((n - k) / n) if k < n else -math.inf
    # potentials over epsilon: f (rows, n), g0 / g1 (rows, 1)
    g0 = torch.zeros_like(c[:, :1])
    g1 = torch.zeros_like(g0)
    f = torch.zeros_like(c)
    for _ in range(max_iter):
        f = log_mu - torch.logaddexp(g0 - a0, g1 - a1)
        g0 = log_nu0 - torch.logsumexp(f - a0, dim=-1, keepdim=True)
        g1 = log_nu1 - torch.logsumexp(f - a1, dim=-1, keepdim=True)
    plan = torch.stack([torch.exp(f + g0 - a0), torch.exp(f + g1 - a1)], dim=-1)
    return plan, norm.unsqueeze(-1)


class _OTTopK(torch.autograd.Function):
    r"""``n * Gamma[:, 0]`` of the entropic plan, implicit backward.

    For a converged plan, :math:`d\Gamma_{ij} = \Gamma_{ij}(df_i + dg_j - dC_{ij})/\varepsilon` with
    the marginal constraints fixing ``df`` and ``dg_0`` (``dg_1 = 0``: the gauge). The adjoint of that
    bordered system, :math:`[\mathrm{diag}(\mu), \gamma; \gamma^\top, \nu_0]` with
    :math:`\gamma = \Gamma_{:,0}`, is solved by its Schur complement
    :math:`\sigma = \nu_0 - \gamma^\top \mathrm{diag}(\mu)^{-1}\gamma`; a plan at the hard limit
    (:math:`\sigma` at round-off level) contributes no gradient through ``dg_0``.
    """

    @staticmethod
    def forward(ctx, c: torch.Tensor, k: int, eps: float, max_iter: int) -> torch.Tensor:  # type: ignore[override]
        n = c.shape[-1]
        plan, norm = _ot_plan(c.detach(), k, eps, max_iter)
        ctx.save_for_backward(c.detach(), plan, norm)
        ctx.eps, ctx.k = eps, k
        return plan[..., 0] * n

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        c, plan, norm = ctx.saved_tensors
        eps = ctx.eps
        n = c.shape[-1]
        mu = 1.0 / n
        nu0 = ctx.k / n
        gam = plan[..., 0]  # (rows, n)
        # dL/dGamma: only column 0 carries the cotangent (times n)
        h = torch.zeros_like(plan)
        h[..., 0] = grad * n * gam  # H = G * Gamma
        hr = h.sum(-1)  # row sums (rows, n)
        hc0 = h[..., 0].sum(-1, keepdim=True)  # column-0 sum (rows, 1)
        sigma = nu0 - (gam * gam).sum(-1, keepdim=True) / mu
        rhs = hc0 - (gam * hr).sum(-1, keepdim=True) / mu
        ok = sigma.abs() > 64 * torch.finfo(c.dtype).eps * nu0
        beta = torch.where(ok, rhs / torch.where(ok, sigma, torch.ones_like(sigma)), torch.zeros_like(sigma))
        alpha = (hr - gam * beta) / mu  # (rows, n)
        grad_cost = plan * alpha.unsqueeze(-1) - h
        grad_cost[..., 0] = grad_cost[..., 0] + beta * gam
        grad_cost = grad_cost / eps / norm  # through the normalization (its max is a constant)
        # C_i0 = c_i^2, C_i1 = (c_i - 1)^2
        grad_c = grad_cost[..., 0] * 2 * c + grad_cost[..., 1] * 2 * (c - 1.0)
        return grad_c, None, None, None


def ot_topk_mask(x: torch.Tensor, k: int, *, epsilon: float = 0.1, max_iter: int = 200) -> torch.Tensor:
    """SOFT top-k membership of the rows of ``x`` (last dim), see the module docstring."""
    eps = check_positive(epsilon, "epsilon")
    it = check_int(max_iter, "max_iter", low=1)
    shape, n = x.shape, x.shape[-1]
    rows = x.reshape(-1, n)
    if rows.shape[0] == 0:
        return x * 0
    if k == n:  # the whole mass goes to the first point
        return torch.ones_like(x) + 0 * x
    out = _OTTopK.apply(-rows, k, eps, it)
    return out.reshape(shape)
