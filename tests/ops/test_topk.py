"""soft_topk, dknn and dknn_class_scores: parity with loop references, gradients, limits, errors."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import rankwise
from rankwise import (
    DKNN,
    DKNNClassScores,
    SoftTopK,
    SoftTopKValues,
    dknn,
    dknn_class_scores,
    neural_sort,
    soft_topk,
    soft_topk_values,
    softsort_matrix,
)
from tests.conftest import gradcheck
from tests.registry_examples import case_entry


def topk_loop(s: list[float], k: int, tau: float) -> torch.Tensor:
    """m_j = sum_{i <= k} softmax_j(((n + 1 - 2i) s_j - sum_l |s_j - s_l|) / tau), with loops."""
    n = len(s)
    row_sum = [sum(abs(a - b) for b in s) for a in s]
    m = [0.0] * n
    for i in range(1, k + 1):
        logits = [((n + 1 - 2 * i) * s[j] - row_sum[j]) / tau for j in range(n)]
        mx = max(logits)
        e = [math.exp(v - mx) for v in logits]
        for j in range(n):
            m[j] += e[j] / sum(e)
    return torch.tensor(m, dtype=torch.float64)


def hard_topk(s: torch.Tensor, k: int) -> torch.Tensor:
    idx = torch.topk(s, k, dim=-1).indices
    return torch.zeros_like(s).scatter(-1, idx, 1.0)


# ----------------------------------------------------------------------------------------------
# soft_topk
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("tau", [0.1, 1.0])
def test_soft_topk_matches_loop(k: int, tau: float) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, generator=g, dtype=torch.float64)
    m = soft_topk(x, k, tau=tau)
    for b in range(4):
        torch.testing.assert_close(m[b], topk_loop(x[b].tolist(), k, tau), rtol=1e-10, atol=1e-12)
    # = sum of the first k rows of the full matrices
    torch.testing.assert_close(m, neural_sort(x, tau=tau)[..., :k, :].sum(-2))
    torch.testing.assert_close(
        soft_topk(x, k, tau=tau, method="softsort"), softsort_matrix(x, tau=tau)[..., :k, :].sum(-2)
    )


@pytest.mark.parametrize("method", ["neuralsort", "softsort"])
def test_soft_topk_properties(method: str, device: torch.device, dtype: torch.dtype) -> None:
    x = torch.randn(32, 10, device=device, dtype=dtype)
    for tau in (0.05, 0.5, 2.0):
        m = soft_topk(x, 4, tau=tau, method=method)
        assert m.shape == x.shape and m.dtype == dtype
        assert (m >= 0).all()
        torch.testing.assert_close(m.sum(-1), torch.full((32,), 4.0, device=device, dtype=dtype))
        # what is true: entries may exceed 1 only by the column-sum excess of P̂ (not doubly stochastic)
        full = neural_sort(x, tau=tau) if method == "neuralsort" else softsort_matrix(x, tau=tau)
        assert (m <= full.sum(-2) + 1e-5).all()
    # tau -> 0: the hard top-k indicator
    xs = torch.randperm(20, device=device).to(dtype).reshape(2, 10) / 4
    torch.testing.assert_close(soft_topk(xs, 3, tau=1e-3, method=method), hard_topk(xs, 3), rtol=0, atol=1e-5)


def test_soft_topk_dim_gradcheck_and_module() -> None:
    x = torch.randn(3, 6, 2, dtype=torch.float64)
    m = soft_topk(x, 2, dim=1, tau=0.5)
    assert m.shape == x.shape
    torch.testing.assert_close(m, soft_topk(x.movedim(1, -1), 2, tau=0.5).movedim(-1, 1))
    torch.testing.assert_close(SoftTopK(2, tau=0.5, dim=1)(x), m)
    assert gradcheck(lambda s: soft_topk(s, 2, dim=1, tau=0.5), x)
    assert gradcheck(lambda s: soft_topk(s, 3, tau=0.5, method="softsort"), torch.randn(2, 5, dtype=torch.float64))


def test_soft_topk_degenerate() -> None:
    x = torch.full((2, 5), 0.3, requires_grad=True)
    m = soft_topk(x, 2)  # all ties: k / n everywhere
    torch.testing.assert_close(m, torch.full((2, 5), 0.4))
    m.sum().backward()
    assert torch.isfinite(x.grad).all()
    # k = n: the column sums of P̂ (they add up to n but are not all 1: P̂ is not doubly stochastic)
    x = torch.randn(3, 4)
    torch.testing.assert_close(soft_topk(x, 4), neural_sort(x).sum(-2))
    torch.testing.assert_close(soft_topk(x, 4).sum(-1), torch.full((3,), 4.0))
    assert torch.equal(soft_topk(torch.tensor([2.0]), 1), torch.ones(1))
    e = torch.zeros(0, 4, requires_grad=True)
    out = soft_topk(e, 2)
    assert out.shape == (0, 4)
    out.sum().backward()
    assert soft_topk(torch.randn(3, 5).half(), 2).dtype == torch.float16


def test_soft_topk_errors() -> None:
    x = torch.randn(2, 5)
    with pytest.raises(ValueError, match=r"`k` must be in \[1, 5\] \(n = 5\), got 6"):
        soft_topk(x, 6)
    with pytest.raises(ValueError, match=r"`k` must be in \[1, 5\] \(n = 5\), got 0"):
        soft_topk(x, 0)
    with pytest.raises(ValueError, match=r"`k` must be in \[1, 2\] \(n = 2\), got 3"):
        soft_topk(x, 3, dim=0)
    with pytest.raises(ValueError, match=r"`k` = 1 selects from no element \(n = 0\)"):
        soft_topk(torch.empty(1, 0), 1)
    with pytest.raises(TypeError, match="`k` must be an int, got float"):
        soft_topk(x, 2.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`k` must be an int, got bool"):
        soft_topk(x, True)
    with pytest.raises(ValueError, match="`tau` must be finite and > 0, got 0"):
        soft_topk(x, 2, tau=0)
    with pytest.raises(TypeError, match="`scores` must be a floating-point tensor"):
        soft_topk(torch.tensor([1, 2, 3]), 1)
    with pytest.raises(ValueError, match="`scores` must have at least 1 dimension"):
        soft_topk(torch.tensor(1.0), 1)
    with pytest.raises(ValueError, match=r"`method` must be one of 'neuralsort', 'softsort', .*; got 'sinkhorn'"):
        soft_topk(x, 2, method="sinkhorn")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`k` must be >= 1, got 0"):
        SoftTopK(0)


# ----------------------------------------------------------------------------------------------
# dknn
# ----------------------------------------------------------------------------------------------
def test_dknn_matches_definition() -> None:
    g = torch.Generator().manual_seed(1)
    q = torch.randn(5, 3, generator=g, dtype=torch.float64)
    y = torch.randn(9, 3, generator=g, dtype=torch.float64)
    m = dknn(q, y, 3, tau=0.4)
    assert m.shape == (5, 9)
    # explicit negative squared Euclidean distances (including the per-query constant), loop top-k
    for a in range(5):
        s = [-sum((q[a, d] - y[b, d]).item() ** 2 for d in range(3)) for b in range(9)]
        torch.testing.assert_close(m[a], topk_loop(s, 3, 0.4), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(m.sum(-1), torch.full((5,), 3.0, dtype=torch.float64))
    assert (m > 0).all()


def test_dknn_small_tau_is_hard_knn(device: torch.device) -> None:
    g = torch.Generator().manual_seed(2)
    q = torch.randn(20, 4, generator=g).to(device)
    y = torch.randn(30, 4, generator=g).to(device)
    d2 = torch.cdist(q, y) ** 2
    hard = hard_topk(-d2, 5)
    gaps = torch.sort(d2, dim=-1).values.diff(dim=-1)[:, 4]  # gap between 5th and 6th neighbour
    keep = gaps > 0.05
    m = dknn(q, y, 5, tau=1e-4)
    torch.testing.assert_close(m[keep], hard[keep], rtol=0, atol=1e-3)
    assert keep.sum() > 10


def test_dknn_stochastic() -> None:
    g = torch.Generator().manual_seed(3)
    q = torch.randn(4, 2, generator=g, dtype=torch.float64)
    y = torch.randn(6, 2, generator=g, dtype=torch.float64)
    a = dknn(q, y, 2, method="stochastic", n_samples=8, generator=torch.Generator().manual_seed(5))
    b = dknn(q, y, 2, method="stochastic", n_samples=8, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b) and a.shape == (4, 6)
    torch.testing.assert_close(a.sum(-1), torch.full((4,), 2.0, dtype=torch.float64))
    # k = 1, tau -> 0: membership -> Pr(j is first) under Plackett-Luce with log-scores -d², = softmax(-d²)
    m = dknn(q, y, 1, tau=1e-4, method="stochastic", n_samples=20000, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(m, torch.softmax(-(torch.cdist(q, y) ** 2), -1), rtol=0, atol=0.02)
    assert gradcheck(
        lambda qq, yy: dknn(
            qq, yy, 2, tau=0.5, method="stochastic", n_samples=2, generator=torch.Generator().manual_seed(1)
        ),
        q,
        y,
    )


def test_dknn_gradcheck_batch_and_module() -> None:
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 3, 2, generator=g, dtype=torch.float64)
    y = torch.randn(4, 2, generator=g, dtype=torch.float64)
    m = dknn(q, y, 2, tau=0.5)  # leading dims broadcast
    assert m.shape == (2, 3, 4)
    torch.testing.assert_close(m[1], dknn(q[1], y, 2, tau=0.5))
    torch.testing.assert_close(DKNN(2, tau=0.5)(q, y), m)
    assert gradcheck(lambda qq, yy: dknn(qq, yy, 2, tau=0.5), q, y)


def test_dknn_degenerate_and_dtype() -> None:
    y = torch.ones(5, 3, requires_grad=True)
    q = torch.randn(2, 3, requires_grad=True)
    m = dknn(q, y, 2)  # identical neighbours: shared membership k / N
    torch.testing.assert_close(m, torch.full((2, 5), 0.4))
    m.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(y.grad).all()
    assert dknn(torch.zeros(0, 3), torch.randn(4, 3), 2).shape == (0, 4)
    torch.testing.assert_close(dknn(torch.randn(2, 3), torch.randn(1, 3), 1), torch.ones(2, 1))
    assert dknn(torch.randn(2, 3).bfloat16(), torch.randn(4, 3).bfloat16(), 2).dtype == torch.bfloat16
    assert dknn(torch.randn(2, 3), torch.randn(4, 3).double(), 2).dtype == torch.float64


def test_dknn_classifies_separated_blobs() -> None:
    g = torch.Generator().manual_seed(6)
    centres = torch.tensor([[0.0, 0.0], [6.0, 0.0], [0.0, 6.0]])
    labels = torch.arange(3).repeat_interleave(10)
    train = centres[labels] + 0.5 * torch.randn(30, 2, generator=g)
    test_y = torch.arange(3).repeat_interleave(4)
    test = centres[test_y] + 0.5 * torch.randn(12, 2, generator=g)
    scores = dknn_class_scores(dknn(test, train, 5, tau=1.0), labels, 3)
    torch.testing.assert_close(scores.sum(-1), torch.full((12,), 5.0))
    assert torch.equal(scores.argmax(-1), test_y)


def test_dknn_errors() -> None:
    q, y = torch.randn(2, 3), torch.randn(4, 3)
    with pytest.raises(ValueError, match=r"`k` must be in \[1, 4\] \(number of neighbours N = 4\), got 5"):
        dknn(q, y, 5)
    with pytest.raises(ValueError, match=r"`k` must be in \[1, 4\]"):
        dknn(q, y, 0)
    with pytest.raises(ValueError, match="`query` must have at least 2 dimensions"):
        dknn(torch.randn(3), y, 1)
    with pytest.raises(ValueError, match="`neighbors` must have at least 2 dimensions"):
        dknn(q, torch.randn(3), 1)
    with pytest.raises(ValueError, match="same feature size, got 3 and 2"):
        dknn(q, torch.randn(4, 2), 1)
    with pytest.raises(TypeError, match="`query` must be a floating-point tensor"):
        dknn(q.long(), y, 1)
    with pytest.raises(ValueError, match="`method` must be one of 'deterministic', 'stochastic'; got 'soft'"):
        dknn(q, y, 1, method="soft")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`tau` must be finite and > 0, got -1"):
        dknn(q, y, 1, tau=-1)
    with pytest.raises(ValueError, match="`n_samples` must be >= 1, got 0"):
        dknn(q, y, 1, method="stochastic", n_samples=0)


def test_class_scores() -> None:
    g = torch.Generator().manual_seed(7)
    m = torch.rand(2, 3, 6, generator=g, dtype=torch.float64)
    labels = torch.tensor([0, 3, 1, 3, 3, 0])
    c = dknn_class_scores(m, labels, 4)
    expected = torch.zeros(2, 3, 4, dtype=torch.float64)
    for a in range(2):
        for b in range(3):
            for j in range(6):
                expected[a, b, labels[j]] += m[a, b, j]
    torch.testing.assert_close(c, expected)
    torch.testing.assert_close(DKNNClassScores(4)(m, labels), c)
    assert gradcheck(lambda mm: dknn_class_scores(mm, labels, 4), m)
    with pytest.raises(TypeError, match=r"`labels` must be an integer tensor, got dtype torch\.float32"):
        dknn_class_scores(m, labels.float(), 4)
    with pytest.raises(ValueError, match=r"`labels` must have shape \(\.\.\., N\) with N = 6, got shape \(5,\)"):
        dknn_class_scores(m, labels[:5], 4)
    with pytest.raises(ValueError, match="`num_classes` must be >= 1, got 0"):
        dknn_class_scores(m, labels, 0)
    with pytest.raises(ValueError, match="`membership` must have at least 2 dimensions"):
        dknn_class_scores(m[0, 0], labels, 4)


def test_registered() -> None:
    assert {"soft_topk", "dknn", "dknn_class_scores"} <= set(rankwise.list_ops())
    assert case_entry("op", "dknn.stochastic").stochastic  # dknn(..., method="stochastic")


# ----------------------------------------------------------------------------------------------
# soft_topk over every method
# ----------------------------------------------------------------------------------------------
DATA = Path(__file__).parent / "data"

#: (method options, temperature option, a small temperature) of each deterministic configuration
METHODS: dict[str, tuple[dict[str, Any], str, float]] = {
    "neuralsort": ({"method": "neuralsort"}, "tau", 1e-3),
    "softsort": ({"method": "softsort"}, "tau", 1e-3),
    "isotonic": ({"method": "isotonic"}, "regularization_strength", 1e-3),
    "isotonic_kl": ({"method": "isotonic", "regularization": "kl"}, "regularization_strength", 1e-3),
    "sparse": ({"method": "sparse"}, "regularization_strength", 1e-3),
    "sparse_p43": ({"method": "sparse", "p": 4.0 / 3.0}, "regularization_strength", 1e-3),
    "sparse_dykstra": ({"method": "sparse", "solver": "dykstra"}, "regularization_strength", 1e-3),
    "ot": ({"method": "ot", "max_iter": 2000}, "epsilon", 2e-3),
    "diffsort": ({"method": "diffsort"}, "steepness", 1e4),
}
#: the configurations whose entries stay in [0, 1] (NeuralSort / SoftSort rows may exceed 1)
BOUNDED = [m for m in METHODS if m not in ("neuralsort", "softsort")]
#: the configurations differentiated exactly (ot: the scale of the cost is held constant)
EXACT = [m for m in METHODS if m != "ot"]


def _opts(name: str, temperature: float | None = None) -> dict[str, Any]:
    options, temp, _ = METHODS[name]
    return {**options, temp: temperature} if temperature is not None else dict(options)


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_sums_to_k_and_tends_to_hard_topk(name: str) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 9, generator=g, dtype=torch.float64) * 2
    temps = {"tau": 0.5, "regularization_strength": 0.5, "epsilon": 0.1, "steepness": 2.0}
    _, temp, small = METHODS[name]
    for k in (1, 4, 9):
        m = soft_topk(x, k, **_opts(name, temps[temp]))
        assert m.shape == x.shape and m.dtype == x.dtype
        assert (m >= 0).all()
        if name in BOUNDED:
            assert (m <= 1 + 1e-12).all()
        # the sum is exact: a tolerance of a few ulps of k, whatever n
        torch.testing.assert_close(m.sum(-1), torch.full((4,), float(k), dtype=torch.float64), rtol=0, atol=1e-9)
    # the hard top-k as the temperature goes to 0 (distinct scores at least 0.05 apart)
    xs = torch.tensor([[0.3, 2.0, -1.0, 1.5, 0.8, -0.4], [5.0, -3.0, 0.1, 0.0, 2.2, 1.0]], dtype=torch.float64)
    torch.testing.assert_close(soft_topk(xs, 3, **_opts(name, small)), hard_topk(xs, 3), rtol=0, atol=1e-3)


@pytest.mark.parametrize("name", EXACT)
def test_every_method_gradcheck_float64(name: str) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 6, generator=g, dtype=torch.float64).requires_grad_()
    temps = {"tau": 0.7, "regularization_strength": 1.5, "epsilon": 0.3, "steepness": 3.0}
    opts = _opts(name, temps[METHODS[name][1]])
    assert gradcheck(lambda s: soft_topk(s, 2, **opts), x)
    assert gradcheck(
        lambda s: soft_topk(s, 3, dim=0, descending=False, **opts), x.detach().t().clone().requires_grad_()
    )


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_degenerate_dims_and_dtypes(name: str) -> None:
    opts = _opts(name)
    # n = 1, k = n
    torch.testing.assert_close(soft_topk(torch.tensor([[2.0]]), 1, **opts), torch.ones(1, 1))
    x = torch.randn(3, 5, dtype=torch.float64)
    full = soft_topk(x, 5, **opts)
    torch.testing.assert_close(full.sum(-1), torch.full((3,), 5.0, dtype=torch.float64))
    if name in BOUNDED:
        torch.testing.assert_close(full, torch.ones_like(x))
    # all ties: the uniform k / n (every method but the sorting network, whose blend is not symmetric)
    ties = soft_topk(torch.full((2, 5), 0.3, dtype=torch.float64), 2, **opts)
    torch.testing.assert_close(ties.sum(-1), torch.full((2,), 2.0, dtype=torch.float64))
    if name != "diffsort":
        torch.testing.assert_close(ties, torch.full((2, 5), 0.4, dtype=torch.float64))
    # leading dims and dim != -1
    y = torch.randn(2, 7, 3, dtype=torch.float64)
    torch.testing.assert_close(soft_topk(y, 3, dim=1, **opts), soft_topk(y.movedim(1, -1), 3, **opts).movedim(-1, 1))
    torch.testing.assert_close(SoftTopK(3, dim=1, **opts)(y), soft_topk(y, 3, dim=1, **opts))
    # descending=False: the k smallest
    torch.testing.assert_close(soft_topk(y, 2, descending=False, **opts), soft_topk(-y, 2, **opts))
    # fp16 / bf16 inputs are computed in float32
    z = torch.randn(3, 6)
    for half in (torch.float16, torch.bfloat16):
        got = soft_topk(z.to(half), 2, **opts)
        assert got.dtype == half
        torch.testing.assert_close(got, soft_topk(z.to(half).float(), 2, **opts).to(half))
    # a non-finite slice is NaN, the others are untouched
    bad = torch.tensor([[1.0, math.nan, 0.0], [1.0, 2.0, 0.0]], dtype=torch.float64)
    out = soft_topk(bad, 2, **opts)
    assert torch.isnan(out[0]).all() and torch.isfinite(out[1]).all()


def test_method_options_and_errors() -> None:
    x = torch.randn(2, 5)
    with pytest.raises(TypeError, match=r"soft_topk\(method='isotonic'\) got unexpected keyword argument\(s\) 'tau'"):
        soft_topk(x, 2, method="isotonic", tau=0.1)
    with pytest.raises(ValueError, match="`p` must be 2 or 4/3"):
        soft_topk(x, 2, method="sparse", p=3.0)
    with pytest.raises(ValueError, match="`solver='dykstra'` supports p = 2 only"):
        soft_topk(x, 2, method="sparse", p=4.0 / 3.0, solver="dykstra")
    with pytest.raises(ValueError, match="`solver` must be one of"):
        soft_topk(x, 2, method="sparse", solver="cvx")
    with pytest.raises(ValueError, match="`regularization` must be one of"):
        soft_topk(x, 2, method="isotonic", regularization="l1")
    with pytest.raises(ValueError, match="`epsilon` must be finite and > 0"):
        soft_topk(x, 2, method="ot", epsilon=0.0)
    with pytest.raises(ValueError, match=r"`k` must be in \[1, 5\]"):
        soft_topk(x, 0, method="sparse")
    with pytest.raises(TypeError, match="`descending` must be a bool"):
        soft_topk(x, 2, descending=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`method` 'ot' defines no relaxed top-k values"):
        soft_topk_values(x, 2, method="ot")
    for method in ("sparse", "perturbed"):
        with pytest.raises(ValueError, match=f"`method` '{method}' defines no relaxed top-k values"):
            soft_topk_values(x, 2, method=method)
    with pytest.raises(ValueError, match="`method` 'sparse' defines no relaxed top-k values"):
        SoftTopKValues(2, method="sparse")
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        SoftTopK(2, method="ot", tau=1.0)
    assert "method='sparse'" in repr(SoftTopK(2, method="sparse", p=2.0))


def _capped_simplex_slsqp(x: np.ndarray, k: int, lam: float, kind: str) -> np.ndarray:
    """argmax_{y in [0,1]^n, sum y = k} <y, x> - lam * R(y) by scipy's general SLSQP solver:
    R = ||y||_2^2 / 2, ||y||_{4/3}^{4/3} * 3/4, or sum y log y - y (kl, on z = x / lam)."""
    optimize = pytest.importorskip("scipy.optimize")
    n = x.size

    def obj(y: np.ndarray) -> float:
        if kind == "l2":
            return float(-(y @ x) + lam * 0.5 * (y @ y))
        if kind == "p43":
            return float(-(y @ x) + lam * 0.75 * np.sum(np.abs(y) ** (4.0 / 3.0)))
        yy = np.clip(y, 1e-300, None)
        return float(np.sum(yy * np.log(yy) - yy) - y @ (x / lam))

    res = optimize.minimize(
        obj,
        np.full(n, k / n),
        method="SLSQP",
        bounds=[(0.0, 1.0)] * n,
        constraints=[{"type": "eq", "fun": lambda y: y.sum() - k}],
        options={"ftol": 1e-14, "maxiter": 500},
    )
    return np.asarray(res.x)


@pytest.mark.parametrize(
    ("name", "kind"),
    [("isotonic", "l2"), ("sparse", "l2"), ("sparse_dykstra", "l2"), ("sparse_p43", "p43"), ("isotonic_kl", "kl")],
)
def test_projections_match_a_general_solver(name: str, kind: str) -> None:
    rng = np.random.default_rng(3)
    for n, k, lam in ((6, 2, 1.0), (7, 3, 0.5), (5, 1, 2.0), (8, 5, 0.3)):
        x = rng.normal(size=n)
        want = _capped_simplex_slsqp(x, k, lam, kind)
        got = soft_topk(torch.tensor(x), k, **_opts(name, lam)).numpy()
        np.testing.assert_allclose(got, want, atol=2e-4)


def test_sparse_p2_and_isotonic_l2_agree() -> None:
    """Two implementations of the l2 top-k projection: the PAV kernels and the exact threshold solve."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(16, 40, generator=g, dtype=torch.float64) * 3
    for k in (1, 7, 39):
        for lam in (0.05, 1.0, 20.0):
            a = soft_topk(x, k, method="isotonic", regularization_strength=lam)
            b = soft_topk(x, k, method="sparse", regularization_strength=lam)
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_ot_matches_converged_plain_sinkhorn() -> None:
    """An independent loop: plain (not log-domain) Sinkhorn scaling to convergence, in numpy."""
    rng = np.random.default_rng(5)
    for n, k, eps in ((6, 2, 0.2), (9, 4, 0.1)):
        x = rng.normal(size=n)
        c = -x
        cost = np.stack([c**2, (c - 1.0) ** 2], axis=1)
        kern = np.exp(-cost / cost.max() / eps)
        mu, nu = np.full(n, 1.0 / n), np.array([k / n, (n - k) / n])
        b = np.ones(2)
        for _ in range(20000):
            a = mu / (kern @ b)
            b = nu / (kern.T @ a)
        want = n * a * kern[:, 0] * b[0]
        got = soft_topk(torch.tensor(x), k, method="ot", epsilon=eps, max_iter=5000).numpy()
        np.testing.assert_allclose(got, want, atol=1e-10)


def _reference(method: str) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = json.loads((DATA / f"{method}_topk_reference.json").read_text())["cases"]
    return cases


@pytest.mark.parametrize(
    "case",
    _reference("sparse"),
    ids=lambda c: f"n{len(c['x'])}k{c['k']}p{c['p']:.2f}{c['solver']}l{c['regularization_strength']}",
)
def test_sparse_matches_the_authors_jax_code(case: dict[str, Any]) -> None:
    """Reference values of the authors' JAX package (tools/topk_reference.py; float32 there)."""
    x = torch.tensor(case["x"], dtype=torch.float64, requires_grad=True)
    opts = {"p": case["p"], "regularization_strength": case["regularization_strength"], "solver": case["solver"]}
    m = soft_topk(x, case["k"], method="sparse", **opts)
    torch.testing.assert_close(m, torch.tensor(case["out"], dtype=torch.float64), rtol=0, atol=1e-5)
    if case["p"] == 2.0:  # the l2 isotonic top-k (the PAV kernels) is the same projection
        iso = soft_topk(x, case["k"], method="isotonic", regularization_strength=case["regularization_strength"])
        torch.testing.assert_close(iso, torch.tensor(case["out"], dtype=torch.float64), rtol=0, atol=1e-5)
    (grad,) = torch.autograd.grad((m * torch.tensor(case["g"], dtype=torch.float64)).sum(), x)
    tied = len(set(case["x"])) < len(case["x"])
    if tied and case["solver"] == "pav" and torch.equal(m.detach(), m.detach().round()):
        # tied scores with a 0/1 mask: the mask is locally constant, so its derivative is 0; the
        # authors' PAV pools equal adjacent entries and returns that block's average instead
        assert torch.equal(grad, torch.zeros_like(grad))
        return
    torch.testing.assert_close(grad, torch.tensor(case["vjp"], dtype=torch.float64), rtol=0, atol=1e-4)


@pytest.mark.parametrize("case", _reference("ot"), ids=lambda c: f"n{len(c['x'])}k{c['k']}eps{c['epsilon']}")
def test_ot_matches_the_authors_pytorch_code(case: dict[str, Any]) -> None:
    """Reference values of the authors' ``TopK_custom`` (tools/topk_reference.py), float64."""
    x = torch.tensor(case["x"], dtype=torch.float64, requires_grad=True)
    m = soft_topk(x, case["k"], method="ot", epsilon=case["epsilon"], max_iter=case["max_iter"])
    torch.testing.assert_close(m, torch.tensor(case["out"], dtype=torch.float64), rtol=0, atol=1e-12)
    (grad,) = torch.autograd.grad((m * torch.tensor(case["g"], dtype=torch.float64)).sum(), x)
    torch.testing.assert_close(grad, torch.tensor(case["vjp"], dtype=torch.float64), rtol=0, atol=1e-10)


def test_sparse_is_sparse_and_isotonic_kl_is_softmax_for_k1() -> None:
    x = torch.tensor([3.0, 2.9, 0.0, -1.0, 2.5], dtype=torch.float64)
    m = soft_topk(x, 2, method="sparse", p=4.0 / 3.0, regularization_strength=1.0)
    assert (m == 0).sum() == 2 and (m > 0).sum() == 3
    torch.testing.assert_close(
        soft_topk(x, 1, method="isotonic", regularization="kl", regularization_strength=0.5), torch.softmax(x / 0.5, 0)
    )


def test_perturbed_method_is_perturbed_topk() -> None:
    x = torch.randn(3, 6)
    got = soft_topk(x, 2, method="perturbed", sigma=0.3, n_samples=50, generator=torch.Generator().manual_seed(0))
    want = rankwise.perturbed_topk(x, 2, sigma=0.3, n_samples=50, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(got, want)
    low = soft_topk(x, 2, method="perturbed", descending=False, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(low, rankwise.perturbed_topk(-x, 2, generator=torch.Generator().manual_seed(0)))


@pytest.mark.parametrize("network", ["odd_even", "bitonic"])
@pytest.mark.parametrize("error_free", [False, True])
def test_diffsort_method_is_the_networks_first_columns_summed(network: str, error_free: bool) -> None:
    """The matrix-free route (P @ u through the layers' transposes) equals the first k columns of
    rankwise.diffsort's matrix summed, values and gradients, for every n up to a few powers of two
    (bitonic pads) and k in 1..n; error-free: the exact 0/1 membership forward."""
    gen = torch.Generator().manual_seed(3)
    for n in (1, 2, 3, 5, 8, 11):
        for k in sorted({1, max(1, n // 2), n}):
            x = torch.randn(3, 2, n, generator=gen, dtype=torch.float64, requires_grad=True)
            opts = {"network": network, "steepness": 5.0, "error_free": error_free}
            got = soft_topk(x, k, method="diffsort", **opts)
            _, p = rankwise.diffsort(x, descending=True, **opts)
            want = p[..., :k].sum(-1)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-13)
            w = torch.randn(got.shape, generator=gen, dtype=torch.float64)
            (g_got,) = torch.autograd.grad((got * w).sum(), x)
            (g_want,) = torch.autograd.grad((want * w).sum(), x)
            torch.testing.assert_close(g_got, g_want, rtol=0, atol=1e-12)
            if error_free:
                exact = torch.zeros_like(x).scatter(-1, x.topk(k, dim=-1).indices, 1.0)
                assert torch.equal(got.detach(), exact)
    y = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda s: soft_topk(s, 2, method="diffsort", network=network, steepness=3.0), y)


def test_diffsort_method_never_builds_the_matrix() -> None:
    """A bitonic membership of 4,096 scores (a 4,096 x 4,096 matrix would be 64 MB in float32) allocates
    O(L n): far less than n^2 floats."""
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(1, 4096, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        soft_topk(x, 10, method="diffsort", network="bitonic").sum().backward()
    largest = max((e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0), default=0)
    assert largest < 4096 * 4096 * 4 / 8, largest


@pytest.mark.parametrize("name", ["neuralsort", "softsort", "isotonic", "diffsort"])
def test_soft_topk_values(name: str) -> None:
    opts = _opts(name)
    x = torch.randn(2, 8, 3, dtype=torch.float64)
    v = soft_topk_values(x, 3, dim=1, **opts)
    assert v.shape == (2, 3, 3)
    torch.testing.assert_close(SoftTopKValues(3, dim=1, **opts)(x), v)
    _, temp, small = METHODS[name]
    hard = soft_topk_values(x, 3, dim=1, **{**opts, temp: small})
    torch.testing.assert_close(hard, torch.topk(x, 3, dim=1).values, rtol=0, atol=1e-3)
    low = soft_topk_values(x, 2, dim=1, descending=False, **{**opts, temp: small})
    torch.testing.assert_close(low, torch.topk(x, 2, dim=1, largest=False).values, rtol=0, atol=1e-3)
    assert gradcheck(lambda s: soft_topk_values(s, 2, **opts), torch.randn(2, 5, dtype=torch.float64).requires_grad_())
    assert soft_topk_values(torch.randn(2, 5).half(), 2, **opts).dtype == torch.float16


@pytest.mark.parametrize("name", list(METHODS))
def test_the_sum_is_k_for_long_rows(name: str) -> None:
    """The sum stays k to 1e-12 k for long rows: a fixed tolerance, far above the rounding of a float64
    (pairwise) sum of n terms, eps log2(n) k, and far below any error of the method."""
    n = 64 if name == "diffsort" else 2000
    x = torch.randn(2, n, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    temps = {"tau": 0.5, "regularization_strength": 0.5, "epsilon": 0.1, "steepness": 2.0}
    for k in (1, n // 3):
        m = soft_topk(x, k, **_opts(name, temps[METHODS[name][1]]))
        assert (m.sum(-1) - k).abs().max() <= 1e-12 * k


def test_ot_backward_is_the_derivative_at_a_fixed_cost_scale() -> None:
    """Finite differences of the scores other than the one that sets the cost's scale (its largest
    entry; the authors' backward, like ours, holds that scale constant) match the implicit backward."""
    x = torch.tensor([0.3, -0.9, 1.4, 0.1, -0.2, 0.7], dtype=torch.float64)
    opts = {"method": "ot", "epsilon": 0.2, "max_iter": 3000}
    jac = torch.autograd.functional.jacobian(lambda s: soft_topk(s, 2, **opts), x)
    scale_entry = int(torch.argmax(torch.maximum(x**2, (x + 1) ** 2)))
    h = 1e-6
    for j in range(x.numel()):
        if j == scale_entry:
            continue
        e = torch.zeros_like(x)
        e[j] = h
        fd = (soft_topk(x + e, 2, **opts) - soft_topk(x - e, 2, **opts)) / (2 * h)
        torch.testing.assert_close(jac[:, j], fd, rtol=0, atol=1e-7)
