"""Tests of the optimal-transport soft sort / rank (Cuturi, Teboul & Vert, NeurIPS 2019)."""

from __future__ import annotations

import functools
import math
import warnings

import pytest
import torch

import rankwise
from rankwise.ops import sinkhorn as sk
from tests.conftest import DEVICES, gradcheck
from tests.registry_examples import case_entry, factories


# --------------------------------------------------------------------------------------------------
# independent slow reference, written from the paper's formulas: probability-domain Sinkhorn
# (u = a / K v, v = b / K^T u) in float64, iterated until the marginals hold to 1e-13; its autograd
# gradients are those of the unrolled iterations
# --------------------------------------------------------------------------------------------------
def ref_plan(x: torch.Tensor, eps: float, p: float = 2.0, m: int | None = None, descending: bool = False):
    x = x.double()
    n = x.shape[-1]
    m = n if m is None else m
    mu = x.mean(-1, keepdim=True)
    std = torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True)).clamp_min(1e-6)  # population std
    xs = torch.sigmoid((x - mu) / (std * math.sqrt(3.0) / math.pi))
    y = torch.tensor([j / max(1, m - 1) for j in range(m)], dtype=torch.float64)
    if descending:
        y = y.flip(0)
    kernel = torch.exp(-((xs.unsqueeze(-1) - y).abs() ** p) / eps)
    a, b = 1.0 / n, 1.0 / m
    v = torch.ones(*x.shape[:-1], m, dtype=torch.float64)
    for it in range(200_000):
        u = a / (kernel @ v.unsqueeze(-1)).squeeze(-1)
        v = b / (kernel.mT @ u.unsqueeze(-1)).squeeze(-1)
        if it % 50 == 0:
            u = a / (kernel @ v.unsqueeze(-1)).squeeze(-1)
            plan = u.unsqueeze(-1) * kernel * v.unsqueeze(-2)
            if float((plan.detach().sum(-2) / b - 1).abs().max()) < 1e-13:
                return plan
    raise AssertionError("reference did not converge")


def ref_rank(x: torch.Tensor, eps: float, **kw) -> torch.Tensor:
    plan = ref_plan(x, eps, **kw)
    n, m = plan.shape[-2:]
    cdf = (plan @ (torch.arange(1, m + 1, dtype=torch.float64) / m)) * n  # P cumsum(b) / a
    return cdf * n


def ref_sort(x: torch.Tensor, eps: float, **kw) -> torch.Tensor:
    plan = ref_plan(x, eps, **kw)
    return (plan.mT @ x.double().unsqueeze(-1)).squeeze(-1) * plan.shape[-1]  # P^T x / b


def _unrolled_log_plan(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, int]:
    """The authors' iteration (log-domain sweeps, epsilon decaying from 0.1 by 0.95 per sweep) run until
    the marginals hold to 1e-13, differentiated by autograd through every sweep; returns the plan and the
    number of sweeps."""
    n = x.shape[-1]
    cost = sk._cost(sk._squash(x)[0], sk._targets(n, False, x), 2.0)
    g = torch.zeros(x.shape[0], n, dtype=x.dtype)
    e = 0.1
    for it in range(1, 20_000):
        g = sk._sweep(g, cost, e)
        e = max(e * 0.95, eps)
        if it % 100 == 0 and float(sk._col_error(sk._log_plan(g.detach(), cost.detach(), eps)).max()) < 1e-13:
            return sk._log_plan(g, cost, eps).exp(), it
    raise AssertionError("unrolled sweeps did not converge")


CASES = [  # (epsilon, p, num_targets, descending)
    (0.5, 2.0, None, False),
    (0.1, 2.0, None, True),
    (0.1, 1.0, 4, True),
    (0.05, 1.5, 10, False),
    (0.03, 2.0, None, False),
    (0.01, 2.0, 5, False),
]


# --------------------------------------------------------------------------------------------------
# parity with the reference: values and gradients
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("eps", "p", "m", "descending"), CASES)
def test_matches_reference_values_and_gradients(eps: float, p: float, m: int | None, descending: bool) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 7, generator=g, dtype=torch.float64)
    kw = {"epsilon": eps, "p": p, "num_targets": m, "descending": descending}
    rkw = {"p": p, "m": m, "descending": descending}
    pairs = [
        (rankwise.sinkhorn_transport, ref_plan),
        (rankwise.soft_rank_sinkhorn, ref_rank),
        (rankwise.soft_sort_sinkhorn, ref_sort),
    ]
    for fn, ref in pairs:
        xa = x.clone().requires_grad_()
        xb = x.clone().requires_grad_()
        got, want = fn(xa, **kw), ref(xb, eps, **rkw)
        assert got.shape == want.shape
        assert (got - want).abs().max() < 1e-10
        w = torch.randn(got.shape, generator=g, dtype=torch.float64)
        (ga,) = torch.autograd.grad((got * w).sum(), xa)
        (gb,) = torch.autograd.grad((want * w).sum(), xb)
        assert (ga - gb).abs().max() < 1e-8 * max(1.0, float(gb.abs().max()))


def test_implicit_gradient_matches_unrolled_log_domain_at_small_epsilon() -> None:
    """At epsilon = 5e-3 (where the probability-domain kernel nearly underflows) against unrolled sweeps."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 16, generator=g, dtype=torch.float64)
    w = torch.randn(2, 16, 16, generator=g, dtype=torch.float64)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, info = rankwise.sinkhorn_transport(xa, epsilon=5e-3, return_info=True)
    want, sweeps = _unrolled_log_plan(xb, 5e-3)
    assert sweeps >= 1000  # the authors' iteration needs ~1,500 sweeps here; the solver ~70 and a few Newton steps
    assert info.newton_steps <= 5 and info.sweeps < 100
    assert (got - want).abs().max() < 1e-10
    (ga,) = torch.autograd.grad((got * w).sum(), xa)
    (gb,) = torch.autograd.grad((want * w).sum(), xb)
    assert (ga - gb).abs().max() < 1e-6 * float(gb.abs().max())


@pytest.mark.parametrize(
    "kw",
    [{"epsilon": 0.1}, {"epsilon": 0.01, "descending": True}, {"epsilon": 0.05, "num_targets": 4}, {"epsilon": 1e-3}],
)
def test_gradcheck(kw: dict) -> None:
    x = torch.randn(2, 5, dtype=torch.float64)
    fns = [rankwise.soft_rank_sinkhorn, rankwise.soft_sort_sinkhorn]
    if kw["epsilon"] == 0.05:
        fns.append(rankwise.sinkhorn_transport)
    for fn in fns:
        assert gradcheck(lambda t, fn=fn: fn(t, **kw), x)


def test_gradcheck_dim0_leading_dims() -> None:
    x = torch.randn(4, 2, 2, dtype=torch.float64)
    assert gradcheck(lambda t: rankwise.soft_rank_sinkhorn(t, epsilon=0.1, dim=0), x)
    assert gradcheck(lambda t: rankwise.soft_sort_sinkhorn(t, epsilon=0.1, dim=0, num_targets=3), x)


def test_float32_agrees_with_float64() -> None:
    x = torch.randn(8, 32, dtype=torch.float64)
    w = torch.randn(8, 32, dtype=torch.float64)
    for fn in (rankwise.soft_rank_sinkhorn, rankwise.soft_sort_sinkhorn):
        x64, x32 = x.clone().requires_grad_(), x.float().requires_grad_()
        o64, o32 = fn(x64, epsilon=1e-2), fn(x32, epsilon=1e-2)
        assert o32.dtype == torch.float32
        (g64,) = torch.autograd.grad((o64 * w).sum(), x64)
        (g32,) = torch.autograd.grad((o32 * w.float()).sum(), x32)
        assert (o32.double() - o64).abs().max().item() < 1e-4 * float(o64.detach().abs().max())
        assert (g32.double() - g64).abs().max() < 1e-4 * float(g64.abs().max())


# --------------------------------------------------------------------------------------------------
# convergence and stability
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("eps", [0.1, 1e-2, 1e-3, 1e-4])
@pytest.mark.parametrize("n", [16, 32])
def test_solver_converges_in_few_newton_steps(eps: float, n: int) -> None:
    x = torch.randn(16, n, dtype=torch.float64)
    cost = sk._cost(sk._squash(x)[0], sk._targets(n, False, x), 2.0)
    g, _, info = sk._solve(cost, eps, 1e-10, 50, False)
    assert info.converged and info.error <= 1e-10
    assert info.newton_steps <= 8
    assert info.sweeps == (6 if eps >= 0.1 else 1 + math.ceil(math.log(eps / 0.1) / math.log(0.95)) + 5)
    plan = sk._log_plan(g, cost, eps).exp()
    torch.testing.assert_close(plan.sum(-1), torch.full((16, n), 1 / n, dtype=torch.float64), rtol=1e-12, atol=0)
    torch.testing.assert_close(plan.sum(-2), torch.full((16, n), 1 / n, dtype=torch.float64), rtol=1e-10, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("eps", [0.1, 1e-2, 1e-3])
def test_fixed_budget_solve_equals_the_early_stopping_loop(eps: float, dtype: torch.dtype) -> None:
    """The solve without host reads (under torch.compile and on CUDA) gives the plan of the CPU eager
    loop to its tolerance, and a marginal error within it."""
    x = torch.randn(8, 24, generator=torch.Generator().manual_seed(3), dtype=torch.float64).to(dtype)
    cost = sk._cost(sk._squash(x)[0], sk._targets(24, False, x), 2.0)
    tol = sk._default_tol(dtype, eps)[0]
    g_loop, err_loop, info = sk._solve(cost, eps, tol, 50, False)
    g_fixed, err_fixed, fixed_info = sk._solve(cost, eps, tol, 50, True)
    assert info.converged and fixed_info.newton_steps == sk._COMPILED_NEWTON_STEPS
    assert float(err_fixed.max()) <= max(tol, float(err_loop.max())) * 10
    p_loop, p_fixed = (sk._log_plan(g, cost, eps).exp() for g in (g_loop, g_fixed))
    atol = 1e-12 if dtype == torch.float64 else 1e-6
    torch.testing.assert_close(p_fixed, p_loop, rtol=0, atol=atol)


def test_plan_is_the_converged_one_where_the_authors_stopping_rule_is_not() -> None:
    """The authors' default rule (relative error 1e-2) stops far from the plan at epsilon = 1e-2."""
    x = torch.randn(4, 32, dtype=torch.float64)
    want = ref_plan(x, 1e-2)
    got, info = rankwise.sinkhorn_transport(x, epsilon=1e-2, return_info=True)
    assert (got - want).abs().max() < 1e-12
    assert info.error < 1e-10 and info.converged


@pytest.mark.parametrize("device", DEVICES, ids=lambda d: d.type)
def test_float32_stable_at_epsilon_1e_3(device: torch.device) -> None:
    gen = torch.Generator().manual_seed(3)
    xs = [
        torch.randn(64, 32, generator=gen),
        torch.randn(2, 128, generator=gen) * 1e4,
        torch.randn(16, 7, generator=gen) * 1e-3 + 5.0,
        torch.randint(0, 3, (16, 24), generator=gen).float(),  # many exact ties
        torch.cat([torch.zeros(4, 10), torch.full((4, 1), 1e-5)], dim=-1),  # one outlier
        torch.randn(4, 2, generator=gen),
    ]
    for x in xs:
        for fn in (rankwise.soft_rank_sinkhorn, rankwise.soft_sort_sinkhorn, rankwise.sinkhorn_transport):
            xi = x.to(device).requires_grad_()
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # converges to the default float32 tolerance: no warning
                out = fn(xi, epsilon=1e-3)
            assert out.dtype == torch.float32 and torch.isfinite(out).all()
            (out * torch.randn_like(out)).sum().backward()
            assert xi.grad is not None and torch.isfinite(xi.grad).all()


def test_float32_offset_and_scale_inputs_match_float64() -> None:
    """Inputs with a large offset relative to their spread, or of extreme magnitude, lose no accuracy in
    float32: the squashing standardizes exact differences, and the soft sort's offset term carries no
    derivative (the column sums of the converged plan are constant)."""
    gen = torch.Generator().manual_seed(5)
    for x in (
        torch.randn(8, 5, generator=gen) * 1e-4 + 3.0,
        1.0 + torch.randn(8, 16, generator=gen) * 1e-5,
        torch.randn(4, 6, generator=gen) * 1e30,
        torch.randn(4, 6, generator=gen) * 1e-30,
    ):
        w = torch.randn(x.shape, generator=gen, dtype=torch.float64)
        for fn in (rankwise.soft_rank_sinkhorn, rankwise.soft_sort_sinkhorn):
            x32, x64 = x.clone().requires_grad_(), x.double().requires_grad_()
            o32, o64 = fn(x32, epsilon=1e-3), fn(x64, epsilon=1e-3)
            (g32,) = torch.autograd.grad((o32 * w.float()).sum(), x32)
            (g64,) = torch.autograd.grad((o64 * w).sum(), x64)
            assert torch.isfinite(o32).all() and torch.isfinite(g32).all()
            assert float((o32.double() - o64).detach().abs().max()) <= 1e-3 * float(o64.detach().abs().max())
            assert float((g32.double() - g64).abs().max()) <= 1e-2 * float(g64.abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("spread", [True, False], ids=["separated", "gaussian"])
def test_tends_to_hard_sort_and_rank(dtype: torch.dtype, spread: bool) -> None:
    gen = torch.Generator().manual_seed(4)
    if spread:  # shuffled 0..11 plus noise: squashed values at least ~0.03 apart
        x = torch.stack([torch.randperm(12, generator=gen) for _ in range(6)]).double()
        x = x + 0.1 * torch.rand(6, 12, generator=gen, dtype=torch.float64)
    else:  # gaussian draws: some squashed values nearly tie, so the limit is reached at smaller epsilon
        x = torch.randn(6, 12, generator=gen, dtype=torch.float64)
    x = x.to(dtype)
    hard_rank = rankwise.rank(x).double()
    hard_sort = torch.sort(x, dim=-1).values.double()
    rank_err, sort_err = [], []
    epsilons = (1e-1, 1e-2, 1e-3, 1e-4)
    if not spread and dtype == torch.float64:  # (float32's floor is 6.1e-5: see epsilon_floor)
        epsilons += (1e-5, 1e-6)
    for eps in epsilons:
        rank_err.append(float((rankwise.soft_rank_sinkhorn(x, epsilon=eps).double() - hard_rank).abs().max()))
        sort_err.append(float((rankwise.soft_sort_sinkhorn(x, epsilon=eps).double() - hard_sort).abs().max()))
    assert rank_err == sorted(rank_err, reverse=True) and sort_err == sorted(sort_err, reverse=True)
    limit = 1e-3
    if dtype == torch.float32 and not spread:
        # near-ties closer than float32's epsilon floor stay soft: the float32 result is the float64 one there
        r64 = rankwise.soft_rank_sinkhorn(x.double(), epsilon=epsilons[-1])
        assert float((rankwise.soft_rank_sinkhorn(x, epsilon=epsilons[-1]).double() - r64).abs().max()) < 1e-3
        limit = 0.5
    assert rank_err[0] > 0.1 and rank_err[-1] < limit and sort_err[-1] < limit
    plan = rankwise.sinkhorn_transport(x, epsilon=epsilons[-1]).double() * 12
    perm = torch.zeros(6, 12, 12, dtype=torch.float64).scatter(-1, (hard_rank.long() - 1).unsqueeze(-1), 1.0)
    assert (plan - perm).abs().max() < limit


def test_ties_average_in_the_limit() -> None:
    x = torch.tensor([[3.0, 1.0, 3.0, 2.0]], dtype=torch.float64)
    torch.testing.assert_close(
        rankwise.soft_rank_sinkhorn(x, epsilon=1e-4), torch.tensor([[3.5, 1.0, 3.5, 2.0]]).double()
    )


# --------------------------------------------------------------------------------------------------
# conventions
# --------------------------------------------------------------------------------------------------
def test_conventions() -> None:
    x = torch.randn(5, 9, dtype=torch.float64)
    # ascending ranks 1..n, descending = reversed; soft ranks lie in [n/m, n]
    r = rankwise.soft_rank_sinkhorn(x, epsilon=0.05)
    rd = rankwise.soft_rank_sinkhorn(x, epsilon=0.05, descending=True)
    torch.testing.assert_close(r + rd, torch.full_like(r, 10.0))
    rq = rankwise.soft_rank_sinkhorn(x, epsilon=0.05, num_targets=3)
    assert rq.min() >= 3.0 - 1e-12 and rq.max() <= 9.0 + 1e-12
    torch.testing.assert_close(r.sum(-1), torch.full((5,), 45.0, dtype=torch.float64))
    # the soft sort is sorted, keeps the mean, and reverses when descending
    s = rankwise.soft_sort_sinkhorn(x, epsilon=0.05)
    assert (s.diff(dim=-1) > 0).all()
    torch.testing.assert_close(s.mean(-1), x.mean(-1))
    torch.testing.assert_close(rankwise.soft_sort_sinkhorn(x, epsilon=0.05, descending=True), s.flip(-1))
    # squashing makes the operator invariant to shifting and positive scaling of x
    torch.testing.assert_close(rankwise.soft_rank_sinkhorn(3.0 * x - 7.0, epsilon=0.05), r)
    torch.testing.assert_close(rankwise.soft_sort_sinkhorn(3.0 * x - 7.0, epsilon=0.05), 3.0 * s - 7.0)
    # the plan is doubly stochastic with weights 1/n and 1/m
    plan = rankwise.sinkhorn_transport(x, epsilon=0.05, num_targets=4)
    torch.testing.assert_close(plan.sum(-1), torch.full((5, 9), 1 / 9, dtype=torch.float64))
    torch.testing.assert_close(plan.sum(-2), torch.full((5, 4), 1 / 4, dtype=torch.float64))


@pytest.mark.parametrize("device", DEVICES, ids=lambda d: d.type)
def test_degenerate(device: torch.device) -> None:
    # all ties: every input squashes to 1/2, P = a b^T, rank n (m + 1) / (2 m), sort = x
    x = torch.full((2, 5), 0.7, device=device, requires_grad=True)
    for m in (None, 3):
        torch.testing.assert_close(
            rankwise.soft_rank_sinkhorn(x, num_targets=m),
            torch.full((2, 5), 5 * ((m or 5) + 1) / (2 * (m or 5)), device=device),
        )
        out = rankwise.soft_sort_sinkhorn(x, num_targets=m)
        torch.testing.assert_close(out, torch.full((2, m or 5), 0.7, device=device))
        out.sum().backward()
        assert torch.isfinite(x.grad).all()
    # n = 1
    one = torch.tensor([[2.5]], device=device, requires_grad=True)
    torch.testing.assert_close(rankwise.soft_rank_sinkhorn(one), torch.ones(1, 1, device=device))
    torch.testing.assert_close(rankwise.soft_sort_sinkhorn(one, num_targets=3), torch.full((1, 3), 2.5, device=device))
    # empty
    for shape in [(0,), (3, 0), (0, 4)]:
        e = torch.zeros(shape, device=device, requires_grad=True)
        assert rankwise.soft_rank_sinkhorn(e).shape == shape
        assert rankwise.soft_sort_sinkhorn(e).shape == shape
        assert rankwise.sinkhorn_transport(e).shape == (*shape[:-1], shape[-1], shape[-1])
        rankwise.soft_rank_sinkhorn(e).sum().backward()
    assert rankwise.soft_sort_sinkhorn(torch.zeros(0, 4, device=device), num_targets=2).shape == (0, 2)


def test_nan_rows_stay_local() -> None:
    x = torch.randn(3, 6, dtype=torch.float64)
    x[1, 2] = float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = rankwise.soft_rank_sinkhorn(x, epsilon=0.05)
    assert torch.isnan(out[1]).all() and torch.isfinite(out[[0, 2]]).all()
    torch.testing.assert_close(out[[0, 2]], rankwise.soft_rank_sinkhorn(x[[0, 2]], epsilon=0.05))


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_precision_computed_in_float32(half: torch.dtype) -> None:
    x = torch.randn(3, 8)
    for fn in (rankwise.soft_rank_sinkhorn, rankwise.soft_sort_sinkhorn):
        got = fn(x.to(half), epsilon=0.05)
        # soft ranks reach n: float32 for half input (docs/conventions.md); soft sorts keep the dtype
        want_dtype = torch.float32 if fn is rankwise.soft_rank_sinkhorn else half
        assert got.dtype == want_dtype
        torch.testing.assert_close(got, fn(x.to(half).float(), epsilon=0.05).to(want_dtype))


def test_leading_dims_and_dim() -> None:
    x = torch.randn(4, 6, 3, dtype=torch.float64)
    for fn in (rankwise.soft_rank_sinkhorn, rankwise.soft_sort_sinkhorn):
        got = fn(x, epsilon=0.05, dim=1)
        want = fn(x.movedim(1, -1).reshape(-1, 6), epsilon=0.05).reshape(4, 3, 6).movedim(-1, 1)
        torch.testing.assert_close(got, want)
    assert rankwise.soft_sort_sinkhorn(x, epsilon=0.05, dim=1, num_targets=2).shape == (4, 2, 3)
    assert rankwise.sinkhorn_transport(x, epsilon=0.05, dim=1, num_targets=2).shape == (4, 3, 6, 2)


def test_warns_when_not_converged() -> None:
    x = torch.randn(4, 16, dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match=r"did not reach tol=1e-14 at epsilon=0.001 within max_iter=0"):
        out = rankwise.soft_rank_sinkhorn(x, epsilon=1e-3, tol=1e-14, max_iter=0)
    assert torch.isfinite(out).all()
    # float32 at small epsilon: the default tolerance accepts the round-off floor u / (2 eps) silently
    x32 = torch.zeros(8, 128)
    x32[:, 0] = 1e3  # one outlier: the tied rest spreads over all targets (the hardest float32 case)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rankwise.soft_rank_sinkhorn(x32, epsilon=1e-3)
        rankwise.soft_rank_sinkhorn(torch.randn(8, 32), epsilon=1e-4)
    assert sk._default_tol(torch.float32, 1e-3) == (1e-5, 0.5 * torch.finfo(torch.float32).eps / 1e-3)
    with pytest.warns(RuntimeWarning, match=r"did not reach tol=1e-09"):
        rankwise.soft_rank_sinkhorn(torch.randn(8, 32), epsilon=1e-3, tol=1e-9)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu() -> None:
    x = torch.randn(4, 20, dtype=torch.float64)
    w = torch.randn(4, 20, dtype=torch.float64)
    for fn in (rankwise.soft_rank_sinkhorn, rankwise.soft_sort_sinkhorn):
        outs = []
        for dev in ("cpu", "cuda"):
            # a fresh leaf per device and op (x.to("cpu") is x itself: requires_grad_ on it made the later
            # x.to("cuda") a non-leaf without .grad, and accumulated the CPU gradients across the ops)
            xi = x.detach().clone().to(dev).requires_grad_()
            o = fn(xi, epsilon=1e-2)
            (o * w.to(dev)).sum().backward()
            assert xi.grad is not None
            outs.append((o.detach().cpu(), xi.grad.cpu()))
        torch.testing.assert_close(outs[0][0], outs[1][0])
        torch.testing.assert_close(outs[0][1], outs[1][1])


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_autocast_solves_in_float32(half: torch.dtype) -> None:
    """Under autocast the solve (LDL^T of the Newton and backward systems included, which has no half
    kernel) runs in float32: outputs, dtypes and gradients equal those computed without autocast."""
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(3, 12, generator=gen)
    w = torch.randn(3, 12, generator=gen)
    fns = [
        functools.partial(rankwise.soft_rank, method="sinkhorn"),
        functools.partial(rankwise.soft_sort, method="sinkhorn", num_targets=5),
        rankwise.sinkhorn_transport,
    ]
    for fn in fns:
        got = []
        for enabled in (False, True):
            xi = x.clone().requires_grad_()
            with torch.autocast("cpu", dtype=half, enabled=enabled):
                o = fn(xi, epsilon=5e-2)
            # outside the autocast region, as a training step does
            (o * w[..., : o.shape[-1]].reshape(o.shape[0], *[1] * (o.dim() - 2), -1)).sum().backward()
            assert o.dtype == torch.float32 and xi.grad is not None
            got.append((o.detach(), xi.grad))
        assert torch.isfinite(got[1][0]).all() and torch.isfinite(got[1][1]).all()
        torch.testing.assert_close(got[1][0], got[0][0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got[1][1], got[0][1], rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------------------
# API: dispatch, modules, registry, errors
# --------------------------------------------------------------------------------------------------
def test_soft_dispatch_and_modules() -> None:
    x = torch.randn(3, 5)
    kw = {"epsilon": 0.05, "p": 1.0, "num_targets": 4, "descending": True}
    torch.testing.assert_close(rankwise.soft_rank(x, method="sinkhorn", **kw), rankwise.soft_rank_sinkhorn(x, **kw))
    torch.testing.assert_close(rankwise.soft_sort(x, method="sinkhorn", **kw), rankwise.soft_sort_sinkhorn(x, **kw))
    torch.testing.assert_close(rankwise.SoftRank(method="sinkhorn", **kw)(x), rankwise.soft_rank_sinkhorn(x, **kw))
    torch.testing.assert_close(rankwise.SinkhornSoftRank(**kw)(x), rankwise.soft_rank_sinkhorn(x, **kw))
    torch.testing.assert_close(rankwise.SinkhornSoftSort(**kw)(x), rankwise.soft_sort_sinkhorn(x, **kw))
    torch.testing.assert_close(rankwise.SinkhornTransport(**kw)(x), rankwise.sinkhorn_transport(x, **kw))
    assert "sinkhorn" in rankwise.list_soft_methods()
    assert "epsilon=0.05" in repr(rankwise.SinkhornSoftRank(**kw))
    # the default epsilon is 1e-2
    torch.testing.assert_close(rankwise.soft_rank(x, method="sinkhorn"), rankwise.soft_rank_sinkhorn(x, epsilon=1e-2))


@pytest.mark.parametrize(
    "name", ["sinkhorn_transport", "soft_rank_sinkhorn", "soft_sort_sinkhorn", "soft_sort_sinkhorn.quantized"]
)
def test_registry_entries(name: str) -> None:
    assert name.partition(".")[0] in rankwise.list_ops()  # an entry, or a test variant of one
    entry = case_entry("op", name)
    assert entry.module is not None and factories("op", name).degenerate is not None
    assert entry.gradient == "exact"


def test_bad_inputs() -> None:
    x = torch.randn(2, 4)
    for fn in (rankwise.soft_rank_sinkhorn, rankwise.soft_sort_sinkhorn, rankwise.sinkhorn_transport):
        with pytest.raises(ValueError, match=r"`epsilon` must be finite and > 0, got 0"):
            fn(x, epsilon=0)
        with pytest.raises(ValueError, match=r"`p` must be >= 1 .* got 0.5"):
            fn(x, p=0.5)
        with pytest.raises(ValueError, match=r"`num_targets` must be >= 1 or None, got 0"):
            fn(x, num_targets=0)
        with pytest.raises(TypeError, match=r"`num_targets` must be an int or None, got bool"):
            fn(x, num_targets=True)
        with pytest.raises(ValueError, match=r"`tol` must be finite and > 0, got -1.0"):
            fn(x, tol=-1.0)
        with pytest.raises(TypeError, match=r"`max_iter` must be an int, got float"):
            fn(x, max_iter=10.0)
        with pytest.raises(ValueError, match=r"`max_iter` must be >= 0, got -1"):
            fn(x, max_iter=-1)
        with pytest.raises(TypeError, match=r"`descending` must be a bool, got int"):
            fn(x, descending=1)
        with pytest.raises(TypeError, match=r"`x` must be a floating-point tensor, got dtype torch.int64"):
            fn(torch.arange(4))
        with pytest.raises(ValueError, match=r"`x` must have at least 1 dimension"):
            fn(torch.tensor(1.0))
        with pytest.raises(ValueError, match=r"`dim` must be in \[-2, 1\]"):
            fn(x, dim=2)
        with pytest.raises(ValueError, match=r"`x` has no entries along `dim`.*num_targets=3"):
            fn(torch.zeros(2, 0), num_targets=3)
    with pytest.raises(ValueError, match=r"`epsilon` must be finite and > 0, got nan"):
        rankwise.SinkhornSoftRank(epsilon=float("nan"))
    with pytest.raises(TypeError, match="unexpected keyword argument 'tau'"):
        rankwise.soft_rank(x, method="sinkhorn", tau=1.0)


def test_batched_newton_solve_with_two_threads_at_m_256_and_more() -> None:
    """torch 2.15's batched LU on CPU returns invalid pivots with more than one thread for m >= 256
    (``torch.linalg.solve`` raised "Pivots given to lu_solve ..."; found by the property suite at
    n = 257). The Newton system is solved by a symmetric LDL^T factorization instead: same values
    and gradients with 1 and 2 threads."""
    g = torch.Generator().manual_seed(1717)
    x0 = (torch.randn(3, 257, generator=g, dtype=torch.float64) * 2).round() / 2  # many ties
    old = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            x = x0.clone().requires_grad_()
            y = rankwise.soft_sort(x, method="sinkhorn", epsilon=1e-2, descending=True)
            (y * torch.linspace(0, 1, 257, dtype=torch.float64)).sum().backward()
            assert x.grad is not None
            results.append((y.detach(), x.grad))
    finally:
        torch.set_num_threads(old)
    for y, grad in results:
        assert bool(torch.isfinite(y).all()) and bool(torch.isfinite(grad).all())
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-7, atol=1e-9)


# --------------------------------------------------------------------------------------------------
# small epsilon: valid plans down to the documented floor, a clear refusal below it
# --------------------------------------------------------------------------------------------------
def _hostile_rows(dtype: torch.dtype) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    return [
        torch.randn(3, 6, generator=gen, dtype=torch.float64).to(dtype),
        torch.tensor([[0.0, 1e-9, 1.0, 2.0, 2.0 + 1e-12, 3.0]], dtype=torch.float64).to(dtype),  # near ties
        torch.tensor([[1.0, 1.0, 2.0, 3.0, 3.0, 3.0]], dtype=dtype),  # ties
        torch.cat([torch.zeros(2, 12), torch.full((2, 1), 1e3)], dim=-1).to(dtype),  # one outlier
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_plans_are_valid_at_every_epsilon_down_to_the_floor(dtype: torch.dtype) -> None:
    """Rows sum to 1/n, columns to 1/m within the accepted round-off u / (2 eps) (or a RuntimeWarning says
    otherwise), soft ranks lie in [n/m, n] with the right sum, soft sorts within [min, max], finite gradients."""
    floor = sk.epsilon_floor(dtype)
    epsilons = [floor, 3 * floor] + [e for e in (1e-12, 1e-9, 1e-7, 1e-5, 1e-4, 1e-3, 1e-2, 0.1) if e > floor]
    for x in _hostile_rows(dtype):
        n = x.shape[-1]
        for eps in epsilons:
            for m in (n, 4):
                accepted = sk._default_tol(dtype, eps)[1]
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    try:
                        plan = rankwise.sinkhorn_transport(x, epsilon=eps, num_targets=m).double()
                    except ValueError as exc:  # an unbalanceable plan is refused (never returned)
                        assert "is too small for these inputs" in str(exc)
                        continue
                    xr = x.clone().requires_grad_()
                    r = rankwise.soft_rank_sinkhorn(xr, epsilon=eps, num_targets=m)
                    s = rankwise.soft_sort_sinkhorn(x, epsilon=eps, num_targets=m).double()
                warned = any(
                    issubclass(w.category, RuntimeWarning) and "did not reach" in str(w.message) for w in caught
                )
                u = torch.finfo(dtype).eps
                assert float((plan.sum(-1) * n - 1).abs().max()) < 16 * u * m, (eps, m)
                assert warned or float((plan.sum(-2) * m - 1).abs().max()) <= 4 * accepted, (eps, m)
                rd = r.detach().double()
                assert (rd >= n / m - 1e-3).all() and (rd <= n + 1e-3).all(), (eps, m, rd)
                if m == n:
                    total = torch.full(rd.shape[:-1], n * (n + 1) / 2, dtype=torch.float64)
                    torch.testing.assert_close(rd.sum(-1), total, rtol=1e-3, atol=0)
                lo, hi = x.double().amin(-1, keepdim=True), x.double().amax(-1, keepdim=True)
                assert (s >= lo - 1e-3 * (hi - lo)).all() and (s <= hi + 1e-3 * (hi - lo)).all()
                (g,) = torch.autograd.grad(r.sum(), xr)
                assert torch.isfinite(g).all(), (eps, m)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16], ids=["float32", "float64", "float16"])
@pytest.mark.parametrize("eps", [1e-7, 1e-14, 1e-300, 5e-324])
def test_epsilon_below_the_floor_is_refused_promptly(dtype: torch.dtype, eps: float) -> None:
    floor = sk.epsilon_floor(dtype)
    x = torch.randn(2, 6).to(dtype)
    fns = (rankwise.soft_rank_sinkhorn, rankwise.soft_sort_sinkhorn, rankwise.sinkhorn_transport)
    if eps >= floor:
        assert torch.isfinite(rankwise.soft_rank_sinkhorn(x, epsilon=eps)).all()
        return
    for fn in fns:
        with pytest.raises(ValueError, match=rf"`epsilon` must be >= {floor:.3g} .*got {eps!r}"):
            fn(x, epsilon=eps)
    with pytest.raises(ValueError, match=r"`epsilon` must be >="):
        rankwise.soft_rank(x, method="sinkhorn", epsilon=eps)
    assert sk.epsilon_floor(torch.float32) == pytest.approx(6.1e-5, rel=1e-3)
    assert sk.epsilon_floor(torch.float64) == pytest.approx(1.137e-13, rel=1e-3)


def test_schedule_is_finite_for_every_epsilon() -> None:
    for eps in (0.5, 0.1, 1e-2, 1e-6, 1e-13, 1e-300, 5e-324):
        sched = sk._schedule(eps)
        assert sched[-1] == eps and len(sched) < 400
        assert sorted(set(sched), reverse=True) == sched  # strictly decreasing


def test_rows_below_the_std_floor_warn_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The authors' 1e-6 floor on the row's standard deviation: rows spread less than it squash to nearly
    one value and get nearly equal soft ranks; that is reported once per process (all-tied rows are not)."""
    monkeypatch.setattr(sk, "_std_floor_warned", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rankwise.soft_rank_sinkhorn(torch.ones(2, 5, dtype=torch.float64), epsilon=0.1)  # all ties: no warning
        rankwise.soft_rank_sinkhorn(torch.randn(2, 5, dtype=torch.float64) * 1e-5, epsilon=0.1)  # above it
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=torch.float64) * 1e-30
    with pytest.warns(RuntimeWarning, match=r"below the authors' floor of 1e-6.*shown once"):
        r = rankwise.soft_rank_sinkhorn(x, epsilon=1e-3)
    assert float(r.max() - r.min()) < 1e-3  # (nearly) equal ranks: the documented convention
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rankwise.soft_rank_sinkhorn(x, epsilon=1e-3)  # not again


# --------------------------------------------------------------------------------------------------
# torch.compile(fullgraph=True): the solver has no data-dependent Python branch on the traced path
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "kw"),
    [
        ("soft_rank", {"method": "sinkhorn", "epsilon": 1e-2}),
        ("soft_sort_sinkhorn", {"epsilon": 1e-2, "descending": True}),
        ("sinkhorn_transport", {"epsilon": 0.05, "num_targets": 4}),
    ],
)
def test_compiles_with_fullgraph_and_matches_eager(name: str, kw: dict) -> None:
    torch._dynamo.reset()
    fn = getattr(rankwise, name)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, 8, generator=gen, dtype=torch.float64)
    w = torch.randn(fn(x, **kw).shape, generator=gen, dtype=torch.float64)
    compiled = torch.compile(lambda t: fn(t, **kw), fullgraph=True, backend="aot_eager")
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = fn(a, **kw), compiled(b)
    (ga,) = torch.autograd.grad((ya * w).sum(), a)
    (gb,) = torch.autograd.grad((yb * w).sum(), b)
    torch.testing.assert_close(yb, ya, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(gb, ga, rtol=1e-7, atol=1e-7)


def test_an_invalid_plan_is_refused_not_returned() -> None:
    """Ties spread over fewer targets at epsilon = 1e-9 (float64): the marginals cannot be balanced to 1%;
    a ValueError naming `epsilon` instead of a plan with columns off by 50%."""
    x = torch.tensor([[1.0, 1.0, 2.0, 3.0, 3.0, 3.0]] * 2, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"`epsilon`=1e-09 is too small for these inputs in float64"):
        rankwise.sinkhorn_transport(x, epsilon=1e-9, num_targets=3)
    plan = rankwise.sinkhorn_transport(x, epsilon=1e-3, num_targets=3).double()
    assert float((plan.sum(-2) * 3 - 1).abs().max()) < 1e-6


def _ties_and_random_costs() -> list[tuple[torch.Tensor, float]]:
    ties = torch.full((2, 5), 0.7)
    rand = torch.randn(6, 12, generator=torch.Generator().manual_seed(5))
    huge = rand * 1e30
    out = []
    for x, eps in [(ties, 1e-3), (ties, 0.1), (rand, 1e-3), (rand, 1e-2), (huge, 1e-3)]:
        out.append((sk._cost(sk._squash(x)[0], sk._targets(x.shape[-1], True, x), 2.0), eps))
    return out


@pytest.mark.parametrize("case", range(5))
def test_fixed_budget_solve_stops_where_the_loop_stops(case: int) -> None:
    """The solve without host reads applies the loop's stopping rule on the device: where the loop stops
    within the budget (all ties converge in the warm-up sweeps and take no Newton step), the potential
    is the loop's, bit for bit (all-tied rows squash to one value at the std floor, which magnifies any
    difference of the potential a millionfold in the gradient)."""
    cost, eps = _ties_and_random_costs()[case]
    tol = sk._default_tol(cost.dtype, eps)[0]
    g_loop, err_loop, info = sk._solve(cost, eps, tol, 50, False)
    g_fixed, err_fixed, _ = sk._solve(cost, eps, tol, 50, True)
    assert info.newton_steps <= sk._COMPILED_NEWTON_STEPS
    if case == 0:
        assert info.newton_steps == 0
    assert torch.equal(g_fixed, g_loop) and torch.equal(err_fixed, err_loop)


@pytest.mark.parametrize("name", ["sinkhorn_transport", "soft_rank_sinkhorn"])
def test_path_without_host_reads_gives_the_eager_gradient_of_all_tied_rows(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """The traced path (what ``torch.compile`` runs, here taken in eager mode) on all-tied rows at
    ``epsilon=1e-3``: the gradient (of order 1e8 for the soft ranks: the std floor) equals eager's."""
    fn = getattr(rankwise, name)
    x = torch.full((2, 5), 0.7)
    w = torch.linspace(0.5, 1.5, fn(x, epsilon=1e-3, descending=True).numel()).reshape(-1)

    def grad() -> torch.Tensor:
        xr = x.clone().requires_grad_()
        y = fn(xr, epsilon=1e-3, descending=True)
        return torch.autograd.grad((y.reshape(-1) * w).sum(), xr)[0]

    want = grad()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    got = grad()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_return_info_is_the_solve_of_this_call() -> None:
    """``return_info=True`` gives the plan and its own solve's information; the plan is the same."""
    x = torch.randn(3, 12, dtype=torch.float64)
    plan = rankwise.sinkhorn_transport(x, epsilon=1e-2)
    got, info = rankwise.sinkhorn_transport(x, epsilon=1e-2, return_info=True)
    assert torch.equal(got, plan)
    assert isinstance(info, sk.SolveInfo) and info.converged and 0 <= info.error < 1e-10
    assert info.sweeps >= 1
    _, tied = rankwise.sinkhorn_transport(torch.ones(2, 5, dtype=torch.float64), return_info=True)
    assert tied.newton_steps == 0 and tied.converged  # all ties: converged at the warm-up
    empty, none = rankwise.sinkhorn_transport(torch.zeros(0, 4, dtype=torch.float64), return_info=True)
    assert empty.shape == (0, 4, 4) and none.newton_steps == 0 and none.sweeps == 0
    with pytest.raises(TypeError, match="`return_info` must be a bool"):
        rankwise.sinkhorn_transport(x, return_info=1)  # type: ignore[call-overload]
    assert not hasattr(sk, "_LAST")
