"""Isotonic soft sort/rank against an exact pool-adjacent-violators, and torchsort at large n.

The tie tolerance under which the kernels pool two block values must not grow with n: at n = 1000
two values 1e-9 apart are not tied. The reference (:mod:`tests.ops._exact_pav`)
pools exactly (integer arithmetic for l2, 192-bit mpmath for kl), so on random inputs the block
structure of every path must equal it exactly, and values/gradients follow from it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rankwise
from rankwise._kernels import isotonic as kiso
from rankwise.ops import isotonic as iso
from tests.ops._exact_pav import exact_pav


def _inputs(kind: str, reg: str, x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The (s, w) pair the op hands to the PAV (both sorted decreasingly), for one row ``x`` (1, n)."""
    n = x.shape[-1]
    rho = torch.arange(n, 0, -1, dtype=torch.float64).unsqueeze(0)
    if kind == "rank":
        s = torch.sort(x / eps, dim=-1, descending=True).values
        return s, (rho if reg == "l2" else torch.log(rho))
    w = torch.sort(-x, dim=-1, descending=True).values  # ascending soft sort projects onto P(-x)
    return (rho / eps).contiguous(), w


def _check_blocks(s: torch.Tensor, w: torch.Tensor, reg: str) -> None:
    ids_ref, v_ref = exact_pav(s[0].numpy(), w[0].numpy(), reg)
    mu, ids = iso._isotonic(s, w, reg)
    n_diff = int((ids[0].numpy() != ids_ref).sum())
    assert n_diff == 0, f"{n_diff} of {s.shape[-1]} block ids differ from the exact PAV"
    mag = (s.abs() + w.abs()).numpy()[0] + 1.0
    err = np.abs(mu[0].numpy() - (s[0].numpy() - v_ref)) / mag
    assert err.max() < 1e-12, err.max()


def _grad_from_blocks(x: torch.Tensor, g: torch.Tensor, eps: float, reg: str) -> tuple[np.ndarray, np.ndarray]:
    """Value and gradient of ``(soft_rank(x) * g).sum()`` (ascending) from the exact block structure."""
    s, w = _inputs("rank", reg, x, eps)
    perm = torch.sort(x / eps, dim=-1, descending=True, stable=True).indices[0].numpy()
    ids, v = exact_pav(s[0].numpy(), w[0].numpy(), reg)
    mu = s[0].numpy() - v
    gs = g[0].numpy()[perm]
    if reg == "kl":
        gs = gs * np.exp(mu)  # out = exp(mu)
    sums = np.bincount(ids, weights=gs)
    if reg == "l2":
        grad_s = gs - sums[ids] / np.bincount(ids)[ids]
    else:
        e = np.exp(s[0].numpy() - np.maximum.reduceat(s[0].numpy(), np.flatnonzero(np.diff(ids, prepend=-1)))[ids])
        grad_s = gs - e / np.bincount(ids, weights=e)[ids] * sums[ids]
    out, grad = np.empty_like(mu), np.empty_like(mu)
    out[perm] = mu if reg == "l2" else np.exp(mu)
    grad[perm] = grad_s / eps
    return out, grad


# --------------------------------------------------------------------------------------------------
# the reproduction: values 1e-9 apart were pooled as ties
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize("n", [10, 1000])
def test_values_1e9_apart_are_not_pooled(n: int, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(iso, "_BACKEND", backend)
    x = 2.0 * torch.arange(float(n), dtype=torch.float64)[None]
    x[0, 1] = 1 + 1e-9
    x.requires_grad_()
    y = rankwise.soft_rank(x, method="isotonic", regularization_strength=1.0)
    torch.testing.assert_close(y[0, :2].detach(), torch.tensor([1.0, 2.0], dtype=torch.float64), rtol=0, atol=1e-15)
    y[0, 1].backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad[0, :2], torch.zeros(2, dtype=torch.float64), rtol=0, atol=0)
    s, w = _inputs("rank", "l2", x.detach(), 1.0)
    _check_blocks(s, w, "l2")


@pytest.mark.slow
def test_kl_gradient_at_n_1e5_matches_exact_blocks() -> None:
    """torch.manual_seed(0); randn(1, 100000), KL, strength 1: one gradient entry was 3.9e4 off."""
    torch.manual_seed(0)
    x = torch.randn(1, 100000, dtype=torch.float64)
    g = torch.randn(1, 100000, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    a = x.clone().requires_grad_()
    y = rankwise.soft_rank(a, method="isotonic", regularization="kl", regularization_strength=1.0)
    (y * g).sum().backward()
    assert a.grad is not None
    want_y, want_g = _grad_from_blocks(x, g, 1.0, "kl")
    np.testing.assert_allclose(y.detach()[0].numpy(), want_y, rtol=1e-10, atol=1e-9)
    scale = np.abs(want_g).max()
    np.testing.assert_allclose(a.grad[0].numpy(), want_g, rtol=0, atol=1e-9 * scale)


# --------------------------------------------------------------------------------------------------
# block structure == exact PAV on random inputs, every size
# --------------------------------------------------------------------------------------------------
CASES = [  # (kind, reg, strength): strengths give many non-trivial blocks at these n
    ("rank", "l2", 1e-3),
    ("rank", "l2", 1e-4),
    ("rank", "kl", 1.0),
    ("rank", "kl", 1e-2),
    ("sort", "l2", 1.0),
    ("sort", "kl", 1e-3),
]


BIG = [("rank", "l2", 1e-3), ("rank", "l2", 1e-4), ("rank", "kl", 1.0), ("sort", "l2", 1.0), ("sort", "kl", 1e-3)]


@pytest.mark.parametrize(
    ("kind", "reg", "eps", "n"),
    [(*c, n) for n in (1000, 10000) for c in CASES]
    + [pytest.param(*c, 100000, marks=pytest.mark.slow) for c in BIG],  # exact KL at 1e5 takes seconds
)
def test_numba_blocks_equal_exact_pav(kind: str, reg: str, eps: float, n: int) -> None:
    if kiso.FAMILY.load() is None:
        pytest.skip("numba is unavailable")
    gen = torch.Generator().manual_seed(n + len(kind) + len(reg))
    x = torch.randn(1, n, dtype=torch.float64, generator=gen)
    if kind == "sort":
        x = x * n / 4  # spacing of x comparable to the spacing of rho / eps
    _check_blocks(*_inputs(kind, reg, x, eps), reg)


@pytest.mark.parametrize(("kind", "reg", "eps"), CASES)
def test_torch_path_blocks_equal_exact_pav(kind: str, reg: str, eps: float, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(iso, "_BACKEND", "torch")
    n = 1500
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(1, n, dtype=torch.float64, generator=gen)
    if kind == "sort":
        x = x * n / 4
    _check_blocks(*_inputs(kind, reg, x, eps), reg)


@pytest.mark.parametrize("reg", ["l2", "kl"])
@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_near_ties_at_every_scale(reg: str, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Adjacent values 1e-9..1e-13 (relative) off an exact tie, amid magnitudes ~1e4, on either side."""
    monkeypatch.setattr(iso, "_BACKEND", backend)
    n = 1200
    x = 3.0 * torch.arange(float(n), dtype=torch.float64)[None] + 1e4
    for k, rel in enumerate([1e-9, -1e-9, 1e-10, -1e-11, 1e-12, -1e-12, 1e-13]):
        i = 100 + 150 * k
        x[0, i + 1] = x[0, i] + 1.0 + rel * x[0, i]  # gap 1 would tie the two block values exactly
    _check_blocks(*_inputs("rank", reg, x, 1.0), reg)


# --------------------------------------------------------------------------------------------------
# torchsort at n = 1e5: values and gradients
# --------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("reg", ["l2", "kl"])
@pytest.mark.parametrize("kind", ["rank", "sort"])
def test_matches_torchsort_at_n_1e5(kind: str, reg: str) -> None:
    torchsort = pytest.importorskip("torchsort")
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 100000, dtype=torch.float64, generator=gen)
    g = torch.randn(2, 100000, dtype=torch.float64, generator=gen)
    eps = {"rank": {"l2": 1e-3, "kl": 1.0}, "sort": {"l2": 1e-3, "kl": 1e-2}}[kind][reg]
    ours = rankwise.soft_rank if kind == "rank" else rankwise.soft_sort
    theirs = torchsort.soft_rank if kind == "rank" else torchsort.soft_sort
    results = []
    for f in (
        lambda t: ours(t, method="isotonic", regularization=reg, regularization_strength=eps),
        lambda t: theirs(t, regularization=reg, regularization_strength=eps),
    ):
        a = x.clone().requires_grad_()
        y = f(a)
        (y * g).sum().backward()
        assert a.grad is not None
        results.append((y.detach(), a.grad))
    (y1, g1), (y2, g2) = results
    torch.testing.assert_close(y1, y2, rtol=1e-9, atol=1e-9)
    assert torch.isfinite(g2).all()
    off = ~torch.isclose(g1, g2, rtol=1e-9, atol=1e-9 * float(g2.abs().max()))
    if off.any():
        # torchsort pools with no tolerance on KL values that carry more round-off (log-sum-exps
        # accumulated over n): at n = 1e5 it splits or pools a few exact-arithmetic blocks
        # differently. Where they disagree, ours must be the exact PAV's gradient.
        assert kind == "rank" and reg == "kl", f"{int(off.sum())} gradient entries differ from torchsort"
        assert int(off.sum()) < 100
        for r in sorted(set(torch.nonzero(off)[:, 0].tolist())):
            _, want = _grad_from_blocks(x[r : r + 1], g[r : r + 1], eps, reg)
            np.testing.assert_allclose(g1[r].numpy(), want, rtol=0, atol=1e-9 * np.abs(want).max())
            assert not np.allclose(g2[r].numpy(), want, rtol=0, atol=1e-9 * np.abs(want).max())
