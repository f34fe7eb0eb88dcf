"""Differentiable sorting networks: parity with a slow per-comparator transcription of the papers'
formulas and with the authors' ``diffsort`` package, properties of ``P``, limits, gradients,
degenerate inputs, soft_sort/soft_rank dispatch and argument errors."""

from __future__ import annotations

import math

import pytest
import torch

import rankwise
from rankwise import DiffSort, diffsort, soft_rank, soft_sort
from rankwise.ops import sorting_network as diffsort_module
from tests.conftest import gradcheck

NETWORKS = ["odd_even", "bitonic"]
DISTRIBUTIONS = ["cauchy", "logistic", "logistic_phi", "optimal", "gaussian", "reciprocal"]


# ----------------------------------------------------------------------------------------------
# slow reference: explicit comparator lists and a Python loop over comparators (test file only)
# ----------------------------------------------------------------------------------------------
def odd_even_network(n: int) -> list[list[tuple[int, int]]]:
    """Odd-even transposition sort: n rounds; round r compares (i, i+1) for i = r mod 2, r mod 2 + 2, ..."""
    return [[(i, i + 1) for i in range(r % 2, n - 1, 2)] for r in range(n)]


def bitonic_network(n: int) -> list[list[tuple[int, int]]]:
    """Batcher's bitonic sorter on N = 2^k >= n wires (textbook XOR form), comparators as
    (min wire, max wire); the first N - n wires hold -inf, so comparators touching them are no-ops
    and are dropped, and wire indices are shifted down by N - n."""
    if n <= 1:
        return []
    size = 1
    while size < n:
        size *= 2
    pad = size - n
    rounds = []
    k = 2
    while k <= size:
        j = k // 2
        while j >= 1:
            layer = []
            for i in range(size):
                partner = i ^ j
                if partner > i and i >= pad:
                    ascending = (i & k) == 0
                    lo, hi = (i, partner) if ascending else (partner, i)
                    layer.append((lo - pad, hi - pad))
            rounds.append(layer)
            j //= 2
        k *= 2
    return rounds


def sigmoid_f(v: torch.Tensor, d: torch.Tensor, distribution: str, art_lambda: float) -> torch.Tensor:
    """The relaxed 'is in order' probabilities of the papers, f(v) with v = steepness * d."""
    if distribution == "logistic":
        return 1 / (1 + torch.exp(-v))
    if distribution == "logistic_phi":
        w = v / (d.abs() + 1e-10) ** art_lambda
        return 1 / (1 + torch.exp(-w))
    if distribution == "cauchy":
        return 0.5 + torch.atan(v) / math.pi
    if distribution == "reciprocal":
        return 0.5 + 0.5 * v / (2 + v.abs())
    if distribution == "gaussian":
        return 0.5 * (1 + torch.erf(v / math.sqrt(2)))
    # optimal (ICLR'22): piecewise
    out = v + 0.5
    out = torch.where(v > 0.25, 1 - 1 / (16 * (v.abs() + 1e-10)), out)
    return torch.where(v < -0.25, 1 / (16 * (v.abs() + 1e-10)), out)


def slow_diffsort(
    x: torch.Tensor, network: str, steepness: float, distribution: str, art_lambda: float = 0.25
) -> tuple[torch.Tensor, torch.Tensor]:
    """One 1-D row, one comparator at a time: values and P (rows = inputs, columns = wires)."""
    n = x.shape[0]
    net = odd_even_network(n) if network == "odd_even" else bitonic_network(n)
    vals = list(x.unbind())
    cols = list(torch.eye(n, dtype=x.dtype).unbind(1))  # column p of P: weights of the inputs on wire p
    for layer in net:
        for lo, hi in layer:
            a, b = min(lo, hi), max(lo, hi)  # the comparator's (a, b); f is evaluated on x_b - x_a
            d = vals[b] - vals[a]
            alpha = sigmoid_f(steepness * d, d, distribution, art_lambda)
            # the wire lo gets the soft minimum, hi the soft maximum
            mn = alpha * vals[a] + (1 - alpha) * vals[b]
            mx = (1 - alpha) * vals[a] + alpha * vals[b]
            cmn = alpha * cols[a] + (1 - alpha) * cols[b]
            cmx = (1 - alpha) * cols[a] + alpha * cols[b]
            vals[lo], vals[hi] = mn, mx
            cols[lo], cols[hi] = cmn, cmx
    return torch.stack(vals), torch.stack(cols, dim=1)


def _hard_sort_ok(network: str, n: int) -> bool:
    g = torch.Generator().manual_seed(n)
    x = torch.randperm(n, generator=g).double()
    s, _ = slow_diffsort(x, network, 1e6, "cauchy")
    return bool(torch.allclose(s, torch.arange(n, dtype=torch.float64), atol=1e-3))


@pytest.mark.parametrize("network", NETWORKS)
def test_slow_reference_networks_sort(network: str) -> None:
    for n in range(1, 18):
        assert _hard_sort_ok(network, n), (network, n)


# ----------------------------------------------------------------------------------------------
# parity with the slow reference
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("network", NETWORKS)
def test_matches_slow_reference(network: str, distribution: str) -> None:
    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 3, 5, 6, 8, 11):
        x = torch.randn(3, n, generator=g, dtype=torch.float64)
        ws, wp = (
            torch.randn(3, n, generator=g, dtype=torch.float64),
            torch.randn(3, n, n, generator=g, dtype=torch.float64),
        )
        xa = x.clone().requires_grad_()
        s, p = diffsort(xa, network=network, steepness=4.0, distribution=distribution, art_lambda=0.3)
        ((s * ws).sum() + (p * wp).sum()).backward()
        for row in range(3):
            xr = x[row].clone().requires_grad_()
            rs, rp = slow_diffsort(xr, network, 4.0, distribution, 0.3)
            ((rs * ws[row]).sum() + (rp * wp[row]).sum()).backward()
            torch.testing.assert_close(s[row], rs, rtol=0, atol=1e-12)
            torch.testing.assert_close(p[row], rp, rtol=0, atol=1e-12)
            assert xr.grad is not None and xa.grad is not None
            torch.testing.assert_close(xa.grad[row], xr.grad, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("network", NETWORKS)
def test_descending_is_network_on_negated_input(network: str) -> None:
    x = torch.randn(4, 7, dtype=torch.float64)
    s, p = diffsort(x, network=network, descending=True, steepness=3.0)
    for row in range(4):
        rs, rp = slow_diffsort(-x[row], network, 3.0, "cauchy")
        torch.testing.assert_close(s[row], -rs, rtol=0, atol=1e-12)
        torch.testing.assert_close(p[row], rp, rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.einsum("...i,...ij->...j", x, p), s)
    if network == "odd_even":  # not the flip of the ascending output
        asc, _ = diffsort(x, network=network, steepness=3.0)
        assert (s - asc.flip(-1)).abs().max() > 1e-6


# ----------------------------------------------------------------------------------------------
# parity with the authors' package (tests skip without it: pip install --no-deps diffsort)
# ----------------------------------------------------------------------------------------------
def _package_sort(network: str, x: torch.Tensor, steepness: float, distribution: str, art_lambda: float):  # type: ignore[no-untyped-def]
    ds = pytest.importorskip("diffsort")
    net = ds.get_sorting_network(network, x.shape[-1], "cpu")
    return ds.sort(net, x, steepness, art_lambda, distribution)


class _ExactNormalCDF(torch.autograd.Function):
    """The package's NormalCDF with its float32 rounding of sigma in backward removed."""

    @staticmethod
    def forward(ctx, x, sigma):  # type: ignore[no-untyped-def]
        ctx.save_for_backward(x)
        ctx.sigma = sigma
        return 0.5 + 0.5 * torch.erf(x / sigma / math.sqrt(2))

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def]
        (x,) = ctx.saved_tensors
        return g / ctx.sigma / math.sqrt(2 * math.pi) * torch.exp(-0.5 * (x / ctx.sigma) ** 2), None


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("network", NETWORKS)
def test_matches_diffsort_package(
    network: str, distribution: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = pytest.importorskip("diffsort")
    monkeypatch.setattr(ds.functional, "NormalCDF", _ExactNormalCDF)
    g = torch.Generator().manual_seed(1)
    # float32 reaches ~1e-6 relative after tens of layers in both implementations (ulp-level
    # differences of the element-wise functions); float64 agrees to rounding
    vtol, gtol = (1e-13, 1e-12) if dtype == torch.float64 else (2e-6, 5e-5)
    for n in (2, 3, 7, 8, 13, 32):
        x = torch.randn(5, n, generator=g, dtype=torch.float64).to(dtype)
        ws, wp = torch.randn(5, n, generator=g, dtype=dtype), torch.randn(5, n, n, generator=g, dtype=dtype)
        xo, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
        so, po = diffsort(xo, network=network, steepness=5.0, distribution=distribution, art_lambda=0.25)
        sr, pr = _package_sort(network, xr, 5.0, distribution, 0.25)
        ((so * ws).sum() + (po * wp).sum()).backward()
        ((sr * ws).sum() + (pr * wp).sum()).backward()
        assert xo.grad is not None and xr.grad is not None
        scale = xr.grad.abs().max().item()
        torch.testing.assert_close(so, sr, rtol=0, atol=vtol)
        torch.testing.assert_close(po, pr, rtol=0, atol=vtol)
        torch.testing.assert_close(xo.grad, xr.grad, rtol=0, atol=gtol * max(scale, 1.0))


def test_gaussian_backward_differs_from_package_only_by_its_float32_sigma() -> None:
    ds = pytest.importorskip("diffsort")
    x = torch.randn(4, 9, dtype=torch.float64)
    xo, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    diffsort(xo, distribution="gaussian", steepness=3.0)[0].square().sum().backward()
    ds.sort(ds.get_sorting_network("odd_even", 9, "cpu"), xr, 3.0, 0.25, "gaussian")[0].square().sum().backward()
    assert xo.grad is not None and xr.grad is not None
    rel = ((xo.grad - xr.grad).abs().max() / xr.grad.abs().max()).item()
    assert 1e-12 < rel < 1e-6  # float32(1/3) has relative error ~1e-8, amplified by (x/sigma)^2


# ----------------------------------------------------------------------------------------------
# properties and limits
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("network", NETWORKS)
def test_doubly_stochastic_and_sorted_is_x_times_p(network: str, distribution: str) -> None:
    x = torch.randn(2, 3, 10, dtype=torch.float64)
    s, p = diffsort(x, network=network, distribution=distribution, steepness=2.0)
    assert p.shape == (2, 3, 10, 10)
    assert (p >= 0).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(2, 3, 10, dtype=torch.float64))
    torch.testing.assert_close(p.sum(-2), torch.ones(2, 3, 10, dtype=torch.float64))
    torch.testing.assert_close(torch.einsum("...i,...ij->...j", x, p), s)
    torch.testing.assert_close(
        diffsort(x, network=network, distribution=distribution, steepness=2.0, return_matrix=False), s
    )


@pytest.mark.parametrize("network", NETWORKS)
@pytest.mark.parametrize("n", [2, 5, 16, 33, 100])
def test_steep_limit_is_the_hard_sort(network: str, n: int) -> None:
    x = torch.randperm(n).double().unsqueeze(0) * 0.1
    s, p = diffsort(x, network=network, steepness=1e7, distribution="optimal")
    torch.testing.assert_close(s, torch.sort(x).values, rtol=0, atol=1e-4)
    perm = torch.nn.functional.one_hot(torch.sort(x).indices, n).double().mT  # P[i, j] = [input i at j]
    torch.testing.assert_close(p, perm, rtol=0, atol=1e-4)


def test_monotonic_distributions_are_monotonic() -> None:
    # ICLR'22: cauchy, optimal and reciprocal give sorted outputs that are monotonic in each input
    x = torch.randn(1, 6, dtype=torch.float64, requires_grad=True)
    for distribution in ("cauchy", "optimal", "reciprocal"):
        for network in NETWORKS:
            s, _ = diffsort(x, network=network, distribution=distribution, steepness=5.0)
            jac = torch.stack([torch.autograd.grad(s[0, j], x, retain_graph=True)[0][0] for j in range(6)])
            assert (jac >= -1e-12).all(), (network, distribution)


def test_leading_dims_and_dim() -> None:
    x = torch.randn(4, 6, 3, dtype=torch.float64)
    s, p = diffsort(x, dim=1, network="bitonic")
    s_last, p_last = diffsort(x.movedim(1, -1), network="bitonic")
    torch.testing.assert_close(s, s_last.movedim(-1, 1))
    torch.testing.assert_close(p, p_last)
    assert p.shape == (4, 3, 6, 6)


def test_soft_sort_and_soft_rank_dispatch() -> None:
    x = torch.randn(3, 9, dtype=torch.float64)
    pos = torch.arange(1, 10, dtype=torch.float64)
    for network in NETWORKS:
        for descending in (False, True):
            kw = {"network": network, "steepness": 3.0, "distribution": "logistic", "descending": descending}
            s, p = diffsort(x, **kw)  # type: ignore[arg-type]
            torch.testing.assert_close(soft_sort(x, method="diffsort", **kw), s)
            torch.testing.assert_close(soft_rank(x, method="diffsort", **kw), p @ pos)
    # steep: the exact ranks
    r = soft_rank(x, method="diffsort", network="bitonic", steepness=1e7, distribution="optimal")
    torch.testing.assert_close(r, rankwise.rank(x), rtol=0, atol=1e-4)
    rd = soft_rank(x, method="diffsort", steepness=1e7, distribution="optimal", descending=True)
    torch.testing.assert_close(rd, rankwise.rank(x, descending=True), rtol=0, atol=1e-4)


@pytest.mark.parametrize("network", NETWORKS)
def test_soft_rank_gradients_match_matrix_path(network: str) -> None:
    x = torch.randn(2, 7, dtype=torch.float64)
    w = torch.randn(2, 7, dtype=torch.float64)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    (soft_rank(xa, method="diffsort", network=network) * w).sum().backward()
    p = diffsort(xb, network=network)[1]
    ((p @ torch.arange(1, 8, dtype=torch.float64)) * w).sum().backward()
    assert xa.grad is not None and xb.grad is not None
    torch.testing.assert_close(xa.grad, xb.grad)


# ----------------------------------------------------------------------------------------------
# gradients
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("network", NETWORKS)
def test_gradcheck(network: str, distribution: str) -> None:
    x = torch.randn(2, 6, dtype=torch.float64)
    kw = {"network": network, "distribution": distribution, "steepness": 2.0}
    assert gradcheck(lambda t: diffsort(t, **kw), x)  # type: ignore[arg-type]
    assert gradcheck(lambda t: soft_rank(t, method="diffsort", descending=True, **kw), x)


def test_gradcheck_deep_network_checkpoint_segments() -> None:
    # odd-even with n = 20: 20 layers, P checkpointed every 5
    x = torch.randn(1, 20, dtype=torch.float64)
    assert gradcheck(lambda t: diffsort(t, steepness=1.0)[1], x)


@pytest.mark.parametrize("network", ["odd_even", "bitonic"])
@pytest.mark.parametrize("distribution", ["cauchy", "logistic", "logistic_phi", "optimal", "gaussian", "reciprocal"])
def test_gradgradcheck(network: str, distribution: str) -> None:
    """Second derivatives (Hessian-vector products) of the sorted values, the matrix and the ranks."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, generator=g, dtype=torch.float64).requires_grad_()
    kw = {"network": network, "distribution": distribution, "steepness": 1.5}
    for fn in (
        lambda t: diffsort(t, return_matrix=False, **kw),
        lambda t: diffsort(t, **kw)[1],
        lambda t: rankwise.soft_rank(t, method="diffsort", **kw),
        lambda t: diffsort(t, descending=True, **kw)[0],
    ):
        assert torch.autograd.gradgradcheck(fn, (x,), atol=1e-6, rtol=1e-4)


def test_hessian_vector_product_matches_finite_differences() -> None:
    """The analytical second derivative is not silently zero: H v against differences of gradients."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, generator=g, dtype=torch.float64)
    v = torch.randn(6, generator=g, dtype=torch.float64)

    def grad_at(t: torch.Tensor, create_graph: bool = False) -> torch.Tensor:
        out = diffsort(t, return_matrix=False, steepness=2.0)
        w = torch.arange(1.0, 7.0, dtype=torch.float64)
        return torch.autograd.grad((out * w).square().sum(), t, create_graph=create_graph)[0]

    xr = x.clone().requires_grad_()
    (hv,) = torch.autograd.grad(grad_at(xr, create_graph=True), xr, v)
    h = 1e-6
    fd = (grad_at((x + h * v).requires_grad_()) - grad_at((x - h * v).requires_grad_())) / (2 * h)
    assert float(hv.abs().max()) > 1e-3
    torch.testing.assert_close(hv, fd, rtol=1e-5, atol=1e-6)


def test_values_only_never_builds_the_matrix(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: object) -> None:
        raise AssertionError("P was built")

    monkeypatch.setattr(diffsort_module._NetworkMatrix, "apply", boom)
    x = torch.randn(2, 300, requires_grad=True)
    diffsort(x, network="bitonic", return_matrix=False).sum().backward()
    soft_rank(x, method="diffsort", network="bitonic").sum().backward()
    soft_sort(x, method="diffsort").sum().backward()


# ----------------------------------------------------------------------------------------------
# degenerate inputs, dtypes, module, errors
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("network", NETWORKS)
def test_degenerate(network: str) -> None:
    e = torch.zeros(3, 0, requires_grad=True)
    s, p = diffsort(e, network=network)
    assert s.shape == (3, 0) and p.shape == (3, 0, 0)
    (s.sum() + p.sum()).backward()
    one = torch.tensor([[2.5]], requires_grad=True)
    s, p = diffsort(one, network=network)
    assert s.tolist() == [[2.5]] and p.tolist() == [[[1.0]]]
    (s.sum() + p.sum()).backward()
    assert one.grad is not None and one.grad.tolist() == [[1.0]]
    ties = torch.full((2, 6), 0.3, requires_grad=True)
    s, p = diffsort(ties, network=network)
    assert torch.equal(s, ties.detach())
    torch.testing.assert_close(p.sum(-2), torch.ones(2, 6))
    (s.sum() + p.square().sum()).backward()
    assert ties.grad is not None and torch.isfinite(ties.grad).all()
    # every comparator blends ties half and half: P is doubly stochastic but (for these shallow
    # networks) not uniform, so tied soft ranks are spread around (n + 1) / 2 with that mean
    r = soft_rank(ties.detach(), method="diffsort", network=network)
    torch.testing.assert_close(r.mean(-1), torch.full((2,), 3.5))
    assert ((r > 1) & (r < 6)).all()


def test_non_finite_slices_are_nan() -> None:
    x = torch.randn(3, 6, dtype=torch.float64)
    x[1, 4] = float("nan")
    x[2, 0] = -float("inf")
    s, p = diffsort(x, network="bitonic")
    assert torch.isfinite(s[0]).all() and torch.isfinite(p[0]).all()
    assert torch.isnan(s[1:]).all() and torch.isnan(p[1:]).all()
    torch.testing.assert_close(s[0], diffsort(x[:1], network="bitonic")[0][0])


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_half_precision_computed_in_float32(half: torch.dtype) -> None:
    x = torch.randn(2, 9)
    s, p = diffsort(x.to(half), network="bitonic")
    assert s.dtype == half and p.dtype == half
    s32, p32 = diffsort(x.to(half).float(), network="bitonic")
    torch.testing.assert_close(s, s32.to(half))
    torch.testing.assert_close(p, p32.to(half))


def test_module_twin() -> None:
    x = torch.randn(3, 5, dtype=torch.float64)
    m = DiffSort(network="bitonic", steepness=3.0, distribution="reciprocal", descending=True)
    s, p = m(x)
    s2, p2 = diffsort(x, network="bitonic", steepness=3.0, distribution="reciprocal", descending=True)
    torch.testing.assert_close(s, s2)
    torch.testing.assert_close(p, p2)
    assert "bitonic" in repr(m) and "reciprocal" in repr(m)
    assert isinstance(DiffSort(return_matrix=False)(x), torch.Tensor)


def test_bad_arguments() -> None:
    x = torch.randn(2, 4)
    with pytest.raises(ValueError, match=r"`network` must be one of 'odd_even', 'bitonic'; got 'merge'"):
        diffsort(x, network="merge")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`distribution` must be one of .*'reciprocal'; got 'sigmoid'"):
        diffsort(x, distribution="sigmoid")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`steepness` must be finite and > 0, got 0"):
        diffsort(x, steepness=0)
    with pytest.raises(ValueError, match=r"`art_lambda` must be finite and >= 0, got -1"):
        diffsort(x, art_lambda=-1)
    with pytest.raises(TypeError, match=r"`descending` must be a bool, got str"):
        diffsort(x, descending="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"`x` must be a floating-point tensor"):
        diffsort(torch.arange(4))
    with pytest.raises(ValueError, match=r"`dim` must be in \[-2, 1\]"):
        diffsort(x, dim=2)
    with pytest.raises(ValueError, match=r"`network` must be one of"):
        DiffSort(network="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`steepness` must be finite and > 0"):
        soft_rank(x, method="diffsort", steepness=-1.0)


@pytest.mark.parametrize("name", ["diffsort", "soft_rank", "soft_sort"])
def test_registry_entries(name: str) -> None:
    assert name in rankwise.list_ops()


def test_diffsort_entry_provides_both_networks_as_relaxations() -> None:
    assert [r.name for r in rankwise.get_op_entry("diffsort").relaxations] == ["diffsort_odd_even", "diffsort_bitonic"]


def test_a_bitonic_network_that_does_not_sort_is_warned_about_once() -> None:
    """The authors' bitonic construction for n not a power of two (the next power of two's network with its
    first wires removed) does not sort at some n (22, 38); rankwise keeps it, equal to theirs, and warns."""
    import warnings

    from rankwise.ops import sorting_network as sn

    sn._layers.cache_clear()
    for n, sorts in [(15, True), (16, True), (22, False), (24, True), (38, False)]:
        x = torch.randn(64, n, dtype=torch.float64)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = diffsort(x, network="bitonic", error_free=True, return_matrix=False)
            diffsort(x, network="bitonic", return_matrix=False)  # the same network: no second warning
        mine = [w for w in caught if "does not sort every input" in str(w.message)]
        assert len(mine) == (0 if sorts else 1), n
        if sorts:
            assert torch.equal(out, x.sort(-1).values)
        else:
            assert f"n = {n}" in str(mine[0].message) and mine[0].filename == __file__
            assert not torch.equal(out, x.sort(-1).values)  # the warning is true: some row is not sorted
