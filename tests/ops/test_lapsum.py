"""LapSum soft rank / sort / top-k: parity with the authors' code and a slow implementation, limits, edges.

``data/lapsum_reference.npz`` holds inputs, outputs and vector-Jacobian products of the authors'
PyTorch extensions (github.com/gmum/LapSum), written by ``tools/lapsum_reference.py``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import rankwise
from rankwise import LapSumRank, LapSumSort, LapSumTopK, lapsum_rank, lapsum_sort, lapsum_topk
from tests.conftest import gradcheck

REFERENCE = Path(__file__).parent / "data" / "lapsum_reference.npz"


# ----------------------------------------------------------------------------------------------
# an independent slow implementation (float64, loops and bisection)
# ----------------------------------------------------------------------------------------------
def _cdf(t: float) -> float:
    return 0.5 * math.exp(t) if t <= 0 else 1 - 0.5 * math.exp(-t)


def _pdf(t: float) -> float:
    return 0.5 * math.exp(-abs(t))


def slow_rank(x: list[float], alpha: float) -> list[float]:
    """r_i = 1/2 + sum_j F((x_i - x_j) / alpha)."""
    return [0.5 + sum(_cdf((a - b) / alpha) for b in x) for a in x]


def _bisect(f: Any, lo: float, hi: float) -> float:
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return 0.5 * (lo + hi)


def slow_sort(x: list[float], alpha: float) -> list[float]:
    """s_i solves sum_j F((s - x_j) / alpha) = i - 1/2, by bisection."""
    n, span = len(x), 50 * alpha + max(x) - min(x)
    return [
        _bisect(lambda s, i=i: sum(_cdf((s - b) / alpha) for b in x) - (i + 0.5), min(x) - span, max(x) + span)
        for i in range(n)
    ]


def slow_topk(x: list[float], k: float, alpha: float) -> list[float]:
    """p_j = F((x_j - b) / alpha) with sum_j p_j = k, b by bisection."""
    span = 50 * alpha + max(x) - min(x)
    b = _bisect(lambda t: k - sum(_cdf((a - t) / alpha) for a in x), min(x) - span, max(x) + span)
    return [_cdf((a - b) / alpha) for a in x]


def slow_rank_jacobian(x: list[float], alpha: float) -> torch.Tensor:
    """dr_i/dx_k = (delta_ik sum_j f((x_i - x_j)/alpha) - f((x_i - x_k)/alpha)) / alpha."""
    n = len(x)
    f = torch.tensor([[_pdf((a - b) / alpha) for b in x] for a in x], dtype=torch.float64)
    return (torch.diag(f.sum(1)) - f) / alpha + torch.zeros(n, n, dtype=torch.float64)


def implicit_sort_jacobian(s: torch.Tensor, x: torch.Tensor, alpha: float) -> torch.Tensor:
    """ds_i/dx_j = f(s_i - x_j) / sum_l f(s_i - x_l), from G(s_i) = const (rows: outputs)."""
    f = torch.exp(-(s[..., :, None] - x[..., None, :]).abs() / alpha)
    return f / f.sum(-1, keepdim=True)


def _x(*shape: int, dtype: torch.dtype = torch.float64, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


# ----------------------------------------------------------------------------------------------
# the authors' code
# ----------------------------------------------------------------------------------------------
def _reference_cases() -> list[dict[str, Any]]:
    data = np.load(REFERENCE)
    keys = sorted({k.split("/")[0] for k in data.files})
    cases = []
    for key in keys:
        op, name, alpha, desc, k = (str(v) for v in data[f"{key}/meta"])
        cases.append(
            {
                "op": op,
                "name": name,
                "alpha": float(alpha),
                "descending": desc == "True",
                "k": float(k),
                **{f: data[f"{key}/{f}"] for f in ("x", "v", "out", "grad")},
            }
        )
    return cases


CASES = _reference_cases()


def _ours(case: dict[str, Any], x: torch.Tensor) -> torch.Tensor:
    op, alpha, desc = case["op"], case["alpha"], case["descending"]
    if op == "rank":
        return lapsum_rank(x, alpha, descending=desc) - 1  # the authors' ranks are 0-based
    if op == "sort":
        return lapsum_sort(x, alpha, descending=desc)
    return lapsum_topk(x, case["k"], alpha, descending=desc)


def _tolerance(dtype: np.dtype) -> dict[str, float]:
    return {"rtol": 1e-10, "atol": 1e-10} if dtype == np.float64 else {"rtol": 1e-5, "atol": 1e-5}


def _authors_sort_vjp_is_valid(case: dict[str, Any]) -> bool:
    """The authors' soft-sort backward returns zeros for a descending sort (their ``alpha < 0``) and
    overflows at small ``alpha``; it is compared where it is the implicit-function gradient."""
    return case["op"] != "sort" or (not case["descending"] and case["alpha"] >= 0.5)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['op']}-{c['name']}-{c['x'].dtype}-a{c['alpha']}")
def test_equals_the_authors_code(case: dict[str, Any]) -> None:
    x = torch.from_numpy(case["x"]).requires_grad_()
    out = _ours(case, x)
    assert out.dtype == x.dtype
    tol = _tolerance(case["x"].dtype)
    scale = max(1.0, float(np.abs(case["grad"]).max()))
    torch.testing.assert_close(out.detach(), torch.from_numpy(case["out"]), **tol)
    (grad,) = torch.autograd.grad(out, x, torch.from_numpy(case["v"]))
    if _authors_sort_vjp_is_valid(case):
        torch.testing.assert_close(grad, torch.from_numpy(case["grad"]), rtol=tol["rtol"], atol=tol["atol"] * scale)
    else:  # the implicit-function gradient, from the authors' sorted values
        s = torch.from_numpy(case["out"]).double()
        x64 = x.detach().double()
        jac = implicit_sort_jacobian(s, x64, case["alpha"])
        expected = (torch.from_numpy(case["v"]).double()[..., :, None] * jac).sum(-2)
        torch.testing.assert_close(grad.double(), expected, rtol=tol["rtol"], atol=tol["atol"] * 10)


def test_reference_covers_every_operator_direction_and_dtype() -> None:
    seen = {(c["op"], c["descending"], str(c["x"].dtype)) for c in CASES}
    assert seen == {
        (op, d, t) for op in ("rank", "sort", "topk") for d in (False, True) for t in ("float32", "float64")
    }
    assert {c["name"] for c in CASES} >= {"ties_2x6", "n1_3x1", "n2_3x2"}


# ----------------------------------------------------------------------------------------------
# the slow implementation
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [0.03, 0.3, 3.0])
def test_matches_the_slow_implementation(alpha: float) -> None:
    x = _x(3, 9)
    x[1, 4] = x[1, 2]  # a tie
    rank, srt = lapsum_rank(x, alpha), lapsum_sort(x, alpha)

    def close(out: torch.Tensor, expected: list[float], atol: float = 1e-10) -> None:
        torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=atol)

    for b in range(3):
        row = x[b].tolist()
        close(rank[b], slow_rank(row, alpha), atol=1e-12)
        close(srt[b], slow_sort(row, alpha))
        for k in (1, 2.5, 4, 8):
            close(lapsum_topk(x[b], k, alpha), slow_topk(row, k, alpha))
            close(lapsum_topk(x[b], k, alpha, descending=False), slow_topk([-v for v in row], k, alpha))


def test_gradients_are_the_closed_form_jacobians() -> None:
    x = _x(7, seed=3)
    x[5] = x[1]  # ties: F is C^1, the Jacobian is the density there too
    alpha = 0.4
    jac = torch.autograd.functional.jacobian(lambda t: lapsum_rank(t, alpha), x)
    torch.testing.assert_close(jac, slow_rank_jacobian(x.tolist(), alpha), rtol=1e-12, atol=1e-12)
    s = lapsum_sort(x, alpha)
    jac = torch.autograd.functional.jacobian(lambda t: lapsum_sort(t, alpha), x)
    torch.testing.assert_close(jac, implicit_sort_jacobian(s, x, alpha), rtol=1e-10, atol=1e-12)
    # top-k: dp_j/dx_l = f_j (delta_jl - f_l / sum f) / alpha, f_j = f((x_j - b) / alpha)
    p = lapsum_topk(x, 3, alpha)
    f = torch.where(p <= 0.5, p, 1 - p)  # the density f((x_j - b) / alpha), read off p_j = F(...)
    expected = (torch.diag(f) - f[:, None] * f[None, :] / f.sum()) / alpha
    jac = torch.autograd.functional.jacobian(lambda t: lapsum_topk(t, 3, alpha), x)
    torch.testing.assert_close(jac, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("descending", [False, True])
def test_gradcheck(descending: bool) -> None:
    x = _x(2, 6, seed=1)
    x[0, 3] = x[0, 1]
    for alpha in (0.2, 1.5):
        assert gradcheck(lambda t, a=alpha: lapsum_rank(t, a, descending=descending), x)
        assert gradcheck(lambda t, a=alpha: lapsum_sort(t, a, descending=descending), x)
        for k in (1, 2.5, 5):
            assert gradcheck(lambda t, a=alpha, kk=k: lapsum_topk(t, kk, a, descending=descending), x)


# ----------------------------------------------------------------------------------------------
# properties and limits
# ----------------------------------------------------------------------------------------------
def test_properties(dtype: torch.dtype) -> None:
    x = _x(16, 11, dtype=dtype)
    for alpha in (0.05, 0.5, 5.0):
        r = lapsum_rank(x, alpha)
        torch.testing.assert_close(r.sum(-1), torch.full((16,), 66.0, dtype=dtype))
        assert (torch.argsort(r, -1) == torch.argsort(x, -1)).all()  # order-preserving
        s = lapsum_sort(x, alpha)
        assert (s.diff(dim=-1) > 0).all()
        p = lapsum_topk(x, 4, alpha)
        assert ((p >= 0) & (p <= 1)).all()
        torch.testing.assert_close(p.sum(-1), torch.full((16,), 4.0, dtype=dtype))
        torch.testing.assert_close(lapsum_topk(x, 4.5, alpha).sum(-1), torch.full((16,), 4.5, dtype=dtype))


def test_small_alpha_gives_the_hard_rank_sort_and_topk() -> None:
    x = _x(5, 8)
    alpha = 1e-4
    torch.testing.assert_close(lapsum_rank(x, alpha), rankwise.rank(x).double())
    torch.testing.assert_close(lapsum_rank(x, alpha, descending=True), rankwise.rank(x, descending=True).double())
    torch.testing.assert_close(lapsum_sort(x, alpha), torch.sort(x).values)
    torch.testing.assert_close(lapsum_sort(x, alpha, descending=True), torch.sort(x, descending=True).values)
    hard = torch.zeros_like(x).scatter(-1, x.topk(3).indices, 1.0)
    torch.testing.assert_close(lapsum_topk(x, 3, alpha), hard)
    low = torch.zeros_like(x).scatter(-1, (-x).topk(3).indices, 1.0)
    torch.testing.assert_close(lapsum_topk(x, 3, alpha, descending=False), low)


def test_large_alpha_gives_the_mean_rank_and_k_over_n() -> None:
    x = _x(3, 6)
    torch.testing.assert_close(lapsum_rank(x, 1e8), torch.full_like(x, 3.5))
    torch.testing.assert_close(lapsum_topk(x, 2, 1e8), torch.full_like(x, 2 / 6))


def test_descending_is_the_ascending_operator_on_the_negated_input() -> None:
    x = _x(4, 7)
    torch.testing.assert_close(lapsum_rank(x, 0.3, descending=True), lapsum_rank(-x, 0.3))
    torch.testing.assert_close(lapsum_rank(x, 0.3, descending=True), 8 - lapsum_rank(x, 0.3))
    torch.testing.assert_close(lapsum_sort(x, 0.3, descending=True), -lapsum_sort(-x, 0.3))
    torch.testing.assert_close(lapsum_topk(x, 2, 0.3), lapsum_topk(-x, 2, 0.3, descending=False))


# ----------------------------------------------------------------------------------------------
# edge cases
# ----------------------------------------------------------------------------------------------
def test_n_equals_one_and_empty() -> None:
    x = torch.tensor([[0.7], [-2.0]], dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(lapsum_rank(x, 0.5), torch.ones_like(x))
    torch.testing.assert_close(lapsum_sort(x, 0.5), x)
    torch.testing.assert_close(lapsum_topk(x, 1, 0.5), torch.ones_like(x))
    (g,) = torch.autograd.grad(lapsum_sort(x, 0.5).sum(), x)
    torch.testing.assert_close(g, torch.ones_like(x))
    for shape in [(0,), (3, 0), (0, 4)]:
        e = torch.zeros(shape, requires_grad=True)
        assert lapsum_rank(e).shape == shape and lapsum_sort(e).shape == shape
        lapsum_sort(e).sum().backward()
    assert lapsum_topk(torch.zeros(0, 4), 2).shape == (0, 4)
    with pytest.raises(ValueError, match="k"):
        lapsum_topk(torch.zeros(3, 0), 1)


def test_all_ties() -> None:
    x = torch.full((2, 5), 0.3, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(lapsum_rank(x, 0.5), torch.full_like(x, 3.0))
    torch.testing.assert_close(lapsum_topk(x, 2, 0.5), torch.full_like(x, 0.4))
    s = lapsum_sort(x, 0.5)
    torch.testing.assert_close(s[0, 2], torch.tensor(0.3, dtype=torch.float64))  # the median is the value
    assert (s.diff(dim=-1) > 0).all()  # soft order statistics spread around the value
    torch.testing.assert_close(s.mean(-1), torch.full((2,), 0.3, dtype=torch.float64))
    for out in (lapsum_rank(x, 0.5), s, lapsum_topk(x, 2, 0.5)):
        (g,) = torch.autograd.grad(out.pow(2).sum(), x)
        assert torch.isfinite(g).all()
    # k = n selects everything
    torch.testing.assert_close(lapsum_topk(x, 5, 0.5), torch.ones_like(x))


def test_leading_dims_and_dim() -> None:
    x = _x(2, 3, 6)
    for fn in (
        lambda t, **kw: lapsum_rank(t, 0.4, **kw),
        lambda t, **kw: lapsum_sort(t, 0.4, **kw),
        lambda t, **kw: lapsum_topk(t, 2, 0.4, **kw),
    ):
        out = fn(x)
        assert out.shape == x.shape
        torch.testing.assert_close(out[1, 2], fn(x[1, 2]))
        torch.testing.assert_close(fn(x.movedim(-1, 1), dim=1), out.movedim(-1, 1))
        torch.testing.assert_close(fn(x.movedim(-1, 0), dim=0), out.movedim(-1, 0))


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_half_inputs_are_computed_in_float32(half: torch.dtype) -> None:
    x = _x(3, 8).to(half)
    x32 = x.float()
    r = lapsum_rank(x, 0.5)
    assert r.dtype == torch.float32
    torch.testing.assert_close(r, lapsum_rank(x32, 0.5))
    s = lapsum_sort(x, 0.5)
    assert s.dtype == half
    torch.testing.assert_close(s, lapsum_sort(x32, 0.5).to(half))
    p = lapsum_topk(x, 3, 0.5)
    assert p.dtype == half
    torch.testing.assert_close(p, lapsum_topk(x32, 3, 0.5).to(half))


def test_nonfinite_slices_are_nan() -> None:
    x = _x(3, 5)
    x[1, 2] = math.nan
    x[2, 0] = math.inf
    for out in (lapsum_rank(x), lapsum_sort(x), lapsum_topk(x, 2)):
        assert torch.isnan(out[1:]).all() and torch.isfinite(out[0]).all()


def test_soft_rank_and_soft_sort_method_lapsum() -> None:
    x = _x(3, 6)
    torch.testing.assert_close(rankwise.soft_rank(x, method="lapsum", alpha=0.3), lapsum_rank(x, 0.3))
    torch.testing.assert_close(
        rankwise.soft_sort(x, method="lapsum", alpha=0.3, descending=True), lapsum_sort(x, 0.3, descending=True)
    )
    torch.testing.assert_close(rankwise.soft_rank(x, method="lapsum", dim=0), lapsum_rank(x, dim=0))
    assert "lapsum" in rankwise.list_soft_methods()
    with pytest.raises(TypeError, match="alpha"):
        rankwise.soft_rank(x, method="lapsum", tau=0.3)


def test_modules() -> None:
    x = _x(3, 6)
    torch.testing.assert_close(LapSumRank(0.3, descending=True)(x), lapsum_rank(x, 0.3, descending=True))
    torch.testing.assert_close(LapSumSort(0.3, dim=0)(x), lapsum_sort(x, 0.3, dim=0))
    torch.testing.assert_close(LapSumTopK(2, 0.3)(x), lapsum_topk(x, 2, 0.3))
    assert "alpha=0.3" in repr(LapSumTopK(2, 0.3))


def test_errors() -> None:
    x = _x(3, 6)
    with pytest.raises(ValueError, match="alpha"):
        lapsum_rank(x, 0.0)
    with pytest.raises(ValueError, match="alpha"):
        lapsum_sort(x, -1.0)
    with pytest.raises(TypeError, match="alpha"):
        lapsum_topk(x, 2, "1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k"):
        lapsum_topk(x, 7)
    with pytest.raises(ValueError, match="k"):
        lapsum_topk(x, 0)
    with pytest.raises(TypeError, match="k"):
        lapsum_topk(x, True)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="x"):
        lapsum_rank(torch.arange(4))
    with pytest.raises(TypeError, match="descending"):
        lapsum_sort(x, descending=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k"):
        LapSumTopK(0)
    with pytest.raises(TypeError, match="k"):
        LapSumTopK("2")  # type: ignore[arg-type]


def test_second_derivatives_raise() -> None:
    x = _x(2, 6).requires_grad_()
    for out in (lapsum_rank(x, 0.4), lapsum_sort(x, 0.4), lapsum_topk(x, 2, 0.4)):
        (g,) = torch.autograd.grad(out[:, 2].sum(), x, retain_graph=True)  # a sparse incoming gradient
        assert torch.isfinite(g).all()
        with pytest.raises(RuntimeError, match="create_graph=True"):
            torch.autograd.grad(out[:, 2].sum(), x, create_graph=True)
