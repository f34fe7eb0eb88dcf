"""Tests of the isotonic soft sort / soft rank (Blondel et al., ICML'20)."""

from __future__ import annotations

import functools
import itertools
import math
import sys

import numpy as np
import pytest
import torch

import rankwise
from rankwise._kernels import _loader, _parallel
from rankwise._kernels import isotonic as kiso
from rankwise.ops import isotonic as iso
from tests.conftest import gradcheck, tol
from tests.registry_examples import case_entry, factories

REGS = ["l2", "kl"]
STRENGTHS = [1e-3, 1e-2, 0.1, 1.0, 10.0]


# --------------------------------------------------------------------------------------------------
# slow references written from the paper (loops; float64 numpy)
# --------------------------------------------------------------------------------------------------
def _lse(a: np.ndarray) -> float:
    m = float(np.max(a))
    return m + math.log(float(np.sum(np.exp(a - m))))


def _pav_decreasing(s: np.ndarray, w: np.ndarray, reg: str) -> np.ndarray:
    """argmin_{v_1 >= ... >= v_n} sum_i loss_i(v_i): plain pool-adjacent-violators."""

    def value(lo: int, hi: int) -> float:
        if reg == "l2":
            return float(np.mean(s[lo:hi] - w[lo:hi]))
        return _lse(s[lo:hi]) - _lse(w[lo:hi])

    blocks: list[tuple[int, int]] = []
    for i in range(len(s)):
        block = (i, i + 1)
        while blocks and value(*blocks[-1]) <= value(*block):
            block = (blocks.pop()[0], block[1])
        blocks.append(block)
    v = np.empty(len(s))
    for lo, hi in blocks:
        v[lo:hi] = value(lo, hi)
    return v


def _project(z: np.ndarray, w: np.ndarray, reg: str) -> np.ndarray:
    """P(z, w): projection of z onto the permutahedron of w (l2) or its KL analogue (log domain)."""
    perm = np.argsort(-z, kind="stable")
    s = z[perm]
    mu = s - _pav_decreasing(s, np.sort(w)[::-1], reg)
    out = np.empty_like(mu)
    out[perm] = mu
    return out


def ref_rank(x: np.ndarray, eps: float, reg: str, descending: bool = False) -> np.ndarray:
    n = len(x)
    rho = np.arange(n, 0, -1, dtype=np.float64)
    z = (-x if descending else x) / eps
    return _project(z, rho, "l2") if reg == "l2" else np.exp(_project(z, np.log(rho), "kl"))


def ref_sort(x: np.ndarray, eps: float, reg: str, descending: bool = False) -> np.ndarray:
    rho = np.arange(len(x), 0, -1, dtype=np.float64)
    if descending:
        return _project(rho / eps, x, reg)
    return -_project(rho / eps, -x, reg)


def _ref_rows(fn, x: torch.Tensor, eps: float, reg: str, descending: bool = False) -> torch.Tensor:
    rows = x.detach().double().reshape(-1, x.shape[-1]).numpy()
    out = np.stack([fn(r, eps, reg, descending) for r in rows])
    return torch.from_numpy(out).reshape(x.shape)


def _brute_force_projection(z: np.ndarray, w: np.ndarray, reg: str) -> np.ndarray:
    """Solve the projection with scipy's SLSQP using all 2^n permutahedron facets (tiny n)."""
    opt = pytest.importorskip("scipy.optimize")
    n = len(z)
    target = w if reg == "l2" else np.exp(w)
    top = np.cumsum(np.sort(target)[::-1])  # sum of the k largest
    cons = [{"type": "eq", "fun": lambda m: np.sum(m) - top[-1]}]
    for k in range(1, n):
        for subset in itertools.combinations(range(n), k):
            idx = list(subset)
            cons.append({"type": "ineq", "fun": lambda m, idx=idx, k=k: top[k - 1] - np.sum(m[idx])})
    if reg == "l2":
        res = opt.minimize(
            lambda m: 0.5 * np.sum((m - z) ** 2),
            np.full(n, top[-1] / n),
            constraints=cons,
            method="SLSQP",
            options={"ftol": 1e-14, "maxiter": 500},
        )
        return res.x
    ez = np.exp(z)
    res = opt.minimize(
        lambda m: np.sum(m * np.log(m / ez) - m),
        np.full(n, top[-1] / n),
        constraints=cons,
        bounds=[(1e-12, None)] * n,
        method="SLSQP",
        options={"ftol": 1e-14, "maxiter": 500},
    )
    return np.log(res.x)


# --------------------------------------------------------------------------------------------------
# the slow references themselves: checked against a brute-force projection (tiny n)
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reg", REGS)
def test_reference_matches_brute_force_projection(reg: str) -> None:
    rng = np.random.default_rng(0)
    for _ in range(3):
        z, w = rng.normal(size=4), rng.normal(size=4)
        np.testing.assert_allclose(_project(z, w, reg), _brute_force_projection(z, w, reg), atol=1e-5)


# --------------------------------------------------------------------------------------------------
# parity: slow reference, torchsort, numba vs PyTorch path
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reg", REGS)
@pytest.mark.parametrize("eps", STRENGTHS)
@pytest.mark.parametrize("descending", [False, True])
def test_matches_slow_reference(reg: str, eps: float, descending: bool, device: torch.device) -> None:
    x = torch.randn(4, 9, dtype=torch.float64, device=device)
    kw = {"regularization": reg, "regularization_strength": eps, "descending": descending}
    r = rankwise.soft_rank(x, method="isotonic", **kw)
    s = rankwise.soft_sort(x, method="isotonic", **kw)
    torch.testing.assert_close(r.cpu(), _ref_rows(ref_rank, x.cpu(), eps, reg, descending), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(s.cpu(), _ref_rows(ref_sort, x.cpu(), eps, reg, descending), rtol=1e-9, atol=1e-9)


def _value_and_grad(fn, x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a = x.detach().clone().requires_grad_()
    y = fn(a)
    (y * g).sum().backward()
    assert a.grad is not None
    return y.detach(), a.grad


@pytest.mark.parametrize("reg", REGS)
@pytest.mark.parametrize("eps", STRENGTHS)
@pytest.mark.parametrize("kind", ["rank", "sort"])
def test_matches_torchsort_float64(reg: str, eps: float, kind: str) -> None:
    torchsort = pytest.importorskip("torchsort")
    x = torch.randn(6, 40, dtype=torch.float64) * 2
    g = torch.randn(6, 40, dtype=torch.float64)
    ours = rankwise.soft_rank if kind == "rank" else rankwise.soft_sort
    theirs = torchsort.soft_rank if kind == "rank" else torchsort.soft_sort
    kw = {"regularization": reg, "regularization_strength": eps}
    y1, g1 = _value_and_grad(lambda t: ours(t, method="isotonic", **kw), x, g)
    y2, g2 = _value_and_grad(lambda t: theirs(t, **kw), x, g)
    torch.testing.assert_close(y1, y2, rtol=1e-5, atol=1e-5)
    if torch.isfinite(g2).all():  # torchsort's KL backward is NaN at small strengths (its issue #63)
        torch.testing.assert_close(g1, g2, rtol=1e-5, atol=1e-5)
    else:
        assert reg == "kl" and torch.isfinite(g1).all()


@pytest.mark.parametrize("reg", REGS)
def test_matches_torchsort_on_integer_ties(reg: str) -> None:
    """Exactly tied block values (integer inputs) are pooled like torchsort pools them: same gradients."""
    torchsort = pytest.importorskip("torchsort")
    gen = torch.Generator().manual_seed(0)
    for trial in range(12):
        x = torch.randint(-3, 4, (3, 9), generator=gen).double()
        g = torch.randn(3, 9, dtype=torch.float64, generator=gen)
        kw = {"regularization": reg, "regularization_strength": [0.5, 1.0, 2.0][trial % 3]}
        for ours, theirs in ((rankwise.soft_rank, torchsort.soft_rank), (rankwise.soft_sort, torchsort.soft_sort)):
            y1, g1 = _value_and_grad(functools.partial(ours, method="isotonic", **kw), x, g)
            y2, g2 = _value_and_grad(functools.partial(theirs, **kw), x, g)
            torch.testing.assert_close(y1, y2, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(g1, g2, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reg", REGS)
@pytest.mark.parametrize("eps", [0.1, 1.0, 10.0])
@pytest.mark.parametrize("kind", ["rank", "sort"])
def test_matches_torchsort_float32(reg: str, eps: float, kind: str) -> None:
    """In float32 both implementations are within float32 round-off of the float64 result."""
    torchsort = pytest.importorskip("torchsort")
    x = torch.randn(6, 40, dtype=torch.float64)
    g = torch.randn(6, 40, dtype=torch.float64)
    ours = rankwise.soft_rank if kind == "rank" else rankwise.soft_sort
    theirs = torchsort.soft_rank if kind == "rank" else torchsort.soft_sort
    y1, g1 = _value_and_grad(
        lambda t: ours(t, method="isotonic", regularization=reg, regularization_strength=eps), x.float(), g.float()
    )
    y2, g2 = _value_and_grad(lambda t: theirs(t, regularization=reg, regularization_strength=eps), x.float(), g.float())
    y64, g64 = _value_and_grad(
        lambda t: ours(t, method="isotonic", regularization=reg, regularization_strength=eps), x, g
    )
    assert y1.dtype == torch.float32
    torch.testing.assert_close(y1, y2, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(g1, g2, rtol=1e-4, atol=1e-3)
    # ours is at least as close to the float64 result as torchsort (tolerance: float32 round-off)
    torch.testing.assert_close(y1.double(), y64, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(g1.double(), g64, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("reg", REGS)
@pytest.mark.parametrize("eps", STRENGTHS)
@pytest.mark.parametrize("descending", [False, True])
def test_torch_path_equals_numba_path(
    reg: str, eps: float, descending: bool, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = torch.randn(5, 33, dtype=dtype) * 3
    g = torch.randn(5, 33, dtype=dtype)
    kw = {"regularization": reg, "regularization_strength": eps, "descending": descending}
    results = []
    for backend in ["auto", "torch"]:
        monkeypatch.setattr(iso, "_BACKEND", backend)
        results.append(_value_and_grad(lambda t: iso.soft_rank_isotonic(t, **kw), x, g))
        results.append(_value_and_grad(lambda t: iso.soft_sort_isotonic(t, **kw), x, g))
    for a, b in zip(results[:2], results[2:]):
        torch.testing.assert_close(a[0], b[0], **tol(dtype))
        torch.testing.assert_close(a[1], b[1], **tol(dtype))


def test_torch_path_block_ids_match_pav(monkeypatch: pytest.MonkeyPatch) -> None:
    """The min-max block structure equals PAV's, ties included (all-equal and repeated values)."""
    if kiso.FAMILY.load() is None:
        pytest.skip("numba is unavailable")
    base = torch.randn(3, 12, dtype=torch.float64)
    base[1] = 1.0
    base[2, ::2] = base[2, 1::2]
    for reg in REGS:
        for eps in [0.05, 1.0, 20.0]:
            for kind in ["rank", "sort"]:
                z = base / eps if kind == "rank" else base
                s, _ = torch.sort(z, dim=-1, descending=True)
                rho = torch.arange(12, 0, -1, dtype=torch.float64).unsqueeze(0)
                if kind == "rank":
                    w = rho if reg == "l2" else rho.log()
                else:
                    s, w = (rho / eps).expand(3, 12).contiguous(), s
                monkeypatch.setattr(iso, "_BACKEND", "auto")
                mu_nb, ids_nb = iso._isotonic(s, w, reg)
                monkeypatch.setattr(iso, "_BACKEND", "torch")
                mu_t, ids_t = iso._isotonic(s, w, reg)
                torch.testing.assert_close(mu_nb, mu_t, rtol=1e-10, atol=1e-10)
                assert torch.equal(ids_nb, ids_t), (reg, eps, kind)


def test_paths_agree_on_integer_ties(monkeypatch: pytest.MonkeyPatch) -> None:
    """Integer inputs create exact ties between block values; both paths pool them (same gradients)."""
    gen = torch.Generator().manual_seed(1)
    for trial in range(24):
        x = torch.randint(-3, 4, (3, 9), generator=gen).double()
        g = torch.arange(27, dtype=torch.float64).reshape(3, 9)
        kw = {
            "regularization": REGS[trial % 2],
            "regularization_strength": [0.5, 1.0, 2.0][trial % 3],
            "descending": trial % 4 < 2,
        }
        for op in (iso.soft_rank_isotonic, iso.soft_sort_isotonic):
            fn = functools.partial(op, **kw)
            monkeypatch.setattr(iso, "_BACKEND", "auto")
            want = _value_and_grad(fn, x, g)
            monkeypatch.setattr(iso, "_BACKEND", "torch")
            got = _value_and_grad(fn, x, g)
            torch.testing.assert_close(got[0], want[0])
            torch.testing.assert_close(got[1], want[1])
            ref = ref_rank if op is iso.soft_rank_isotonic else ref_sort
            torch.testing.assert_close(
                want[0], _ref_rows(ref, x, kw["regularization_strength"], kw["regularization"], kw["descending"])
            )


# --------------------------------------------------------------------------------------------------
# gradients
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reg", REGS)
@pytest.mark.parametrize("eps", STRENGTHS)
@pytest.mark.parametrize("descending", [False, True])
def test_gradcheck(reg: str, eps: float, descending: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(2, 6, dtype=torch.float64)
    kw = {"regularization": reg, "regularization_strength": eps, "descending": descending}
    for backend in ["auto", "torch"]:
        monkeypatch.setattr(iso, "_BACKEND", backend)
        assert gradcheck(lambda t: iso.soft_rank_isotonic(t, **kw), x)
        assert gradcheck(lambda t: iso.soft_sort_isotonic(t, **kw), x)


def test_gradcheck_dim0_leading_dims() -> None:
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    assert gradcheck(lambda t: rankwise.soft_rank(t, method="isotonic", regularization="kl", dim=0), x)
    assert gradcheck(lambda t: rankwise.soft_sort(t, method="isotonic", regularization_strength=0.3, dim=0), x)


def test_gradgradcheck_l2() -> None:
    """The backward is written in differentiable torch ops (the Jacobian is locally constant)."""
    x = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda t: iso.soft_sort_isotonic(t, regularization_strength=0.5), (x,))


# --------------------------------------------------------------------------------------------------
# properties and limits
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reg", REGS)
def test_limits(reg: str, dtype: torch.dtype, device: torch.device) -> None:
    x = torch.randn(3, 10, dtype=dtype, device=device)
    n = x.shape[-1]
    small = {"regularization": reg, "regularization_strength": 1e-4}
    large = {"regularization": reg, "regularization_strength": 1e6}
    torch.testing.assert_close(rankwise.soft_rank(x, method="isotonic", **small), rankwise.rank(x), **tol(dtype))
    torch.testing.assert_close(
        rankwise.soft_rank(x, method="isotonic", descending=True, **small),
        rankwise.rank(x, descending=True),
        **tol(dtype),
    )
    torch.testing.assert_close(
        rankwise.soft_rank(x, method="isotonic", **large), torch.full_like(x, (n + 1) / 2), rtol=1e-4, atol=1e-4
    )
    torch.testing.assert_close(rankwise.soft_sort(x, method="isotonic", **small), torch.sort(x).values, **tol(dtype))
    torch.testing.assert_close(
        rankwise.soft_sort(x, method="isotonic", descending=True, **small),
        torch.sort(x, descending=True).values,
        **tol(dtype),
    )
    if reg == "l2":
        torch.testing.assert_close(
            rankwise.soft_sort(x, method="isotonic", **large),
            x.mean(-1, keepdim=True).expand_as(x),
            rtol=1e-4,
            atol=1e-4,
        )


@pytest.mark.parametrize("reg", REGS)
def test_ranks_lie_in_permutahedron(reg: str) -> None:
    x = torch.randn(4, 8, dtype=torch.float64)
    r = rankwise.soft_rank(x, method="isotonic", regularization=reg, regularization_strength=0.7)
    torch.testing.assert_close(r.sum(-1), torch.full((4,), 36.0, dtype=torch.float64))
    # ordering is preserved: soft ranks are sorted like x
    assert torch.equal(torch.argsort(r, dim=-1), torch.argsort(x, dim=-1))
    s = rankwise.soft_sort(x, method="isotonic", regularization=reg, regularization_strength=0.7)
    assert (s.diff(dim=-1) >= -1e-12).all()
    if reg == "l2":
        torch.testing.assert_close(s.sum(-1), x.sum(-1))


def test_descending_conventions() -> None:
    x = torch.randn(3, 7, dtype=torch.float64)
    kw = {"method": "isotonic", "regularization_strength": 0.8}
    # l2: descending rank = n + 1 - ascending rank; descending sort = flipped ascending sort
    torch.testing.assert_close(rankwise.soft_rank(x, descending=True, **kw), 8 - rankwise.soft_rank(x, **kw))
    torch.testing.assert_close(rankwise.soft_sort(x, descending=True, **kw), rankwise.soft_sort(x, **kw).flip(-1))
    # both: descending rank of x = ascending rank of -x
    for reg in REGS:
        torch.testing.assert_close(
            rankwise.soft_rank(x, descending=True, regularization=reg, **kw),
            rankwise.soft_rank(-x, regularization=reg, **kw),
        )


@pytest.mark.parametrize("kind", ["rank", "sort"])
def test_leading_dims_and_dim(kind: str, device: torch.device) -> None:
    fn = iso.soft_rank_isotonic if kind == "rank" else iso.soft_sort_isotonic
    x = torch.randn(2, 3, 6, device=device)
    flat = fn(x.reshape(6, 6), regularization="kl", regularization_strength=0.5)
    torch.testing.assert_close(fn(x, regularization="kl", regularization_strength=0.5), flat.reshape(2, 3, 6))
    y = x.transpose(1, 2)  # ranked dim is 1 (non-contiguous input)
    out = fn(y, regularization="kl", regularization_strength=0.5, dim=1)
    torch.testing.assert_close(out, flat.reshape(2, 3, 6).transpose(1, 2))
    torch.testing.assert_close(out, fn(y, regularization="kl", regularization_strength=0.5, dim=-2))
    one_d = fn(x[0, 0], regularization="kl", regularization_strength=0.5)
    torch.testing.assert_close(one_d, flat[0])


# --------------------------------------------------------------------------------------------------
# degenerate inputs and dtypes
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reg", REGS)
@pytest.mark.parametrize("kind", ["rank", "sort"])
def test_degenerate(reg: str, kind: str, dtype: torch.dtype, device: torch.device) -> None:
    fn = iso.soft_rank_isotonic if kind == "rank" else iso.soft_sort_isotonic
    for shape in [(0,), (3, 0), (0, 4)]:
        x = torch.zeros(shape, dtype=dtype, device=device, requires_grad=True)
        y = fn(x, regularization=reg)
        assert y.shape == x.shape and y.dtype == dtype
        y.sum().backward()
        assert x.grad is not None and x.grad.shape == x.shape
    # n = 1
    x = torch.tensor([[0.3], [-2.0]], dtype=dtype, device=device, requires_grad=True)
    y = fn(x, regularization=reg, regularization_strength=0.01)
    torch.testing.assert_close(y, torch.ones_like(x) if kind == "rank" else x.detach())
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.zeros_like(x) if kind == "rank" else torch.ones_like(x))
    # all ties
    for eps in [1e-3, 1.0]:
        x = torch.full((2, 5), 1.5, dtype=dtype, device=device, requires_grad=True)
        y = fn(x, regularization=reg, regularization_strength=eps)
        torch.testing.assert_close(y, torch.full_like(x, 3.0) if kind == "rank" else x.detach(), **tol(dtype))
        (y * torch.arange(5, dtype=dtype, device=device)).sum().backward()
        assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("reg", REGS)
def test_half_precision_computed_in_float32(half: torch.dtype, reg: str, device: torch.device) -> None:
    x = torch.randn(3, 16, device=device).to(half)
    for fn in (iso.soft_rank_isotonic, iso.soft_sort_isotonic):
        xh = x.clone().requires_grad_()
        y = fn(xh, regularization=reg, regularization_strength=0.3)
        # soft ranks reach n: float32 for half input (docs/conventions.md); soft sorts keep the dtype
        assert y.dtype == (torch.float32 if fn is iso.soft_rank_isotonic else half)
        y.float().pow(2).sum().backward()
        assert xh.grad is not None and xh.grad.dtype == half and torch.isfinite(xh.grad.float()).all()
        ref = fn(x.float(), regularization=reg, regularization_strength=0.3)
        torch.testing.assert_close(y.float(), ref, **tol(half))


def test_kl_finite_at_small_strength() -> None:
    """torchsort's KL backward overflows (NaN) here; ours works in log space."""
    x = torch.randn(4, 64, dtype=torch.float32) * 5
    for eps in [1e-3, 1e-4]:
        for fn in (iso.soft_rank_isotonic, iso.soft_sort_isotonic):
            a = x.clone().requires_grad_()
            y = fn(a, regularization="kl", regularization_strength=eps)
            (y * torch.randn_like(y)).sum().backward()
            assert torch.isfinite(y).all() and torch.isfinite(a.grad).all()
    # large magnitudes (x / eps ~ 1e5) with some merged blocks: values and gradients finite, ranks in [1, n]
    x = torch.randn(2, 30, dtype=torch.float64) * 100
    x[:, :10] = x[:, :1]
    a = x.clone().requires_grad_()
    r = iso.soft_rank_isotonic(a, regularization="kl", regularization_strength=1e-3)
    r.sum().backward()
    assert torch.isfinite(r).all() and torch.isfinite(a.grad).all()
    torch.testing.assert_close(r, _ref_rows(ref_rank, x, 1e-3, "kl"))


def test_falls_back_without_numba(monkeypatch: pytest.MonkeyPatch) -> None:
    """If numba fails to import, one RuntimeWarning and the PyTorch path give the same result."""
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    want = iso.soft_rank_isotonic(x, regularization="kl", regularization_strength=0.3)
    monkeypatch.setattr(kiso.FAMILY, "kernels", _loader._UNSET)
    monkeypatch.setattr(_loader, "MODE", "sync")
    monkeypatch.setitem(sys.modules, "rankwise._kernels._numba_isotonic", None)  # makes the import fail
    monkeypatch.delattr(rankwise._kernels, "_numba_isotonic", raising=False)
    with pytest.warns(RuntimeWarning, match="numba is unavailable"):
        got = iso.soft_rank_isotonic(x, regularization="kl", regularization_strength=0.3)
    assert kiso.FAMILY.kernels is None
    torch.testing.assert_close(got, want)
    got.sum().backward()


@pytest.mark.parametrize("reg", REGS)
def test_non_cpu_path_needs_no_host_values(reg: str) -> None:
    """Non-CPU tensors take the vectorized path; it runs on the meta device, so no op reads data on the host."""
    for fn in (iso.soft_rank_isotonic, iso.soft_sort_isotonic):
        x = torch.randn(3, 7, device="meta", requires_grad=True)
        y = fn(x, regularization=reg, regularization_strength=0.5, descending=True)
        assert y.device.type == "meta" and y.shape == x.shape
        y.sum().backward()
        assert x.grad is not None and x.grad.shape == x.shape


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("reg", REGS)
def test_cuda_no_sync_and_matches_cpu(reg: str) -> None:
    x = torch.randn(4, 50, dtype=torch.float64)
    g = torch.randn(4, 50, dtype=torch.float64)
    for op in (iso.soft_rank_isotonic, iso.soft_sort_isotonic):
        fn = functools.partial(op, regularization=reg, regularization_strength=0.3)
        want = _value_and_grad(fn, x, g)
        xc, gc = x.cuda(), g.cuda()
        fn(xc)  # warm-up outside the sync check
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = _value_and_grad(fn, xc, gc)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.testing.assert_close(got[0].cpu(), want[0])
        torch.testing.assert_close(got[1].cpu(), want[1])


def test_torch_path_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small chunk budget: several chunks of rows give the same result."""
    x = torch.randn(7, 9, dtype=torch.float64)
    want = iso.soft_rank_isotonic(x, regularization="kl", regularization_strength=0.2)
    monkeypatch.setattr(iso, "_BACKEND", "torch")
    monkeypatch.setattr(iso, "_MINMAX_BUDGET", 2 * 81)
    torch.testing.assert_close(iso.soft_rank_isotonic(x, regularization="kl", regularization_strength=0.2), want)


# --------------------------------------------------------------------------------------------------
# API: dispatch, modules, registry, errors
# --------------------------------------------------------------------------------------------------
def test_soft_dispatch_and_module() -> None:
    x = torch.randn(3, 5)
    kw = {"regularization": "kl", "regularization_strength": 0.1}
    want = iso.soft_rank_isotonic(x, **kw)
    torch.testing.assert_close(rankwise.soft_rank(x, method="isotonic", **kw), want)
    torch.testing.assert_close(rankwise.SoftRank(method="isotonic", **kw)(x), want)
    torch.testing.assert_close(iso.IsotonicSoftRank(**kw)(x), want)
    torch.testing.assert_close(iso.IsotonicSoftSort(**kw)(x), rankwise.soft_sort(x, method="isotonic", **kw))
    assert "isotonic" in rankwise.list_soft_methods()
    assert "regularization='kl'" in repr(iso.IsotonicSoftRank(**kw))


@pytest.mark.parametrize(
    "name", ["soft_rank_isotonic", "soft_rank_isotonic.kl", "soft_sort_isotonic", "soft_sort_isotonic.kl"]
)
def test_registry_entries(name: str) -> None:
    assert name.partition(".")[0] in rankwise.list_ops()  # an entry, or a test variant of one
    entry = case_entry("op", name)
    f = factories("op", name)
    assert entry.module is not None and f.degenerate is not None
    ex = f.example(torch.float64, torch.device("cpu"))
    torch.testing.assert_close(entry.fn(*ex.args, **ex.kwargs), entry.module(**ex.kwargs)(*ex.args))
    assert gradcheck(lambda t: entry.fn(t, **ex.kwargs), *ex.args)
    for deg in f.degenerate(torch.float32, torch.device("cpu")):
        y = entry.fn(*deg.args, **deg.kwargs)
        assert torch.isfinite(y).all()
        y.sum().backward()
        assert torch.isfinite(deg.args[0].grad).all()


def test_bad_inputs() -> None:
    x = torch.randn(2, 4)
    for fn in (iso.soft_rank_isotonic, iso.soft_sort_isotonic):
        with pytest.raises(ValueError, match=r"`regularization_strength` must be finite and > 0, got 0"):
            fn(x, regularization_strength=0)
        with pytest.raises(ValueError, match=r"`regularization_strength` must be finite and > 0, got -1.0"):
            fn(x, regularization_strength=-1.0)
        with pytest.raises(ValueError, match=r"`regularization` must be one of 'l2', 'kl'; got 'l1'"):
            fn(x, regularization="l1")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"`regularization_strength` must be a real number, got str"):
            fn(x, regularization_strength="1")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"`x` must be a floating-point tensor, got dtype torch.int64"):
            fn(torch.arange(4))
        with pytest.raises(ValueError, match=r"`x` must have at least 1 dimension"):
            fn(torch.tensor(1.0))
        with pytest.raises(ValueError, match=r"`dim` must be in \[-2, 1\]"):
            fn(x, dim=2)
    with pytest.raises(ValueError, match=r"`regularization_strength` must be finite and > 0, got 0.0"):
        rankwise.soft_rank(x, method="isotonic", regularization_strength=0.0)
    with pytest.raises(ValueError, match=r"`regularization` must be one of 'l2', 'kl'; got 'entropy'"):
        rankwise.soft_sort(x, method="isotonic", regularization="entropy")
    with pytest.raises(ValueError, match=r"`regularization_strength` must be finite and > 0, got nan"):
        iso.IsotonicSoftRank(regularization_strength=float("nan"))
    with pytest.raises(TypeError, match="unexpected keyword argument 'tau'"):
        rankwise.soft_rank(x, method="isotonic", tau=1.0)


# --------------------------------------------------------------------------------------------------
# loading the numba kernels (RANKWISE_NUMBA)
# --------------------------------------------------------------------------------------------------
_LOADING_SCRIPT = """
import sys, torch, rankwise
from rankwise._kernels import isotonic as kiso
x = torch.tensor([[3.0, 1.0, 2.0, -1.0], [0.5, 0.25, 2.0, 1.0]], dtype=torch.float64, requires_grad=True)
outs = []
for i in range(3):
    y = rankwise.soft_rank(x, method="isotonic", regularization="kl", regularization_strength=0.7)
    (g,) = torch.autograd.grad((y * torch.arange(8.0).view(2, 4)).sum(), x)
    outs.append((y.detach(), g))
    if i == 0:  # after the first call: numba not imported (background, off) or loaded (sync)
        print("numba" in sys.modules, kiso.FAMILY._thread is not None)
print(kiso.FAMILY._thread is not None)
if kiso.FAMILY._thread is not None:
    kiso.FAMILY._thread.join()
print(kiso.FAMILY.loaded)
y = rankwise.soft_rank(x, method="isotonic", regularization="kl", regularization_strength=0.7)
(g,) = torch.autograd.grad((y * torch.arange(8.0).view(2, 4)).sum(), x)
for a, b in outs:
    torch.testing.assert_close(a, y.detach())
    torch.testing.assert_close(b, g)
print("same")
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["background", "sync", "off"])
def test_kernel_loading_modes(mode: str) -> None:
    """background: calls before the kernels are loaded take the PyTorch path, the second starts the
    loader, later calls use the kernels (same values); sync: the first call loads them; off: never.
    The process exits cleanly (a load in progress is not killed inside LLVM)."""
    import os
    import subprocess

    env = {**os.environ, "RANKWISE_NUMBA": mode}
    res = subprocess.run([sys.executable, "-c", _LOADING_SCRIPT], capture_output=True, text=True, env=env, check=True)
    want = {
        "background": "False False True True same",  # the second call started the loader
        "sync": "True False False True same",
        "off": "False False False False same",
    }[mode]
    assert " ".join(res.stdout.split()) == want, res.stdout
    assert "terminate" not in res.stderr


def test_large_inputs_wait_for_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """While the kernels load in the background, inputs beyond the PyTorch path's budget wait for them."""
    loaded = kiso.FAMILY.load()
    monkeypatch.setattr(_loader, "MODE", "background")
    monkeypatch.setattr(kiso.FAMILY, "kernels", _loader._UNSET)
    monkeypatch.setattr(kiso.FAMILY, "_unloaded_calls", 0)
    monkeypatch.setattr(kiso.FAMILY, "_thread", None)
    assert not kiso.ready(1, 8)  # small: the torch path (the first call starts nothing)
    assert kiso.ready(1, 1 + int(_loader.WARMUP_TORCH_MAX**0.5)) == (loaded is not None)
    assert kiso.FAMILY.kernels is loaded


# --------------------------------------------------------------------------------------------------
# CPU fast paths: short rows sorted inside the kernels, rows split across threads, the NaN check
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reg", REGS)
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sort_inside_kernels_equals_torch_sorted_path(
    reg: str, descending: bool, threads: int, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many rows (beyond the small-input size) are sorted inside the kernels, in parallel row chunks;
    values and gradients equal the composite path's, ties included (float64: and the torch-sorted
    fused path's)."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randint(-4, 5, (300, 17), generator=gen).to(dtype) / 2  # many ties
    x[::2] += torch.randn(150, 17, generator=gen, dtype=dtype)
    x[1, :4] = torch.tensor([0.0, -0.0, 0.0, -0.0], dtype=dtype)  # signed zeros tie
    g = torch.randn(300, 17, generator=gen, dtype=dtype)
    kw = {"regularization": reg, "regularization_strength": 0.3, "descending": descending}
    monkeypatch.setattr(_parallel, "PARALLEL_MIN_NUMEL", 64)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        results = []
        for max_n in (0, 128) if dtype == torch.float64 else (128,):  # 0: torch sorts
            monkeypatch.setattr(kiso, "SORT_INSIDE_MAX_N", max_n)
            monkeypatch.setattr(kiso, "SORT_INSIDE_WHEN_THREADED", max_n == 128)
            assert kiso._sort_inside(*x.shape, dtype) == (max_n == 128)
            for fn in (rankwise.soft_rank, rankwise.soft_sort):
                results.append(_value_and_grad(lambda t, fn=fn: fn(t, **kw), x, g))
    finally:
        torch.set_num_threads(old)
    for a, b in zip(results[:2], results[2:]):
        torch.testing.assert_close(a[0], b[0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(a[1], b[1], rtol=1e-6, atol=1e-6)
    monkeypatch.setattr(iso, "_BACKEND", "torch")  # and the composite reference path agrees
    for fn, (y, gx) in zip((rankwise.soft_rank, rankwise.soft_sort), results[-2:]):
        y2, g2 = _value_and_grad(lambda t, fn=fn: fn(t, **kw), x, g)
        torch.testing.assert_close(y, y2, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(gx, g2, rtol=1e-5, atol=1e-4)


def test_sort_inside_rule() -> None:
    """float32 rows are always sorted in the kernels; float64: short rows, small inputs, and several
    rows on more than one thread."""
    old = torch.get_num_threads()
    f64 = torch.float64
    try:
        torch.set_num_threads(1)
        assert kiso._sort_inside(256, 256, torch.float32) and kiso._sort_inside(1, 100000, torch.float32)
        assert kiso._sort_inside(4096, 64, f64) and kiso._sort_inside(1, 1000, f64)
        assert not kiso._sort_inside(256, 256, f64)
        torch.set_num_threads(2)
        assert kiso._sort_inside(256, 256, f64) and kiso._sort_inside(2, 4096, f64)
        assert not kiso._sort_inside(1, 4096, f64)
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("shape", [(300, 17), (40, 700), (5, 3000)])
def test_openmp_team_equals_python_threads_and_serial(shape: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """float32 rows split over torch's OpenMP team (the default with 2 threads) give bit-identical
    values and gradients to the Python-thread split and to one serial pass, ties included."""
    kiso.FAMILY.load()
    omp = _parallel.gomp
    if omp is None:
        pytest.skip("torch's OpenMP runtime is not usable here")
    gen = torch.Generator().manual_seed(5)
    x = torch.randint(-4, 5, shape, generator=gen).float() / 2
    x[::2] += torch.randn(x[::2].shape, generator=gen)
    g = torch.randn(shape, generator=gen)
    monkeypatch.setattr(_parallel, "PARALLEL_MIN_NUMEL", 64)
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert _parallel.team_threads(shape[0], shape[0] * shape[1], torch.float32) == 2
        for fn in (rankwise.soft_rank, rankwise.soft_sort):
            for reg in REGS:
                for descending in (False, True):
                    kw = {"regularization": reg, "regularization_strength": 0.3, "descending": descending}
                    results = []
                    for mode in ("omp", "python", "serial"):
                        monkeypatch.setattr(_parallel, "gomp", omp if mode == "omp" else None)
                        monkeypatch.setattr(_parallel, "PARALLEL_MIN_NUMEL", 1 << 60 if mode == "serial" else 64)
                        results.append(_value_and_grad(lambda t, fn=fn, kw=kw: fn(t, **kw), x, g))
                    for y, gx in results[1:]:
                        assert torch.equal(y, results[0][0]) and torch.equal(gx, results[0][1]), (fn, kw)
    finally:
        torch.set_num_threads(old)


def test_openmp_team_rule() -> None:
    """Only float32 passes with 2+ threads, 2+ rows and enough elements go to the OpenMP team."""
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        big = _parallel.PARALLEL_MIN_NUMEL
        kiso.FAMILY.load()
        expect = 2 if _parallel.gomp is not None else 0
        assert _parallel.team_threads(64, big, torch.float32) == expect
        assert _parallel.team_threads(64, big, torch.float64) == 0
        assert _parallel.team_threads(1, big, torch.float32) == 0
        assert _parallel.team_threads(64, big - 1, torch.float32) == 0
        torch.set_num_threads(1)
        assert _parallel.team_threads(64, big, torch.float32) == 0
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("n", [1, 2, 17, 64, 65, 300, 4096, 8191, 8192, 30000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kernel_sort_is_torch_stable_descending_sort(n: int, dtype: torch.dtype) -> None:
    """The kernels' row sort (float32: insertion for short rows, radix with 8- then 11-bit digits;
    float64: merge sort) is ``torch.sort(descending=True, stable=True)``: ties in index order, -0.0
    equal to +0.0, subnormals, huge values, constant and presorted rows."""
    from rankwise._kernels import _numba_sort

    nb = kiso.FAMILY.load()
    if nb is None:
        pytest.skip("numba unavailable")
    gen = torch.Generator().manual_seed(n)
    rows = [
        torch.randn(n, generator=gen),
        torch.randint(-4, 5, (n,), generator=gen) / 2.0,
        torch.where(torch.rand(n, generator=gen) < 0.5, -0.0, 0.0),
        torch.full((n,), 3.5),
        torch.randint(-3, 3, (n,), generator=gen) * 1e30,
        torch.randn(n, generator=gen).sort().values,
        torch.randn(n, generator=gen).sort(descending=True).values,
        torch.randn(n, generator=gen) * 1e-39,  # subnormal float32
    ]
    for z in rows:
        z = z.to(dtype).contiguous()
        want = torch.sort(z, descending=True, stable=True).indices
        perm = torch.empty(n, dtype=torch.int64)
        _numba_sort.descending_order(z.numpy(), perm.numpy(), *_numba_sort.sort_scratch(n))
        assert torch.equal(perm, want)


@pytest.mark.parametrize("reg", REGS)
@pytest.mark.parametrize("shape", [(3, 5), (3, 40), (3, 900)])  # kernel sorts / kernel sorts / torch sorts
def test_nan_rows_on_the_cpu_fast_path(reg: str, shape: tuple[int, int]) -> None:
    """The CPU path skips the NaN pass when the input's sum is finite: a NaN or inf still makes its
    whole row NaN, other rows are untouched (values and finite gradients); finite values whose sum
    overflows stay finite."""
    rows, n = shape
    x = torch.randn(rows, n)
    x[0, 1], x[2, -1] = math.nan, -math.inf
    for fn in (rankwise.soft_rank, rankwise.soft_sort):
        xr = x.clone().requires_grad_()
        y = fn(xr, regularization=reg)
        assert torch.isnan(y[0]).all() and torch.isnan(y[2]).all() and torch.isfinite(y[1]).all(), fn
        torch.testing.assert_close(y[1], fn(x[1:2], regularization=reg)[0])
        y[1].sum().backward()
        assert xr.grad is not None and torch.isfinite(xr.grad[1]).all()
        big = torch.full((2, n), 3e38)  # each value finite, the sum overflows to inf
        big[:, 0] = -1e38
        out = fn(big, regularization=reg, regularization_strength=1e30)
        assert torch.isfinite(out).all(), fn


# --------------------------------------------------------------------------------------------------
# huge magnitudes: the strength is negligible relative to the spread
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reg", REGS)
@pytest.mark.parametrize(
    ("scale", "eps"), [(1e18, 1.0), (1e30, 1.0), (1e15, 1e-3), (1e16, 1.0), (1.0, 1e-30), (1e-30, 1e-45)]
)
def test_exact_ranks_and_sort_where_the_strength_is_negligible(
    backend: str, dtype: torch.dtype, reg: str, scale: float, eps: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(iso, "_BACKEND", backend)
    x = torch.tensor([[1.0, 3.0, 2.0, 4.0], [4.0, -2.0, 0.5, 3.0]], dtype=torch.float64) * scale
    if not torch.isfinite(x.to(dtype)).all() or (x.to(dtype) == 0).any():
        pytest.skip("not representable in this dtype")
    xt = x.to(dtype).requires_grad_()
    kw = {"regularization": reg, "regularization_strength": eps}
    r = rankwise.soft_rank(xt, method="isotonic", **kw)
    torch.testing.assert_close(r.double(), rankwise.rank(x).double(), rtol=0, atol=1e-6)
    r_desc = rankwise.soft_rank(xt, method="isotonic", descending=True, **kw)
    torch.testing.assert_close(r_desc.double(), rankwise.rank(x, descending=True).double(), rtol=0, atol=1e-6)
    # the exact-rank regime: ranks are locally constant (zero gradient)
    (g_r,) = torch.autograd.grad(r.sum(), xt)
    assert torch.equal(g_r, torch.zeros_like(g_r))
    # the soft sort's strength acts on rho / eps: negligible when 1 / eps dwarfs the spread of x
    s = rankwise.soft_sort(xt, method="isotonic", **kw)
    if eps * scale < 1e-6:
        torch.testing.assert_close(s, torch.sort(xt.detach(), dim=-1).values, rtol=1e-6, atol=0)
        (g_s,) = torch.autograd.grad((s * torch.arange(1.0, 5.0, dtype=dtype)).sum(), xt)
        order = torch.sort(xt.detach(), dim=-1).indices
        want = torch.empty_like(g_s).scatter_(-1, order, torch.arange(1.0, 5.0).to(dtype).expand(2, 4))
        torch.testing.assert_close(g_s, want)
    elif reg == "l2":  # strongly regularized: l2 keeps the row's sum
        torch.testing.assert_close(s.double().sum(-1), x.sum(-1), rtol=1e-5, atol=0)


@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize("reg", REGS)
def test_large_offsets_keep_the_soft_part_exact(backend: str, reg: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries far apart (1e18) are ranked exactly; entries near each other are soft-ranked among
    themselves as if the others were absent (the slow reference on the small block, shifted), also
    when all of them sit on a large offset (1e18 + 128 k: exact float64 differences)."""
    monkeypatch.setattr(iso, "_BACKEND", backend)
    small = np.array([0.3, -0.2, 0.9])
    x = torch.tensor([[2e18, 1e18, *small], [-1e18, 5e18, *small]], dtype=torch.float64)
    r = rankwise.soft_rank(x, method="isotonic", regularization=reg, regularization_strength=0.5)
    soft = torch.from_numpy(ref_rank(small, 0.5, reg))
    torch.testing.assert_close(
        r[0], torch.cat([torch.tensor([5.0, 4.0], dtype=torch.float64), soft]), atol=1e-9, rtol=0
    )
    torch.testing.assert_close(
        r[1], torch.cat([torch.tensor([1.0, 5.0], dtype=torch.float64), soft + 1]), atol=1e-9, rtol=0
    )
    # on a large offset: the differences (multiples of 128 = ulp(1e18)) are exact
    k = torch.tensor([[0.0, 3.0, 1.0, 2.0, 5.0, 4.0]], dtype=torch.float64)
    x2 = 1e18 + 128.0 * k
    r2 = rankwise.soft_rank(x2, method="isotonic", regularization=reg, regularization_strength=128.0 * 0.7)
    ref2 = torch.from_numpy(ref_rank(k[0].numpy(), 0.7, reg))
    torch.testing.assert_close(r2[0], ref2, atol=1e-9, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_spearman_loss_zero_for_rank_correlated_huge_predictions(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    target = torch.randn(32, generator=g, dtype=torch.float64)
    pred = (1e20 * (3.0 + torch.sort(torch.rand(32, generator=g, dtype=torch.float64)).values)).to(dtype)
    pred = pred[torch.argsort(torch.argsort(target))].requires_grad_()  # the same order as target
    loss = rankwise.losses.spearman_loss(pred, target.to(dtype))
    assert abs(loss.item()) < 1e-9
    loss.backward()
    assert pred.grad is not None and torch.isfinite(pred.grad).all()


@pytest.mark.parametrize("reg", REGS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_soft_ranks_stay_in_range_at_any_magnitude(reg: str, dtype: torch.dtype) -> None:
    """Soft ranks are a point of the permutahedron of (1..n): each in [1, n], their sum n(n+1)/2."""
    g = torch.Generator().manual_seed(1)
    n = 9
    for e in range(-30, 31, 3):
        for eps in (1e-6, 1e-2, 1.0, 1e3):
            x = (torch.randn(4, n, generator=g, dtype=torch.float64) * 10.0**e).to(dtype)
            x[1, 3] = x[1, 5]  # a tie
            x[2] = x[2].abs() + 10.0**e  # one sign
            r = rankwise.soft_rank(x, method="isotonic", regularization=reg, regularization_strength=eps).double()
            assert torch.isfinite(r).all()
            assert (r >= 1 - 1e-4).all() and (r <= n + 1e-4).all(), (e, eps, r)
            torch.testing.assert_close(
                r.sum(-1), torch.full((4,), n * (n + 1) / 2, dtype=torch.float64), rtol=1e-5, atol=0
            )


@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("reg", ["l2", "kl"])
@pytest.mark.parametrize(("scale", "eps"), [(1.0, 1e-30), (1.0, 1e-3), (1e-3, 1e-6), (0.1, 1.0), (1e3, 1e-3)])
def test_block_constant_cotangent_gives_an_exact_zero_gradient(
    backend: str, dtype: torch.dtype, reg: str, scale: float, eps: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # soft ranks always sum to n (n + 1) / 2, so d(sum r)/dx = 0 exactly; the vector-Jacobian product of a
    # constant cotangent must not leave a round-off of u |x| / eps (float16 -inf at eps = 1e-30 for kl)
    monkeypatch.setattr(iso, "_BACKEND", backend)
    if backend == "auto":
        monkeypatch.setattr(_loader, "MODE", "sync")  # the CPU kernels serve it (not the torch path while they load)
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(4, 9, generator=g, dtype=torch.float64) * scale).to(dtype)
    x[:, 3] = x[:, 5]
    x[0] = x[0].sign()  # a row of two tied blocks
    x = x.requires_grad_()
    y = rankwise.soft_rank(x, method="isotonic", regularization=reg, regularization_strength=eps)
    assert torch.allclose(y.double().sum(-1), torch.full((4,), 45.0, dtype=torch.float64), rtol=1e-3)
    (y * 2.5).sum().backward()
    assert x.grad is not None and x.grad.dtype == dtype
    assert torch.isfinite(x.grad).all()
    assert x.grad.abs().max().item() <= 1e-6 / eps, x.grad


@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize("eps", [1e-3, 0.3, 3.0])
def test_kl_rank_gradients_exact_on_both_paths(backend: str, eps: float, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(iso, "_BACKEND", backend)
    g = torch.Generator().manual_seed(4)
    for scale in (1.0, 1e3):  # 1e3 / 1e-3 takes the conditioned float64 path on CPU
        x = (torch.randn(3, 6, generator=g, dtype=torch.float64) * scale).requires_grad_()
        fn = lambda v: rankwise.soft_rank(v, method="isotonic", regularization="kl", regularization_strength=eps)  # noqa: E731
        assert torch.autograd.gradcheck(fn, (x,))
        assert torch.autograd.gradgradcheck(fn, (x,))
