"""Perturbed ranks / top-k / Fenchel-Young loss: the Monte-Carlo forward is checked against exact
expectations (closed forms, enumeration, quadrature) with distribution-free confidence bounds, the
perturbation gradient estimator against finite differences of the exact expectation (batch means
and their standard error), plus reproducibility, degenerate inputs and argument errors."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import rankwise
from rankwise import (
    PerturbedFYLoss,
    PerturbedRank,
    PerturbedTopK,
    perturbed_fy_loss,
    perturbed_rank,
    perturbed_topk,
    soft_rank,
)

X = torch.tensor([[0.30, 0.42, -0.10, 0.35, 0.05], [1.00, -0.20, 0.15, 0.20, 0.90]], dtype=torch.float64)
SIGMA = 0.15
NOISES = ["gumbel", "normal"]


# ----------------------------------------------------------------------------------------------
# exact expectations (test file only)
# ----------------------------------------------------------------------------------------------
def pair_cdf(t: torch.Tensor, noise: str) -> torch.Tensor:
    """P(Z_j - Z_i < t) for i.i.d. Z: logistic for Gumbel noise, N(0, 2) for normal noise."""
    if noise == "gumbel":
        return torch.sigmoid(t)
    return 0.5 * (1 + torch.erf(t / 2.0))  # Phi(t / sqrt 2)


def exact_ranks(x: torch.Tensor, sigma: float, noise: str) -> torch.Tensor:
    """E[rank_i] = 1 + sum_{j != i} P(x_i + sigma Z_i > x_j + sigma Z_j)."""
    t = (x.unsqueeze(-1) - x.unsqueeze(-2)) / sigma  # [i, j] = (x_i - x_j) / sigma
    p = pair_cdf(t, noise)
    n = x.shape[-1]
    return 1 + p.sum(-1) - p.diagonal(dim1=-2, dim2=-1) * (n > 0)


def exact_topk_gumbel(x: torch.Tensor, k: int, sigma: float) -> torch.Tensor:
    """Gumbel top-k = the first k draws without replacement of Plackett-Luce(exp(x / sigma)), enumerated."""
    n = x.shape[-1]
    w = torch.exp((x - x.max(-1, keepdim=True).values) / sigma)
    total = w.sum(-1)
    out = torch.zeros_like(x)
    for seq in itertools.permutations(range(n), k):
        prob = torch.ones_like(total)
        rest = total
        for item in seq:
            prob = prob * w[..., item] / rest
            rest = rest - w[..., item]
        for item in seq:
            out[..., item] = out[..., item] + prob
    return out


def exact_topk_normal(x: torch.Tensor, k: int, sigma: float) -> torch.Tensor:
    """P(i in top-k) = int phi(z) P(#{j != i : x_j + sigma Z_j > x_i + sigma z} < k) dz (Poisson-binomial DP)."""
    z = torch.linspace(-9.0, 9.0, 2001, dtype=x.dtype)
    phi = torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    n = x.shape[-1]
    cols = []
    for i in range(n):
        counts = [torch.ones_like(x[..., :1] + z)] + [torch.zeros_like(x[..., :1] + z) for _ in range(n - 1)]
        for j in range(n):
            if j == i:
                continue
            q = 0.5 * (1 + torch.erf(((x[..., j : j + 1] - x[..., i : i + 1]) / sigma - z) / math.sqrt(2)))  # beats i
            counts = [counts[0] * (1 - q)] + [counts[c] * (1 - q) + counts[c - 1] * q for c in range(1, n)]
        p_in = sum(counts[:k])
        cols.append(torch.trapezoid(p_in * phi, z, dim=-1))
    return torch.stack(cols, -1)


def test_exact_references_agree_with_brute_force_sampling() -> None:
    # the references themselves, against plain sampling with torch's own RNG and sort
    g = torch.Generator().manual_seed(0)
    s = 200_000
    for noise in NOISES:
        if noise == "gumbel":
            z = -torch.log(-torch.log(torch.rand(s, *X.shape, generator=g, dtype=torch.float64)))
        else:
            z = torch.randn(s, *X.shape, generator=g, dtype=torch.float64)
        pert = X + SIGMA * z
        ranks = pert.argsort(-1).argsort(-1).double() + 1
        torch.testing.assert_close(ranks.mean(0), exact_ranks(X, SIGMA, noise), rtol=0, atol=0.02)
        top2 = torch.zeros_like(pert).scatter_(-1, pert.topk(2, -1).indices, 1.0)
        exact = exact_topk_gumbel(X, 2, SIGMA) if noise == "gumbel" else exact_topk_normal(X, 2, SIGMA)
        torch.testing.assert_close(top2.mean(0), exact, rtol=0, atol=0.01)


def test_exact_reference_gradients_match_finite_differences() -> None:
    for fn in (
        lambda t: exact_ranks(t, SIGMA, "gumbel"),
        lambda t: exact_ranks(t, SIGMA, "normal"),
        lambda t: exact_topk_gumbel(t, 2, SIGMA),
        lambda t: exact_topk_normal(t, 2, SIGMA),
    ):
        assert torch.autograd.gradcheck(fn, (X.clone().requires_grad_(),), eps=1e-6, atol=1e-5, fast_mode=True)


# ----------------------------------------------------------------------------------------------
# forward: unbiased (distribution-free bound: Var(rank) <= (n-1)^2/4, Var(indicator) <= 1/4)
# ----------------------------------------------------------------------------------------------
S_FWD = 40_000


@pytest.mark.parametrize("noise", NOISES)
@pytest.mark.parametrize("descending", [False, True])
def test_rank_forward_is_unbiased(noise: str, descending: bool) -> None:
    n = X.shape[-1]
    g = torch.Generator().manual_seed(1)
    est = perturbed_rank(X, sigma=SIGMA, n_samples=S_FWD, noise=noise, descending=descending, generator=g)  # type: ignore[arg-type]
    exact = exact_ranks(X, SIGMA, noise)
    if descending:
        exact = n + 1 - exact
    bound = 5 * (n - 1) / 2 / math.sqrt(S_FWD)  # 5 standard deviations at the worst variance
    assert (est - exact).abs().max() < bound
    # the bound is tight enough to see a wrong sigma
    wrong = exact_ranks(X, 2 * SIGMA, noise)
    assert ((n + 1 - wrong if descending else wrong) - exact).abs().max() > 3 * bound
    torch.testing.assert_close(est.sum(-1), torch.full((2,), n * (n + 1) / 2, dtype=torch.float64))


@pytest.mark.parametrize("noise", NOISES)
@pytest.mark.parametrize("k", [1, 2, 4])
def test_topk_forward_is_unbiased(noise: str, k: int) -> None:
    g = torch.Generator().manual_seed(2)
    est = perturbed_topk(X, k, sigma=SIGMA, n_samples=S_FWD, noise=noise, generator=g)  # type: ignore[arg-type]
    exact = exact_topk_gumbel(X, k, SIGMA) if noise == "gumbel" else exact_topk_normal(X, k, SIGMA)
    assert (est - exact).abs().max() < 5 * 0.5 / math.sqrt(S_FWD)
    torch.testing.assert_close(est.sum(-1), torch.full((2,), float(k), dtype=torch.float64))
    if noise == "gumbel" and k == 1:  # Gumbel-max: softmax(x / sigma)
        torch.testing.assert_close(exact, torch.softmax(X / SIGMA, -1))


# ----------------------------------------------------------------------------------------------
# backward: the estimator is unbiased for the Jacobian of the expectation
# ----------------------------------------------------------------------------------------------
def _estimator_batches(fn, g: torch.Tensor, batches: int, samples: int) -> torch.Tensor:  # type: ignore[no-untyped-def]
    out = []
    for b in range(batches):
        x = X.clone().requires_grad_()
        y = fn(x, torch.Generator().manual_seed(100 + b), samples)
        (y * g).sum().backward()
        assert x.grad is not None
        out.append(x.grad)
    return torch.stack(out)


def _finite_difference_vjp(expect, g: torch.Tensor, h: float = 1e-5) -> torch.Tensor:  # type: ignore[no-untyped-def]
    fd = torch.zeros_like(X)
    for idx in itertools.product(*(range(s) for s in X.shape)):
        e = torch.zeros_like(X)
        e[idx] = h
        fd[idx] = ((expect(X + e) - expect(X - e)) * g).sum() / (2 * h)
    return fd


CASES = {
    "rank": (
        lambda noise: lambda x, gen, s: perturbed_rank(x, sigma=SIGMA, n_samples=s, noise=noise, generator=gen),
        lambda noise: lambda x: exact_ranks(x, SIGMA, noise),
    ),
    "rank_desc": (
        lambda noise: (
            lambda x, gen, s: perturbed_rank(x, sigma=SIGMA, n_samples=s, noise=noise, descending=True, generator=gen)
        ),
        lambda noise: lambda x: x.shape[-1] + 1 - exact_ranks(x, SIGMA, noise),
    ),
    "top2": (
        lambda noise: lambda x, gen, s: perturbed_topk(x, 2, sigma=SIGMA, n_samples=s, noise=noise, generator=gen),
        lambda noise: lambda x: exact_topk_gumbel(x, 2, SIGMA) if noise == "gumbel" else exact_topk_normal(x, 2, SIGMA),
    ),
}


@pytest.mark.parametrize("noise", NOISES)
@pytest.mark.parametrize("case", list(CASES))
def test_gradient_estimator_matches_finite_differences_of_the_expectation(case: str, noise: str) -> None:
    make_fn, make_expect = CASES[case]
    g = torch.randn(2, 5, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    grads = _estimator_batches(make_fn(noise), g, batches=20, samples=20_000)
    mean, se = grads.mean(0), grads.std(0) / math.sqrt(grads.shape[0])
    fd = _finite_difference_vjp(make_expect(noise), g)
    # t with 19 degrees of freedom: |t| > 5 has probability ~1e-4 per entry
    assert ((mean - fd).abs() <= 5 * se + 1e-3).all(), (mean - fd) / se
    # and the test has power: the standard error is small against the gradient
    assert (5 * se).max() < 0.2 * fd.abs().max()


def test_backward_is_the_paper_estimator_written_out() -> None:
    # one explicit loop over samples with the same noise draws
    x = X.clone().requires_grad_()
    w = torch.randn(2, 5, dtype=torch.float64)
    for noise in NOISES:
        gen = torch.Generator().manual_seed(3)
        y = perturbed_rank(x, sigma=SIGMA, n_samples=7, noise=noise, generator=gen)  # type: ignore[arg-type]
        (gx,) = torch.autograd.grad((y * w).sum(), x)
        gen = torch.Generator().manual_seed(3)
        if noise == "gumbel":
            u = torch.rand((7, 2, 5), generator=gen, dtype=torch.float64)
            z = -torch.log(-torch.log(u.clamp_min(torch.finfo(torch.float64).tiny)))
            nabla = 1 - torch.exp(-z)
        else:
            z = torch.randn((7, 2, 5), generator=gen, dtype=torch.float64)
            nabla = z
        ref = torch.zeros_like(X)
        mean = torch.zeros_like(X)
        wc = w - w.mean(-1, keepdim=True)  # the centred cotangent (ranks sum to a constant)
        for s in range(7):
            ranks = (X + SIGMA * z[s]).argsort(-1).argsort(-1).double() + 1
            mean += ranks / 7
            ref += (ranks * wc).sum(-1, keepdim=True) * nabla[s] / (7 * SIGMA)
        torch.testing.assert_close(y.detach(), mean)
        torch.testing.assert_close(gx, ref)


def test_centred_cotangent_has_the_same_mean_and_less_variance() -> None:
    # rankwise's backward applies the estimator to g - mean(g); the authors' applies it to g. Both are
    # unbiased for the exact vector-Jacobian product (Gumbel noise: closed-form expected ranks), and
    # with a cotangent far from zero mean the centred one has a much smaller variance.
    g = torch.randn(2, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64) + 3.0
    reps, samples = 400, 50
    x = X.clone().requires_grad_()
    (exact,) = torch.autograd.grad((exact_ranks(x, SIGMA, "gumbel") * g).sum(), x)

    xs = X.expand(reps, 2, 5).clone().requires_grad_()  # independent estimates along the leading dim
    ranks = perturbed_rank(xs, sigma=SIGMA, n_samples=samples, generator=torch.Generator().manual_seed(2))
    (ranks * g).sum().backward()
    ours = xs.grad
    assert ours is not None

    u = torch.rand((reps, samples, 2, 5), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    z = -torch.log(-torch.log(u))
    r = (X + SIGMA * z).argsort(-1).argsort(-1).double() + 1
    plain = ((r * g).sum(-1, keepdim=True) * (1 - torch.exp(-z)) / SIGMA).mean(1)  # the authors' estimator

    for est in (ours, plain):
        se = est.std(0) / math.sqrt(reps)
        assert ((est.mean(0) - exact).abs() <= 5 * se).all()
    assert (ours.var(0) < 0.5 * plain.var(0)).all()


# ----------------------------------------------------------------------------------------------
# Fenchel-Young loss
# ----------------------------------------------------------------------------------------------
TARGET = torch.tensor([[2.0, 5.0, 1.0, 4.0, 3.0], [5.0, 1.0, 2.0, 3.0, 4.0]], dtype=torch.float64)


@pytest.mark.parametrize("noise", NOISES)
@pytest.mark.parametrize("descending", [False, True])
def test_fy_gradient_is_perturbed_ranks_minus_target(noise: str, descending: bool) -> None:
    x = X.clone().requires_grad_()
    target = TARGET if not descending else 6 - TARGET
    kw = {"sigma": SIGMA, "n_samples": 50, "noise": noise, "descending": descending}
    loss = perturbed_fy_loss(x, target, reduction="sum", generator=torch.Generator().manual_seed(4), **kw)  # type: ignore[arg-type]
    loss.backward()
    ranks = perturbed_rank(X, generator=torch.Generator().manual_seed(4), **kw)  # type: ignore[arg-type]
    sign = -1.0 if descending else 1.0
    assert x.grad is not None
    torch.testing.assert_close(x.grad, sign * (ranks - target))
    assert loss.item() >= 0


def test_fy_value_written_out_and_properties() -> None:
    gen = torch.Generator().manual_seed(5)
    per_row = perturbed_fy_loss(X, TARGET, sigma=SIGMA, n_samples=9, reduction="none", generator=gen)
    gen = torch.Generator().manual_seed(5)
    u = torch.rand((9, 2, 5), generator=gen, dtype=torch.float64)
    z = -torch.log(-torch.log(u.clamp_min(torch.finfo(torch.float64).tiny)))
    ref = torch.zeros(2, dtype=torch.float64)
    for s in range(9):
        pert = X + SIGMA * z[s]
        ranks = pert.argsort(-1).argsort(-1).double() + 1
        ref += ((ranks - TARGET) * pert).sum(-1) / 9
    torch.testing.assert_close(per_row, ref)
    assert (per_row >= 0).all()
    # zero when the target is the ranking every perturbed sample agrees with
    sep = torch.tensor([[0.0, 3.0, 1.0, 2.0]], dtype=torch.float64)
    zero = perturbed_fy_loss(sep, rankwise.rank(sep), sigma=1e-3, n_samples=20)
    assert zero.item() == 0.0
    m = perturbed_fy_loss(X, TARGET, sigma=SIGMA, generator=torch.Generator().manual_seed(1))
    s_ = perturbed_fy_loss(X, TARGET, sigma=SIGMA, reduction="sum", generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(m * 2, s_)


def test_fy_gradcheck_at_fixed_noise() -> None:
    def f(t: torch.Tensor) -> torch.Tensor:
        return perturbed_fy_loss(t, TARGET, sigma=SIGMA, n_samples=5, generator=torch.Generator().manual_seed(6))

    assert torch.autograd.gradcheck(f, (X.clone().requires_grad_(),), eps=1e-6, atol=1e-6)


def test_fy_training_recovers_the_target_order() -> None:
    torch.manual_seed(0)
    theta = torch.zeros(1, 6, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([[3.0, 6.0, 1.0, 5.0, 2.0, 4.0]], dtype=torch.float64)
    opt = torch.optim.SGD([theta], lr=0.1)
    for _ in range(200):
        opt.zero_grad()
        perturbed_fy_loss(theta, target, sigma=0.5, n_samples=16).backward()
        opt.step()
    assert torch.equal(rankwise.rank(theta.detach()), target)


# ----------------------------------------------------------------------------------------------
# reproducibility, soft_rank dispatch, modules, degenerate inputs, dtypes, errors
# ----------------------------------------------------------------------------------------------
def test_generator_reproducibility_and_global_rng() -> None:
    a = perturbed_rank(X, n_samples=5, generator=torch.Generator().manual_seed(9))
    b = perturbed_rank(X, n_samples=5, generator=torch.Generator().manual_seed(9))
    c = perturbed_rank(X, n_samples=5, generator=torch.Generator().manual_seed(10))
    assert torch.equal(a, b) and not torch.equal(a, c)
    torch.manual_seed(3)
    d = perturbed_topk(X, 2, n_samples=5)
    torch.manual_seed(3)
    assert torch.equal(d, perturbed_topk(X, 2, n_samples=5))


def test_soft_rank_method_and_modules() -> None:
    kw = {"sigma": 0.2, "n_samples": 11, "noise": "normal"}
    r = soft_rank(X, method="perturbed", descending=True, generator=torch.Generator().manual_seed(1), **kw)
    r2 = perturbed_rank(X, descending=True, generator=torch.Generator().manual_seed(1), **kw)  # type: ignore[arg-type]
    torch.testing.assert_close(r, r2)
    torch.testing.assert_close(
        PerturbedRank(generator=torch.Generator().manual_seed(2), **kw)(X),  # type: ignore[arg-type]
        perturbed_rank(X, generator=torch.Generator().manual_seed(2), **kw),  # type: ignore[arg-type]
    )
    torch.testing.assert_close(
        PerturbedTopK(3, dim=0, generator=torch.Generator().manual_seed(2))(X.T),
        perturbed_topk(X.T, 3, dim=0, generator=torch.Generator().manual_seed(2)),
    )
    torch.testing.assert_close(
        PerturbedFYLoss(reduction="none", generator=torch.Generator().manual_seed(2))(X, TARGET),
        perturbed_fy_loss(X, TARGET, reduction="none", generator=torch.Generator().manual_seed(2)),
    )
    assert "n_samples=100" in repr(PerturbedRank()) and "k=2" in repr(PerturbedTopK(2))


def test_dim_and_leading_dims() -> None:
    x = torch.randn(3, 5, 4, dtype=torch.float64)
    a = perturbed_rank(x, dim=1, n_samples=6, generator=torch.Generator().manual_seed(0))
    b = perturbed_rank(x.movedim(1, -1), n_samples=6, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(a, b.movedim(-1, 1))
    assert perturbed_fy_loss(x, torch.ones_like(x), dim=1, reduction="none").shape == (3, 4)


def test_degenerate() -> None:
    e = torch.zeros(3, 0, requires_grad=True)
    assert perturbed_rank(e).shape == (3, 0)
    loss = perturbed_fy_loss(torch.zeros(0, 4, requires_grad=True), torch.zeros(0, 4))
    assert loss.item() == 0.0 and loss.requires_grad
    one = torch.tensor([[0.5]], requires_grad=True)
    assert perturbed_rank(one).tolist() == [[1.0]]
    assert perturbed_topk(one, 1).tolist() == [[1.0]]
    assert perturbed_fy_loss(one, torch.ones(1, 1)).item() == 0.0
    ties = torch.full((2, 6), 0.3, dtype=torch.float64)
    r = perturbed_rank(ties, n_samples=S_FWD, generator=torch.Generator().manual_seed(0))
    assert (r - 3.5).abs().max() < 5 * 2.5 / math.sqrt(S_FWD)


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_half_precision(half: torch.dtype) -> None:
    # docs/conventions.md: ranks of half inputs are float32, probabilities keep the dtype, losses
    # are returned in the compute dtype
    x = X.to(half).requires_grad_()
    y = perturbed_rank(x, n_samples=10)
    assert y.dtype == torch.float32
    (y * torch.rand(2, 5)).sum().backward()
    assert x.grad is not None and x.grad.dtype == half and torch.isfinite(x.grad).all()
    assert perturbed_topk(x, 2).dtype == half
    assert perturbed_fy_loss(x, TARGET.to(half)).dtype == torch.float32
    assert perturbed_fy_loss(x, TARGET).dtype == torch.float64  # promoted, never cast to x's dtype


def test_non_finite_slices_are_nan() -> None:
    x = X.clone()
    x[0, 2] = float("nan")
    r = perturbed_rank(x, n_samples=5)
    assert torch.isnan(r[0]).all() and torch.isfinite(r[1]).all()
    x[0, 2] = float("inf")
    assert torch.isnan(perturbed_topk(x, 2)[0]).all()
    per_row = perturbed_fy_loss(x, TARGET, reduction="none")
    assert torch.isnan(per_row[0]) and torch.isfinite(per_row[1])
    t = TARGET.clone()
    t[1, 0] = float("nan")
    assert torch.isnan(perturbed_fy_loss(X, t, reduction="none")[1])
    with pytest.raises(ValueError, match=r"`target_ranks` must be on the device of `x` \(cpu\), got meta"):
        perturbed_fy_loss(X, TARGET.to("meta"))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"`sigma` must be finite and > 0, got 0"):
        perturbed_rank(X, sigma=0)
    with pytest.raises(ValueError, match=r"`n_samples` must be >= 1, got 0"):
        perturbed_rank(X, n_samples=0)
    with pytest.raises(ValueError, match=r"`noise` must be one of 'gumbel', 'normal'; got 'uniform'"):
        perturbed_topk(X, 2, noise="uniform")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`k` must be in \[1, 5\]"):
        perturbed_topk(X, 6)
    with pytest.raises(ValueError, match=r"`target_ranks` must have the shape of `x` \(2, 5\), got \(2, 4\)"):
        perturbed_fy_loss(X, TARGET[:, :4])
    with pytest.raises(ValueError, match=r"`reduction` must be one of 'mean', 'sum', 'none'; got 'avg'"):
        perturbed_fy_loss(X, TARGET, reduction="avg")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"`generator` must be a torch.Generator or None, got int"):
        perturbed_rank(X, generator=0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"`x` must be a floating-point tensor"):
        perturbed_rank(torch.arange(3))
