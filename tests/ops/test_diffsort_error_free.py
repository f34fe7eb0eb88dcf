"""Error-free differentiable sorting networks (Kim, Yoon & Cho, ICLR 2024): ``diffsort(..., error_free=True)``.

Parity with reference values of the authors' code (``tools/error_free_reference.py``), the exact
forward (``torch.sort``, an exact permutation matrix, ties, n = 0 / 1), the gradient against a
per-comparator transcription of the straight-through formulation (first and second order), a
float64 gradcheck of the backward against finite differences of the locally linearised network,
and soft_sort / soft_rank / the module twin.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rankwise import DiffSort, diffsort, soft_rank, soft_sort
from tests.conftest import gradcheck
from tests.ops.test_diffsort import DISTRIBUTIONS, NETWORKS, bitonic_network, odd_even_network, sigmoid_f

REFERENCE = Path(__file__).parent / "data" / "error_free_diffsort_reference.npz"


# ----------------------------------------------------------------------------------------------
# a per-comparator transcription: each swap is h + (s - sg(s)), h the hard and s the relaxed swap;
# with ``offsets`` each swap is instead s + c, c = (h - s) recorded at a base point (the network
# linearised there: its Jacobian at the base point is the error-free gradient)
# ----------------------------------------------------------------------------------------------
def slow_error_free(
    x: torch.Tensor,
    network: str,
    steepness: float,
    distribution: str,
    art_lambda: float = 0.25,
    offsets: list[Any] | None = None,
    record: list[Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One 1-D row: values and P (rows = inputs, columns = wires)."""
    n = x.shape[0]
    net = odd_even_network(n) if network == "odd_even" else bitonic_network(n)
    vals = list(x.unbind())
    cols = list(torch.eye(n, dtype=x.dtype).unbind(1))
    step = iter(offsets) if offsets is not None else None
    for layer in net:
        new_vals, new_cols = list(vals), list(cols)
        for lo, hi in layer:
            a, b = min(lo, hi), max(lo, hi)
            d = vals[b] - vals[a]
            alpha = sigmoid_f(steepness * d, d, distribution, art_lambda)
            soft = (
                alpha * vals[a] + (1 - alpha) * vals[b],
                (1 - alpha) * vals[a] + alpha * vals[b],
                alpha * cols[a] + (1 - alpha) * cols[b],
                (1 - alpha) * cols[a] + alpha * cols[b],
            )
            keep = bool(vals[a] <= vals[b])  # the hard swap: the min wire gets x_a (also on a tie)
            ca, cb = (cols[a], cols[b]) if keep else (cols[b], cols[a])
            hard = (torch.minimum(vals[a], vals[b]), torch.maximum(vals[a], vals[b]), ca, cb)
            if record is not None:
                record.append([(h - s).detach() for h, s in zip(hard, soft)])
            if step is not None:
                out = [s + c for s, c in zip(soft, next(step))]
            else:
                out = [s + (h - s).detach() for h, s in zip(hard, soft)]
            new_vals[lo], new_vals[hi], new_cols[lo], new_cols[hi] = out
        vals, cols = new_vals, new_cols
    return torch.stack(vals), torch.stack(cols, dim=1)


# ----------------------------------------------------------------------------------------------
# parity with the authors' code
# ----------------------------------------------------------------------------------------------
def _cases() -> list[str]:
    with np.load(REFERENCE) as data:
        return [str(c) for c in data["cases"]]


@pytest.mark.parametrize("case", _cases())
def test_matches_the_authors_code(case: str) -> None:
    data = np.load(REFERENCE)
    network = "odd_even" if case.startswith("odd_even") else "bitonic"
    n, distribution, steepness = case.removeprefix(network + "_n").split("_")
    kw = {"network": network, "distribution": distribution, "steepness": float(steepness), "error_free": True}
    ref = {k: torch.from_numpy(data[f"{case}_{k}"]) for k in ("x", "sorted", "matrix", "g_values", "g_matrix")}
    assert ref["x"].shape[-1] == int(n) and ref["x"].dtype == torch.float64
    x = ref["x"].clone().requires_grad_()
    s, p = diffsort(x, **kw)
    # the authors' h + (s - sg(s)) rounds; rankwise's forward is the exact swap
    torch.testing.assert_close(s, ref["sorted"], rtol=0, atol=1e-14)
    torch.testing.assert_close(p, ref["matrix"], rtol=0, atol=1e-14)
    (gv,) = torch.autograd.grad((s * ref["g_values"]).sum(), x)
    (gm,) = torch.autograd.grad((diffsort(x, **kw)[1] * ref["g_matrix"]).sum(), x)
    torch.testing.assert_close(gv, torch.from_numpy(data[f"{case}_grad_values"]), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gm, torch.from_numpy(data[f"{case}_grad_matrix"]), rtol=1e-10, atol=1e-12)
    assert float(gm.abs().max()) > 1e-2  # the reference gradients are not trivially zero


# ----------------------------------------------------------------------------------------------
# the exact forward
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("network", NETWORKS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forward_is_the_exact_sort(network: str, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(7)
    for n in (1, 2, 3, 5, 7, 8, 13, 16):
        x = torch.randn(4, n, generator=g).to(dtype)
        for descending in (False, True):
            s, p = diffsort(x, network=network, steepness=3.0, descending=descending, error_free=True)
            assert torch.equal(s, torch.sort(x, descending=descending).values)
            # P is the exact permutation matrix of the sort: x @ P == sorted, bit for bit
            assert torch.equal(p, p.round()) and torch.equal(p.sum(-1), torch.ones_like(x))
            assert torch.equal(p.sum(-2), torch.ones_like(x))
            assert torch.equal(torch.einsum("bi,bij->bj", x, p), s)
            assert torch.equal(p.argmax(-2), torch.sort(x, descending=descending).indices)
    x = torch.randn(3, 4, 5, generator=g)
    assert torch.equal(diffsort(x, dim=1, error_free=True, return_matrix=False), torch.sort(x, dim=1).values)


@pytest.mark.parametrize("network", NETWORKS)
def test_ties_and_degenerate_sizes(network: str) -> None:
    x = torch.tensor([[0.5, 0.5, 0.5, 0.5, 0.5], [2.0, 1.0, 2.0, 1.0, 2.0], [0.0, -1.0, 0.0, 3.0, -1.0]])
    xr = x.clone().double().requires_grad_()
    s, p = diffsort(xr, network=network, error_free=True)
    assert torch.equal(s.detach(), torch.sort(xr.detach()).values)
    assert torch.equal(p.sum(-1), torch.ones_like(s)) and torch.equal(p.sum(-2), torch.ones_like(s))
    assert torch.equal(torch.einsum("bi,bij->bj", xr.detach(), p.detach()), s.detach())
    ((s * torch.arange(5.0)).sum() + p.square().sum()).backward()
    assert xr.grad is not None and torch.isfinite(xr.grad).all()
    if network == "odd_even":  # no comparator swaps a tie: all-equal rows keep the identity
        assert torch.equal(p[0].detach(), torch.eye(5, dtype=torch.float64))
    # n = 1: x and [[1]], connected to the graph; n = 0: empty
    one = torch.tensor([[1.5]], requires_grad=True)
    s1, p1 = diffsort(one, network=network, error_free=True)
    assert torch.equal(s1, one) and torch.equal(p1, torch.ones(1, 1, 1))
    (s1.sum() + p1.sum()).backward()
    assert one.grad is not None and torch.equal(one.grad, torch.ones(1, 1))
    s0, p0 = diffsort(torch.zeros(2, 0), network=network, error_free=True)
    assert s0.shape == (2, 0) and p0.shape == (2, 0, 0)
    nan = diffsort(torch.tensor([[1.0, float("nan"), 0.0], [1.0, 2.0, 0.0]]), network=network, error_free=True)
    assert torch.isnan(nan[0][0]).all() and torch.isnan(nan[1][0]).all()
    assert torch.equal(nan[0][1], torch.tensor([0.0, 1.0, 2.0]))


# ----------------------------------------------------------------------------------------------
# gradients
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("network", NETWORKS)
def test_gradient_is_the_straight_through_formulation(network: str, distribution: str) -> None:
    g = torch.Generator().manual_seed(1)
    for n in (2, 3, 5, 6, 8):
        x = torch.randn(3, n, generator=g, dtype=torch.float64)
        ws = torch.randn(3, n, generator=g, dtype=torch.float64)
        wp = torch.randn(3, n, n, generator=g, dtype=torch.float64)
        xa = x.clone().requires_grad_()
        kw = {"network": network, "distribution": distribution, "steepness": 4.0, "art_lambda": 0.3}
        s, p = diffsort(xa, error_free=True, **kw)
        ((s * ws).sum() + (p * wp).sum()).backward()
        assert xa.grad is not None
        for row in range(3):
            xr = x[row].clone().requires_grad_()
            rs, rp = slow_error_free(xr, network, 4.0, distribution, 0.3)
            ((rs * ws[row]).sum() + (rp * wp[row]).sum()).backward()
            torch.testing.assert_close(s[row], rs, rtol=0, atol=1e-12)
            torch.testing.assert_close(p[row], rp, rtol=0, atol=1e-12)
            torch.testing.assert_close(xa.grad[row], xr.grad, rtol=1e-10, atol=1e-10)
        # the relaxation's gradient is not the exact sort's (a permutation of the upstream gradient)
        assert not torch.allclose(xa.grad, ws.gather(-1, s.argsort(-1).argsort(-1)))


@pytest.mark.parametrize("network", NETWORKS)
@pytest.mark.parametrize("distribution", ["cauchy", "logistic", "optimal"])
def test_gradcheck_against_the_linearised_network(network: str, distribution: str) -> None:
    """float64 gradcheck: the backward at ``x0`` against finite differences of the network whose swaps
    are the relaxed ones shifted by constants so that it passes through the hard values at ``x0``."""
    g = torch.Generator().manual_seed(2)
    x0 = torch.randn(6, generator=g, dtype=torch.float64)
    kw = {"network": network, "distribution": distribution, "steepness": 2.0}
    offsets: list[Any] = []
    slow_error_free(x0, network, 2.0, distribution, record=offsets)

    def linearised(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return slow_error_free(t, network, 2.0, distribution, offsets=offsets)

    def f(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s, p = diffsort(t, error_free=True, **kw)
        ls, lp = linearised(t)
        # value: the linearised network (finite differences); derivative: rankwise's backward
        return s - s.detach() + ls.detach(), p - p.detach() + lp.detach()

    ls0, lp0 = linearised(x0)  # it passes through the hard values
    assert torch.allclose(ls0, torch.sort(x0).values, atol=1e-14)
    assert torch.allclose(lp0, diffsort(x0, error_free=True, **kw)[1], atol=1e-14)
    assert gradcheck(f, x0)
    pos = torch.arange(1.0, 7.0, dtype=torch.float64)

    def ranks(t: torch.Tensor) -> torch.Tensor:
        r = soft_rank(t, method="diffsort", error_free=True, **kw)
        return r - r.detach() + (linearised(t)[1] @ pos).detach()

    assert gradcheck(ranks, x0)


@pytest.mark.parametrize("network", NETWORKS)
def test_soft_rank_gradient_is_the_matrix_paths(network: str) -> None:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 7, generator=g, dtype=torch.float64)
    w = torch.randn(3, 7, generator=g, dtype=torch.float64)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    r = soft_rank(a, method="diffsort", network=network, error_free=True)
    assert torch.equal(r.detach(), (x.argsort(-1).argsort(-1) + 1).double())
    (r * w).sum().backward()
    p = diffsort(b, network=network, error_free=True)[1]
    (p @ torch.arange(1.0, 8.0, dtype=torch.float64) * w).sum().backward()
    assert a.grad is not None and b.grad is not None
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12)
    s = soft_sort(x, method="diffsort", network=network, error_free=True)
    assert torch.equal(s, torch.sort(x).values)


@pytest.mark.parametrize("network", NETWORKS)
def test_second_derivatives_are_those_of_the_straight_through_formulation(network: str) -> None:
    """Under ``create_graph`` the backward is differentiated as the per-layer h + (s - sg(s)) formulation."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(5, generator=g, dtype=torch.float64)
    v = torch.randn(5, generator=g, dtype=torch.float64)
    w = torch.arange(1.0, 6.0, dtype=torch.float64)
    wp = torch.randn(5, 5, generator=g, dtype=torch.float64)

    def hvp(fn: Any) -> torch.Tensor:
        t = x.clone().requires_grad_()
        s, p, r = fn(t)
        loss = (s * w).square().sum() + (p * wp).square().sum() + (r * w).square().sum()
        (gr,) = torch.autograd.grad(loss, t, create_graph=True)
        (out,) = torch.autograd.grad(gr, t, v)
        return out

    def ours(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        kw = {"network": network, "steepness": 1.5, "error_free": True}
        return (*diffsort(t, **kw), soft_rank(t, method="diffsort", **kw))

    def ref(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s, p = slow_error_free(t, network, 1.5, "cauchy")
        return s, p, p @ w

    h_ref = hvp(ref)
    assert float(h_ref.abs().max()) > 1e-3
    torch.testing.assert_close(hvp(ours), h_ref, rtol=1e-8, atol=1e-10)


def test_module_twin_and_argument_errors() -> None:
    x = torch.randn(2, 6)
    m = DiffSort(network="bitonic", error_free=True)
    assert "error_free=True" in repr(m)
    for a, b in zip(m(x), diffsort(x, network="bitonic", error_free=True)):
        assert torch.equal(a, b)
    with pytest.raises(TypeError, match="error_free"):
        diffsort(x, error_free=1)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="error_free"):
        DiffSort(error_free="yes")  # type: ignore[arg-type]
