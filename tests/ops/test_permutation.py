"""NeuralSort, stochastic NeuralSort and SoftSort: parity with slow formula transcriptions, gradients,
properties of the relaxed permutation matrices, degenerate inputs and argument errors."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import rankwise
from rankwise import (
    NeuralSort,
    SoftSortMatrix,
    StochasticNeuralSort,
    neural_sort,
    soft_rank,
    soft_sort,
    softsort_matrix,
    stochastic_neural_sort,
)
from tests.conftest import gradcheck
from tests.registry_examples import case_entry


# ----------------------------------------------------------------------------------------------
# slow, obviously-correct references (loops; test file only)
# ----------------------------------------------------------------------------------------------
def neural_sort_loop(s: list[float], tau: float) -> torch.Tensor:
    """P̂[i, :] = softmax(((n + 1 - 2i) s - A_s 1) / tau), written out element by element."""
    n = len(s)
    row_sum = [sum(abs(s[j] - s[k]) for k in range(n)) for j in range(n)]
    p = torch.zeros(n, n, dtype=torch.float64)
    for i in range(1, n + 1):
        logits = [((n + 1 - 2 * i) * s[j] - row_sum[j]) / tau for j in range(n)]
        mx = max(logits)
        e = [math.exp(v - mx) for v in logits]
        for j in range(n):
            p[i - 1, j] = e[j] / sum(e)
    return p


def neural_sort_cubic(s: torch.Tensor, tau: float) -> torch.Tensor:
    """Direct transcription of the reference formula, with A_s 1 as the O(n³) product A (1 1ᵀ)."""
    n = s.shape[-1]
    a = (s.unsqueeze(-1) - s.unsqueeze(-2)).abs()
    one = torch.ones(n, 1, dtype=s.dtype)
    b = a @ (one @ one.T)  # (n, n): every column is A 1
    scaling = (n + 1 - 2 * (torch.arange(n, dtype=s.dtype) + 1)).unsqueeze(-1)
    c = scaling @ s.unsqueeze(-2)
    return torch.softmax((c - b.transpose(-1, -2)) / tau, dim=-1)


def softsort_loop(s: list[float], tau: float, power: float) -> torch.Tensor:
    n = len(s)
    v = sorted(s, reverse=True)
    p = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        logits = [-(abs(v[i] - s[j]) ** power) / tau for j in range(n)]
        mx = max(logits)
        e = [math.exp(x - mx) for x in logits]
        for j in range(n):
            p[i, j] = e[j] / sum(e)
    return p


def perm_matrix(s: torch.Tensor) -> torch.Tensor:
    """Exact descending permutation matrix from torch.sort (stable)."""
    idx = torch.sort(s, dim=-1, descending=True, stable=True).indices
    return torch.nn.functional.one_hot(idx, s.shape[-1]).to(s.dtype)


FNS = {"neuralsort": neural_sort, "softsort": softsort_matrix}


# ----------------------------------------------------------------------------------------------
# parity
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tau", [0.05, 0.5, 1.0, 3.0])
def test_neural_sort_matches_loop_and_cubic(tau: float) -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 9, generator=g, dtype=torch.float64) * 2
    p = neural_sort(x, tau=tau)
    assert p.shape == (4, 9, 9)
    for b in range(4):
        torch.testing.assert_close(p[b], neural_sort_loop(x[b].tolist(), tau), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(p[b], neural_sort_cubic(x[b], tau), rtol=1e-10, atol=1e-12)


def test_neural_sort_gradient_matches_cubic() -> None:
    g = torch.Generator().manual_seed(4)
    x = torch.randn(7, generator=g, dtype=torch.float64)
    w = torch.randn(7, 7, generator=g, dtype=torch.float64)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    (neural_sort(x1, tau=0.6) * w).sum().backward()
    (neural_sort_cubic(x2, 0.6) * w).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-9, atol=1e-12)


def test_neural_sort_large_offset_is_accurate() -> None:
    # centring keeps float32 accurate when scores share a large offset (P̂ is shift invariant)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 50, generator=g, dtype=torch.float64)
    p64 = neural_sort(x, tau=0.3)
    p32 = neural_sort((x + 1000).float(), tau=0.3)
    torch.testing.assert_close(p32.double(), p64, rtol=0, atol=2e-3)


@pytest.mark.parametrize("power", [1.0, 2.0, 0.5])
@pytest.mark.parametrize("tau", [0.1, 1.0])
def test_softsort_matches_loop(tau: float, power: float) -> None:
    g = torch.Generator().manual_seed(6)
    x = torch.randn(3, 8, generator=g, dtype=torch.float64)
    p = softsort_matrix(x, tau=tau, power=power)
    for b in range(3):
        torch.testing.assert_close(p[b], softsort_loop(x[b].tolist(), tau, power), rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------------------------
# gradients
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tau", [0.3, 1.0])
def test_neural_sort_gradcheck(tau: float) -> None:
    x = torch.randn(2, 3, 5, dtype=torch.float64)
    assert gradcheck(lambda s: neural_sort(s, tau=tau, dim=1), x)


@pytest.mark.parametrize("power", [1.0, 2.0, 0.5, 1.5])
def test_softsort_gradcheck(power: float) -> None:
    x = torch.randn(3, 6, dtype=torch.float64)
    assert gradcheck(lambda s: softsort_matrix(s, tau=0.5, power=power), x)


def test_softsort_power_below_one_has_finite_gradient() -> None:
    x = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    softsort_matrix(x, tau=0.5, power=0.5).pow(2).sum().backward()
    assert torch.isfinite(x.grad).all()


def test_stochastic_gradcheck() -> None:
    x = torch.rand(2, 5, dtype=torch.float64) + 0.2

    def fn(s: torch.Tensor) -> torch.Tensor:
        return stochastic_neural_sort(s, tau=0.5, n_samples=3, generator=torch.Generator().manual_seed(1))

    assert gradcheck(fn, x)
    assert gradcheck(
        lambda s: stochastic_neural_sort(s, log_scores=True, generator=torch.Generator().manual_seed(2)),
        torch.randn(4, dtype=torch.float64),
    )


@pytest.mark.parametrize("method", ["neuralsort", "softsort"])
@pytest.mark.parametrize("descending", [False, True])
def test_soft_sort_rank_gradcheck(method: str, descending: bool) -> None:
    x = torch.randn(2, 6, dtype=torch.float64)
    assert gradcheck(lambda s: soft_sort(s, method=method, tau=0.5, descending=descending), x)
    assert gradcheck(lambda s: soft_rank(s, method=method, tau=0.5, descending=descending, dim=0), x)


@pytest.mark.parametrize("name", ["neuralsort", "softsort"])
def test_hard_is_straight_through(name: str) -> None:
    fn = FNS[name]
    g = torch.Generator().manual_seed(7)
    x = torch.randn(3, 6, generator=g, dtype=torch.float64)
    w = torch.randn(3, 6, 6, generator=g, dtype=torch.float64)
    xh, xs = x.clone().requires_grad_(), x.clone().requires_grad_()
    ph = fn(xh, tau=0.4, hard=True)
    torch.testing.assert_close(ph, perm_matrix(x), rtol=0, atol=0)  # exactly 0/1
    (ph * w).sum().backward()
    (fn(xs, tau=0.4) * w).sum().backward()
    torch.testing.assert_close(xh.grad, xs.grad)


# ----------------------------------------------------------------------------------------------
# properties
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["neuralsort", "softsort"])
@pytest.mark.parametrize("tau", [0.01, 0.3, 1.0, 10.0])
def test_rows_stochastic_and_argmax_is_the_sort(name: str, tau: float, device: torch.device) -> None:
    x = torch.randn(16, 10, device=device)
    p = FNS[name](x, tau=tau)
    assert (p >= 0).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(16, 10, device=device))
    # argmax of each row is a valid permutation, namely the descending sort (distinct scores)
    am = p.argmax(-1)
    assert torch.equal(am.sort(-1).values, torch.arange(10, device=device).expand(16, 10))
    assert torch.equal(am, x.argsort(-1, descending=True))


@pytest.mark.parametrize("name", ["neuralsort", "softsort"])
def test_column_sums_what_is_true(name: str) -> None:
    """P̂ is row-stochastic but not doubly stochastic: column sums average exactly 1, deviate from 1 at
    moderate tau, and tend to 1 as tau -> 0 and as tau -> inf."""
    x = torch.randn(200, 8, dtype=torch.float64)
    fn = FNS[name]
    mid = fn(x, tau=1.0).sum(-2)
    torch.testing.assert_close(mid.mean(-1), torch.ones(200, dtype=torch.float64))
    assert (mid - 1).abs().max() > 0.05  # not doubly stochastic
    spread = {tau: (fn(x, tau=tau).sum(-2) - 1).abs().max().item() for tau in (1e-4, 1.0, 1e4)}
    assert spread[1e-4] < spread[1.0] and spread[1e4] < spread[1.0]
    assert spread[1e4] < 1e-2
    # well-separated scores: columns sum to 1 once tau is small
    xs = torch.tensor([[0.0, 3.0, 1.0, 5.0, 2.0]], dtype=torch.float64)
    torch.testing.assert_close(fn(xs, tau=0.01).sum(-2), torch.ones(1, 5, dtype=torch.float64))


@pytest.mark.parametrize("name", ["neuralsort", "softsort"])
def test_small_tau_gives_exact_permutation(name: str, dtype: torch.dtype) -> None:
    x = torch.randperm(12).to(dtype).reshape(2, 6) / 3  # distinct, gaps >= 1/3
    p = FNS[name](x, tau=1e-3)
    torch.testing.assert_close(p, perm_matrix(x), rtol=0, atol=1e-6)
    torch.testing.assert_close(p @ x.unsqueeze(-1), torch.sort(x, descending=True).values.unsqueeze(-1))
    for method in ("neuralsort", "softsort"):
        for desc in (False, True):
            r = soft_rank(x, method=method, tau=1e-3, descending=desc)
            torch.testing.assert_close(r, rankwise.rank(x, descending=desc))
            srt = soft_sort(x, method=method, tau=1e-3, descending=desc)
            torch.testing.assert_close(srt, torch.sort(x, descending=desc).values)


@pytest.mark.parametrize("method", ["neuralsort", "softsort"])
def test_soft_sort_and_rank_definitions(method: str) -> None:
    g = torch.Generator().manual_seed(8)
    x = torch.randn(3, 7, generator=g, dtype=torch.float64)
    kw = {"tau": 0.7} if method == "neuralsort" else {"tau": 0.7, "power": 2.0}
    p = neural_sort(x, tau=0.7) if method == "neuralsort" else softsort_matrix(x, tau=0.7, power=2.0)
    desc_sort = torch.einsum("bij,bj->bi", p, x)
    torch.testing.assert_close(soft_sort(x, method=method, descending=True, **kw), desc_sort)
    torch.testing.assert_close(soft_sort(x, method=method, **kw), desc_sort.flip(-1))
    # soft rank of element j: sum_i i * P̂[i, j] (descending), n + 1 minus that ascending (loops)
    n = x.shape[-1]
    expected = torch.zeros_like(x)
    for b, j in itertools.product(range(3), range(n)):
        expected[b, j] = sum((i + 1) * p[b, i, j] for i in range(n))
    torch.testing.assert_close(soft_rank(x, method=method, descending=True, **kw), expected)
    torch.testing.assert_close(soft_rank(x, method=method, **kw), n + 1 - expected)
    # ranks of the n elements always sum to n(n+1)/2
    torch.testing.assert_close(soft_rank(x, method=method, **kw).sum(-1), torch.full((3,), n * (n + 1) / 2.0).double())
    # dim handling
    torch.testing.assert_close(soft_rank(x.T, method=method, dim=0, **kw), soft_rank(x, method=method, **kw).T)


def test_dim_and_leading_dims() -> None:
    x = torch.randn(2, 5, 3)
    p = neural_sort(x, dim=1, tau=0.5)
    assert p.shape == (2, 3, 5, 5)
    torch.testing.assert_close(p, neural_sort(x.movedim(1, -1), tau=0.5))
    q = softsort_matrix(x, dim=0)
    assert q.shape == (5, 3, 2, 2)
    s = stochastic_neural_sort(x.exp(), dim=1, n_samples=4)
    assert s.shape == (4, 2, 3, 5, 5)


@pytest.mark.parametrize("name", ["neuralsort", "softsort"])
def test_half_precision_is_computed_in_float32(name: str) -> None:
    x = torch.randn(3, 6)
    for dt in (torch.float16, torch.bfloat16):
        p = FNS[name](x.to(dt), tau=0.5)
        assert p.dtype == dt
        torch.testing.assert_close(p.float(), FNS[name](x.to(dt).float(), tau=0.5), rtol=0, atol=1e-2)


# ----------------------------------------------------------------------------------------------
# stochastic NeuralSort
# ----------------------------------------------------------------------------------------------
def test_stochastic_shape_reproducible_and_random() -> None:
    s = torch.rand(2, 3, 5) + 0.1
    a = stochastic_neural_sort(s, n_samples=6, generator=torch.Generator().manual_seed(11))
    b = stochastic_neural_sort(s, n_samples=6, generator=torch.Generator().manual_seed(11))
    c = stochastic_neural_sort(s, n_samples=6, generator=torch.Generator().manual_seed(12))
    assert a.shape == (6, 2, 3, 5, 5)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    torch.testing.assert_close(a.sum(-1), torch.ones(6, 2, 3, 5))
    # global RNG path is reproducible with torch.manual_seed
    torch.manual_seed(3)
    d = stochastic_neural_sort(s, n_samples=2)
    torch.manual_seed(3)
    assert torch.equal(d, stochastic_neural_sort(s, n_samples=2))


def test_stochastic_log_scores_equivalence_and_sample_structure() -> None:
    s = torch.rand(4, 6, dtype=torch.float64) + 0.1
    a = stochastic_neural_sort(s, tau=0.3, n_samples=5, generator=torch.Generator().manual_seed(1))
    b = stochastic_neural_sort(
        s.log(), tau=0.3, n_samples=5, generator=torch.Generator().manual_seed(1), log_scores=True
    )
    torch.testing.assert_close(a, b)
    # each sample is NeuralSort of the Gumbel-perturbed log-scores: same generator stream
    gen = torch.Generator().manual_seed(1)
    u = torch.rand((5, 4, 6), generator=gen, dtype=torch.float64)
    gumbel = -torch.log(-torch.log(u))
    torch.testing.assert_close(a, neural_sort(s.log() + gumbel, tau=0.3))


def test_stochastic_mean_matches_plackett_luce() -> None:
    s = torch.tensor([1.0, 2.0, 5.0], dtype=torch.float64)
    samples = stochastic_neural_sort(s, hard=True, n_samples=40000, generator=torch.Generator().manual_seed(0))
    mean = samples.mean(0)  # mean[i, j] = Pr(element j is at position i)
    tot = s.sum()
    first = s / tot
    second = torch.tensor(
        [sum(s[i] / tot * s[j] / (tot - s[i]) for i in range(3) if i != j) for j in range(3)], dtype=torch.float64
    )
    expected = torch.stack([first, second, 1 - first - second])
    torch.testing.assert_close(mean, expected, rtol=0, atol=0.015)
    # each hard sample is a permutation matrix
    assert torch.equal(samples.sum(-1), torch.ones(40000, 3, dtype=torch.float64))
    assert torch.equal(samples.sum(-2), torch.ones(40000, 3, dtype=torch.float64))


def test_stochastic_errors() -> None:
    with pytest.raises(ValueError, match="`scores` must be > 0"):
        stochastic_neural_sort(torch.tensor([1.0, 0.0, 2.0]))
    with pytest.raises(ValueError, match="`n_samples` must be >= 1, got 0"):
        stochastic_neural_sort(torch.ones(3), n_samples=0)
    with pytest.raises(TypeError, match="`n_samples` must be an int"):
        stochastic_neural_sort(torch.ones(3), n_samples=2.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"`generator` must be a torch\.Generator"):
        stochastic_neural_sort(torch.ones(3), generator=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`generator` is on device cpu but the input is on meta"):
        stochastic_neural_sort(torch.ones(3, device="meta"), log_scores=True, generator=torch.Generator())
    # negative log-scores are fine
    assert torch.isfinite(stochastic_neural_sort(torch.tensor([-1.0, 0.0, 2.0]), log_scores=True)).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_stochastic_cuda_generator() -> None:
    s = torch.rand(3, 5, device="cuda") + 0.1
    a = stochastic_neural_sort(s, n_samples=2, generator=torch.Generator(device="cuda").manual_seed(0))
    b = stochastic_neural_sort(s, n_samples=2, generator=torch.Generator(device="cuda").manual_seed(0))
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="`generator` is on device cpu but the input is on cuda"):
        stochastic_neural_sort(s, generator=torch.Generator())


# ----------------------------------------------------------------------------------------------
# degenerate inputs
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["neuralsort", "softsort", "stochastic"])
def test_degenerate(name: str) -> None:
    def fn(x: torch.Tensor, **kw: object) -> torch.Tensor:
        if name == "stochastic":
            return stochastic_neural_sort(x, **kw)[0]  # type: ignore[arg-type]
        return FNS[name](x, **kw)  # type: ignore[arg-type]

    for shape, out in [((0,), (0, 0)), ((3, 0), (3, 0, 0)), ((0, 4), (0, 4, 4))]:
        x = torch.ones(shape, requires_grad=True)
        p = fn(x)
        assert p.shape == out
        p.sum().backward()
        assert x.grad is not None and x.grad.shape == shape
    x = torch.full((2, 1), 2.0, requires_grad=True)
    p = fn(x)
    assert torch.equal(p, torch.ones(2, 1, 1))
    p.sum().backward()
    assert torch.equal(x.grad, torch.zeros(2, 1))
    # all ties: rows uniform (deterministic); hard picks the identity (stable order)
    x = torch.full((5,), 0.7, requires_grad=True)
    if name != "stochastic":
        torch.testing.assert_close(fn(x, tau=0.1), torch.full((5, 5), 0.2))
        assert torch.equal(fn(x, hard=True), torch.eye(5))
    p = fn(x, tau=0.1)
    (p * torch.randn(5, 5)).sum().backward()
    assert torch.isfinite(p).all() and torch.isfinite(x.grad).all()


# ----------------------------------------------------------------------------------------------
# complexity (no timing): n = 3000 would need 27e9 elements if A 1 were an n³ product
# ----------------------------------------------------------------------------------------------
def test_neural_sort_is_quadratic_memory() -> None:
    x = torch.randn(3000, requires_grad=True)
    p = neural_sort(x, tau=1.0)
    (p[:10] @ x.detach()).sum().backward()
    assert p.shape == (3000, 3000) and torch.isfinite(x.grad).all()


# ----------------------------------------------------------------------------------------------
# modules, registry, errors
# ----------------------------------------------------------------------------------------------
def test_modules_match_functions() -> None:
    x = torch.randn(3, 5)
    torch.testing.assert_close(NeuralSort(tau=0.5, dim=0)(x), neural_sort(x, tau=0.5, dim=0))
    torch.testing.assert_close(SoftSortMatrix(tau=0.5, power=2.0)(x), softsort_matrix(x, tau=0.5, power=2.0))
    m = StochasticNeuralSort(tau=0.5, n_samples=2, log_scores=True)
    torch.manual_seed(0)
    a = m(x)
    torch.manual_seed(0)
    torch.testing.assert_close(a, stochastic_neural_sort(x, tau=0.5, n_samples=2, log_scores=True))
    assert "tau=0.5" in repr(m)


def test_registered() -> None:
    names = set(rankwise.list_ops())
    assert {"neural_sort", "stochastic_neural_sort", "softsort", "soft_rank", "soft_sort"} <= names
    assert {"neuralsort", "softsort"} <= set(rankwise.list_soft_methods())
    assert case_entry("op", "neural_sort.hard").gradient == "surrogate"  # neural_sort(..., hard=True)
    assert rankwise.get_op_entry("stochastic_neural_sort").stochastic


@pytest.mark.parametrize("name", ["neuralsort", "softsort"])
def test_errors(name: str) -> None:
    fn = FNS[name]
    with pytest.raises(ValueError, match=r"`tau` must be finite and > 0, got 0"):
        fn(torch.randn(4), tau=0)
    with pytest.raises(ValueError, match=r"`tau` must be finite and > 0, got -1.0"):
        fn(torch.randn(4), tau=-1.0)
    with pytest.raises(TypeError, match=r"`scores` must be a floating-point tensor, got dtype torch\.int64"):
        fn(torch.tensor([3, 1, 2]))
    with pytest.raises(TypeError, match=r"`scores` must be a torch\.Tensor, got list"):
        fn([1.0, 2.0])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`scores` must have at least 1 dimension"):
        fn(torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"`dim` must be in \[-2, 1\]"):
        fn(torch.randn(2, 3), dim=2)
    with pytest.raises(TypeError, match="`hard` must be a bool"):
        fn(torch.randn(3), hard=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`tau` must be finite and > 0"):
        soft_rank(torch.randn(3), method=name, tau=0.0)
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        soft_rank(torch.randn(3), method=name, temperature=1.0)
    with pytest.raises(ValueError, match="`method` must be one of"):
        soft_rank(torch.randn(3), method="neural_sort")
    with pytest.raises(ValueError, match="`power` must be finite and > 0, got 0"):
        softsort_matrix(torch.randn(3), power=0)
    with pytest.raises(ValueError, match="`tau` must be finite and > 0"):
        NeuralSort(tau=-2)


def test_second_derivatives() -> None:
    x = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda s: neural_sort(s, tau=0.5), (x,))
    assert torch.autograd.gradgradcheck(lambda s: rankwise.soft_topk(s, 2, tau=0.5), (x,))
    for power in (1.0, 2.0, 1.5):
        assert torch.autograd.gradgradcheck(lambda s, p=power: softsort_matrix(s, tau=0.5, power=p), (x,))
