"""The LapSum kernels of rankwise._kernels.lapsum against the operators' torch path: values and
gradients of lapsum_rank / lapsum_sort / lapsum_topk and soft_rank / soft_sort / soft_topk with
method="lapsum" (float32/float64, n = 1, ties, leading dims, any dim, descending, several k and
alpha), the NaN policy, gradcheck of the kernel path, and the first-derivatives-only rule."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import rankwise
import rankwise.ops.lapsum as lapsum_ops
from rankwise._kernels import lapsum as klapsum


@pytest.fixture(autouse=True)
def _kernels_loaded() -> None:
    if klapsum.FAMILY.load() is None:
        pytest.skip("numba unavailable")


def _call(fn: Any, x: torch.Tensor, kw: dict[str, Any], g: torch.Tensor | None, *, kernel: bool, monkeypatch: Any):
    calls: list[int] = []
    real = lapsum_ops._use_kernels

    def use(t: torch.Tensor) -> bool:
        ok = kernel and real(t)
        calls.append(int(ok))
        return ok

    with monkeypatch.context() as m:
        m.setattr(lapsum_ops, "_use_kernels", use)
        xr = x.clone().requires_grad_()
        out = fn(xr, **kw)
        gr = torch.autograd.grad(out, xr, out if g is None else g)[0] if g is not None else None
    if kernel and kw.get("k", 0) < x.shape[kw.get("dim", -1)]:  # (k = n: all ones, no kernel call)
        assert calls and all(calls), "the kernel path was not taken"
    return out.detach(), gr


def _data(seed: int, shape: tuple[int, ...], dtype: torch.dtype, ties: bool) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * 2
    if ties:
        x = (x * 2).round() / 2
    return x.to(dtype)


def _tol(dtype: torch.dtype, n: int) -> dict[str, float]:
    return {"rtol": 1e-10, "atol": 1e-10 * n} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-5 * n}


def _ops(n: int) -> list[tuple[str, Any, dict[str, Any]]]:
    ops: list[tuple[str, Any, dict[str, Any]]] = [
        ("rank", rankwise.lapsum_rank, {}),
        ("sort", rankwise.lapsum_sort, {}),
        ("soft_rank", rankwise.soft_rank, {"method": "lapsum"}),
        ("soft_sort", rankwise.soft_sort, {"method": "lapsum"}),
    ]
    for k in sorted({0.5, 1, max(1, n // 3), n - 0.5, n}):
        if 0 < k <= n:
            ops.append((f"topk{k}", rankwise.lapsum_topk, {"k": k}))
            if isinstance(k, int):
                ops.append((f"soft_topk{k}", rankwise.soft_topk, {"k": k, "method": "lapsum"}))
    return ops


CASES = [((1,), False), ((2,), True), ((3, 7), False), ((3, 7), True), ((2, 3, 19), True), ((4, 64), False)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("shape", "ties"), CASES)
@pytest.mark.parametrize("alpha", [0.05, 0.7, 5.0])
@pytest.mark.parametrize("descending", [False, True])
def test_kernel_equals_torch_path(
    dtype: torch.dtype, shape: tuple[int, ...], ties: bool, alpha: float, descending: bool, monkeypatch: Any
) -> None:
    x = _data(len(shape) * 31 + shape[-1], shape, dtype, ties)
    n = shape[-1]
    for name, fn, kw in _ops(n):
        kw = {**kw, "alpha": alpha, "descending": descending}
        g = _data(7, shape, dtype, False)
        ref, gref = _call(fn, x, kw, g, kernel=False, monkeypatch=monkeypatch)
        out, gout = _call(fn, x, kw, g, kernel=True, monkeypatch=monkeypatch)
        assert out.dtype == ref.dtype, name
        torch.testing.assert_close(out, ref, **_tol(dtype, n), msg=lambda m, name=name: f"{name} values: {m}")
        torch.testing.assert_close(gout, gref, **_tol(dtype, n), msg=lambda m, name=name: f"{name} grads: {m}")


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_kernel_equals_torch_path_along_any_dim(dim: int, monkeypatch: Any) -> None:
    x = _data(3, (5, 6, 4), torch.float64, True)[:, ::2]  # non-contiguous
    for _, fn, kw in [*_ops(x.shape[dim])[:2], ("topk", rankwise.lapsum_topk, {"k": 2})]:
        kw = {**kw, "alpha": 0.3, "dim": dim}
        g = torch.randn(x.shape, dtype=torch.float64)
        ref, gref = _call(fn, x, kw, g, kernel=False, monkeypatch=monkeypatch)
        out, gout = _call(fn, x, kw, g, kernel=True, monkeypatch=monkeypatch)
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(gout, gref, rtol=1e-10, atol=1e-10)


def test_wide_spread_and_long_rows(monkeypatch: Any) -> None:
    """Scores far apart relative to alpha (prefix sums of tiny exponentials) and a long row."""
    x = torch.cat([torch.linspace(-300.0, 300.0, 50, dtype=torch.float64), torch.randn(2000, dtype=torch.float64)])
    for _, fn, kw in [*_ops(x.shape[-1])[:2], ("topk", rankwise.lapsum_topk, {"k": 17.5})]:
        kw = {**kw, "alpha": 0.1}
        g = torch.randn(x.shape, dtype=torch.float64)
        ref, gref = _call(fn, x, kw, g, kernel=False, monkeypatch=monkeypatch)
        out, gout = _call(fn, x, kw, g, kernel=True, monkeypatch=monkeypatch)
        torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(gout, gref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_policy(bad: float, monkeypatch: Any) -> None:
    x = torch.randn(3, 5, dtype=torch.float64)
    x[1, 2] = bad
    for _, fn, kw in [*_ops(5)[:2], ("topk", rankwise.lapsum_topk, {"k": 2})]:
        ref, _ = _call(fn, x, {**kw, "alpha": 0.5}, None, kernel=False, monkeypatch=monkeypatch)
        out, gout = _call(
            fn, x, {**kw, "alpha": 0.5}, torch.ones(3, 5, dtype=torch.float64), kernel=True, monkeypatch=monkeypatch
        )
        torch.testing.assert_close(out, ref, equal_nan=True)
        assert out[1].isnan().all() and out[[0, 2]].isfinite().all()
        assert gout is not None and (gout[1] == 0).all() and gout.isfinite().all()


@pytest.mark.parametrize("descending", [False, True])
def test_gradcheck_kernel_path(descending: bool) -> None:
    x = _data(5, (2, 6), torch.float64, False).requires_grad_()
    assert lapsum_ops._use_kernels(x.detach())
    for fn, kw in ((rankwise.lapsum_rank, {}), (rankwise.lapsum_sort, {}), (rankwise.lapsum_topk, {"k": 2.5})):
        assert torch.autograd.gradcheck(lambda t, fn=fn, kw=kw: fn(t, alpha=0.6, descending=descending, **kw), (x,))


def test_second_derivatives_raise() -> None:
    x = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    for fn, kw in ((rankwise.lapsum_rank, {}), (rankwise.lapsum_sort, {}), (rankwise.lapsum_topk, {"k": 2})):
        out = fn(x, **kw)
        with pytest.raises(RuntimeError, match="first derivatives only"):
            torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
