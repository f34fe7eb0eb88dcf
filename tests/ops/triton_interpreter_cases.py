"""Cases for the Triton PAV kernels of the isotonic operators under the Triton interpreter (CPU).

``tests/ops/test_isotonic_triton.py`` runs this module in a subprocess with ``TRITON_INTERPRET=1``:
the variable must be set before triton is imported (triton's own language functions are decorated
then), so these cases cannot share a process with compiled kernels. The references are the numba
kernels (CPU).
"""

from __future__ import annotations

import functools
import os
import types
from typing import Any

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs TRITON_INTERPRET=1 before triton is imported", allow_module_level=True)

import rankwise
from rankwise._kernels import _numba_isotonic as nb  # the numba kernels (CPU references)
from rankwise.ops import isotonic as iso

pytest.importorskip("triton")

REGS = ["l2", "kl"]
OPS = [rankwise.soft_rank_isotonic, rankwise.soft_sort_isotonic]


@pytest.fixture
def interpreted() -> types.ModuleType:
    """The kernels module (interpreted: imported under ``TRITON_INTERPRET=1``)."""
    tk = iso._triton_kernels()
    assert tk is not None
    return tk


@pytest.fixture
def triton_backend(interpreted: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """Route every isotonic projection through the (interpreted) Triton kernels."""
    monkeypatch.setattr(iso, "_BACKEND", "triton")
    return interpreted


def _sorted_rows(rows: int, n: int, dtype: torch.dtype, g: torch.Generator, ties: bool) -> torch.Tensor:
    x = torch.randn(rows, n, generator=g, dtype=torch.float64)
    if ties:
        x = (x * 1.5).round()
    return x.sort(-1, descending=True).values.to(dtype)


def _numba_projection(s, w, kl, g):  # type: ignore[no-untyped-def]
    """numba's ``mu``, block ids, ``grad_s`` and ``grad_w`` (``w`` shape kept)."""
    mu = torch.empty_like(s)
    ids = torch.empty(s.shape, dtype=torch.int64)
    (nb.pav_kl if kl else nb.pav_l2)(s.numpy(), w.numpy(), mu.numpy(), ids.numpy())
    gs = torch.empty_like(s)
    gw = torch.zeros_like(w)
    nb.pav_backward(g.numpy(), s.numpy(), w.numpy(), ids.numpy(), kl, True, True, gs.numpy(), gw.numpy())
    return mu, ids, gs, gw


@pytest.mark.parametrize("reg", REGS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("shared_w", [False, True], ids=["w_rows", "w_shared"])
def test_projection_matches_numba(interpreted, reg, dtype, ties, shared_w) -> None:  # type: ignore[no-untyped-def]
    """Values, block ids and both input gradients equal the numba kernels' (same pooling rule)."""
    gen = torch.Generator().manual_seed(hash((reg, str(dtype), ties, shared_w)) % 2**31)
    for rows, n in [(3, 1), (4, 9), (2, 37)]:
        s = _sorted_rows(rows, n, dtype, gen, ties)
        w = _sorted_rows(1 if shared_w else rows, n, dtype, gen, ties)
        g = torch.randn(rows, n, generator=gen, dtype=torch.float64).to(dtype)
        mu_ref, ids_ref, gs_ref, gw_ref = _numba_projection(s, w, reg == "kl", g)
        # float64 results rounded to the input dtype (float32 may differ by an ulp: other exp/log)
        close = functools.partial(torch.testing.assert_close, **_tol(dtype, 1e-12))
        mu, state = interpreted.projection_forward(s, w, reg == "kl")
        assert mu.dtype == dtype and state[0].dtype == torch.int32
        assert torch.equal(state[0].long(), ids_ref)  # the same blocks
        close(mu, mu_ref)
        gs, gw = interpreted.projection_backward(g, s, w, state, reg == "kl", True, True)
        assert gw is not None and gw.shape == w.shape
        close(gs, gs_ref)
        close(gw, gw_ref)
        # only one of the two gradients
        gs_only, none_w = interpreted.projection_backward(g, s, w, state, reg == "kl", True, False)
        none_s, gw_only = interpreted.projection_backward(g, s, w, state, reg == "kl", False, True)
        assert none_w is None and none_s is None
        close(gs_only, gs_ref)
        close(gw_only, gw_ref)


@pytest.mark.parametrize("reg", REGS)
@pytest.mark.parametrize("chunk", [1, 4, 5, 16])
def test_chunked_projection_matches_numba(interpreted, reg, chunk) -> None:  # type: ignore[no-untyped-def]
    """Rows cut into pieces of ``chunk`` positions (PAV per piece, then over the pieces' blocks, then
    the binary-search pass): the same blocks, values and gradients as numba's one sequential PAV;
    ties, distinct values, shared and per-row ``w``."""
    gen = torch.Generator().manual_seed(chunk)
    for dtype, ties, shared_w, (rows, n) in [
        (torch.float64, False, False, (3, 9)),
        (torch.float32, True, True, (2, 37)),
        (torch.float64, True, False, (1, 130)),
        (torch.float32, False, True, (2, 64)),
    ]:
        s = _sorted_rows(rows, n, dtype, gen, ties) * (1.0 if reg == "kl" else 3.0)
        w = _sorted_rows(1 if shared_w else rows, n, dtype, gen, ties)
        g = torch.randn(rows, n, generator=gen, dtype=torch.float64).to(dtype)
        mu_ref, ids_ref, gs_ref, gw_ref = _numba_projection(s, w, reg == "kl", g)
        mu, state = interpreted.projection_forward(s, w, reg == "kl", chunk=chunk)
        assert torch.equal(state[0].long(), ids_ref)
        close = functools.partial(torch.testing.assert_close, **_tol(dtype, 1e-12))
        close(mu, mu_ref)
        gs, gw = interpreted.projection_backward(g, s, w, state, reg == "kl", True, True)
        close(gs, gs_ref)
        close(gw, gw_ref)


def _far_rows(n: int, dtype: torch.dtype, gen: torch.Generator, eps: float) -> torch.Tensor:
    """Rows for the soft-rank conditioning: values of a few ``eps`` (not conditioned), runs of nearby values
    around 1e15 to 1e18 separated by wide gaps (conditioned: several runs, some crossing the
    kernel's chunks), a run of exact ties, a NaN row and an inf row."""
    unit = 3 * eps * torch.randn(n, generator=gen, dtype=torch.float64)
    centres = torch.tensor([1e18, -3e17, 2e15], dtype=torch.float64)[torch.arange(n) % 3]
    runs = centres * (1 + 1e-6 * torch.randn(n, generator=gen, dtype=torch.float64).round())
    tied = torch.where(torch.arange(n) < n // 2, 5e17, -5e17).to(torch.float64)
    nan = unit.clone()
    nan[n // 3] = float("nan")
    inf = runs.clone()
    inf[n - 2] = float("inf")
    return torch.stack([unit, runs, tied, nan, inf]).to(dtype)


@pytest.mark.parametrize("kl", [False, True], ids=["l2", "kl"])
@pytest.mark.parametrize("descending", [False, True], ids=["asc", "desc"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_rank_prologue_matches_the_conditioning(interpreted, kl, descending, dtype) -> None:  # type: ignore[no-untyped-def]
    """The soft ranks' prologue kernel: ``x / eps`` divided in the input dtype for ordinary rows
    (bit for bit), the run-by-run layout of ``_condition_rank_inputs`` for rows of large
    ``|x| / eps`` (rows of 3,000 cross the kernel's 1,024-position chunks), the weights and the rows'
    flags (NaN / inf, conditioned)."""
    gen = torch.Generator().manual_seed(7)
    for n, eps in [(2, 0.5), (40, 1e-3), (3000, 1e3)]:
        x = _far_rows(n, dtype, gen, eps)
        v = x.sort(-1, descending=not descending).values
        y = -v if descending else v
        limit = iso._gap_limit(n, kl)
        s, w, flags = interpreted.rank_prologue(v, eps, limit, iso._CONDITION_FACTOR * limit, descending, kl)
        want = iso._condition_rank_inputs(y.double(), eps, limit)
        far = (y.double().abs().amax(-1) / eps > iso._CONDITION_FACTOR * limit) & x.isfinite().all(-1)
        assert far[1:3].all() and not far[0]  # both kinds of rows are exercised
        assert torch.equal(flags.long(), (~x.isfinite().all(-1)).long() + 2 * far.long())
        ok = x.isfinite().all(-1)
        assert torch.equal(s[ok & ~far], (y / eps).double()[ok & ~far])  # divided in the input dtype
        torch.testing.assert_close(s[far], want[far], rtol=1e-13, atol=1e-9)
        assert s[far].diff(dim=-1).le(0).all()  # still decreasing
        torch.testing.assert_close(w, iso._rank_weights(n, torch.float64, x.device, kl))


@pytest.mark.parametrize("kl", [False, True], ids=["l2", "kl"])
def test_far_rows_through_the_operators(triton_backend, monkeypatch, kl) -> None:  # type: ignore[no-untyped-def]
    """Soft ranks and sorts of rows of 1e18-scale values (conditioned), with ties and a NaN/inf row,
    through the Triton path equal the CPU path: values and gradients, both directions (the NaN / inf
    rows: NaN values and zero gradients)."""
    gen = torch.Generator().manual_seed(8)
    x = _far_rows(200, torch.float64, gen, 1e-2)
    # (kl soft sort works in absolute units: at 1e17 its pooling is decided at round-off level, and
    # the two paths' gradients differ there; see soft_sort_isotonic's docstring)
    for op in OPS if not kl else OPS[:1]:
        for descending in (False, True):
            fn = functools.partial(
                op, regularization="kl" if kl else "l2", regularization_strength=1e-2, descending=descending
            )
            got = _value_and_grad(fn, x)
            monkeypatch.setattr(iso, "_BACKEND", "auto")
            want = _value_and_grad(fn, x)
            monkeypatch.setattr(iso, "_BACKEND", "triton")
            torch.testing.assert_close(got[0], want[0], rtol=1e-9, atol=1e-9, equal_nan=True)
            torch.testing.assert_close(got[1][:3], want[1][:3], rtol=1e-9, atol=1e-9)
            assert got[0][3:].isnan().all() and not got[0][:3].isnan().any()
            assert (got[1][3:] == 0).all()  # the NaN / inf rows: zero gradients


def test_backward_takes_any_gradient_layout(triton_backend, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The backward kernels read the incoming gradient through its strides: an expanded gradient
    (``y.sum().backward()``), a transposed one and a column slice give the CPU path's gradients."""
    x = torch.randn(4, 33, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    gt = torch.randn(33, 4, generator=torch.Generator().manual_seed(10), dtype=torch.float64)
    wide = torch.randn(4, 66, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    for op in OPS:
        for reg in REGS:
            for grad in (None, gt.T, wide[:, ::2]):
                grads = []
                for backend in ("triton", "auto"):
                    monkeypatch.setattr(iso, "_BACKEND", backend)
                    xg = x.clone().requires_grad_()
                    y = op(xg, regularization=reg, regularization_strength=0.4, descending=True)
                    y.sum().backward() if grad is None else y.backward(grad)
                    grads.append(xg.grad)
                torch.testing.assert_close(grads[0], grads[1], rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------------------------------
# the CUDA autograd Functions on long rows, numba's projection standing in for the Triton one
# --------------------------------------------------------------------------------------------------
def _numba_projection_forward(s: torch.Tensor, w: torch.Tensor, kl: bool, *, chunk: int | None = None) -> Any:
    mu = torch.empty_like(s)
    ids = torch.empty(s.shape, dtype=torch.int64)
    (nb.pav_kl if kl else nb.pav_l2)(
        s.contiguous().numpy(), w.to(s.dtype).contiguous().numpy(), mu.numpy(), ids.numpy()
    )
    return mu, (ids, ids, ids, ids)


def _numba_projection_backward(grad, s, w, state, kl, need_s, need_w):  # type: ignore[no-untyped-def]
    w = w.to(s.dtype).contiguous()
    gs, gw = torch.empty_like(s), torch.zeros_like(w)
    g = grad.to(s.dtype).contiguous()
    nb.pav_backward(
        g.numpy(), s.contiguous().numpy(), w.numpy(), state[0].numpy(), kl, need_s, need_w, gs.numpy(), gw.numpy()
    )
    return (gs if need_s else None), (gw if need_w else None)


@pytest.mark.parametrize("reg", REGS)
@pytest.mark.parametrize("descending", [False, True], ids=["asc", "desc"])
def test_cuda_functions_equal_cpu_kernels_on_long_rows(triton_backend, monkeypatch, reg, descending) -> None:  # type: ignore[no-untyped-def]
    """The CUDA path (one sort, the prologue kernel: ``x / eps`` divided in the input dtype, float64
    weights; the projection in float64; the epilogue's scatter; the backward's gather and scatter)
    with numba's projection in place of the Triton one (the interpreted PAV is too slow for rows of
    20,000) equals the CPU kernels on float32 rows of 20,000: rounding ``log rho`` to float32, or
    dividing in float64, made PAV pool a few near-ties differently, gradients off by up to 1e5."""
    monkeypatch.setattr(triton_backend, "projection_forward", _numba_projection_forward)
    monkeypatch.setattr(triton_backend, "projection_backward", _numba_projection_backward)
    x = torch.randn(3, 20000, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    x[1] = (x[1] * 3).round()
    x[2, 5] = float("nan")
    for dtype in (torch.float32, torch.float64):
        for op in OPS:
            fn = functools.partial(op, regularization=reg, regularization_strength=0.2, descending=descending)
            got = _value_and_grad(fn, x.to(dtype))
            monkeypatch.setattr(iso, "_BACKEND", "auto")
            want = _value_and_grad(fn, x.to(dtype))
            monkeypatch.setattr(iso, "_BACKEND", "triton")
            torch.testing.assert_close(got[0], want[0], equal_nan=True, **_tol(dtype, 1e-10))
            assert got[0][2].isnan().all()
            torch.testing.assert_close(
                got[1][:2],
                want[1][:2],
                rtol=1e-4 if dtype == torch.float32 else 1e-9,
                atol=1e-4 if dtype == torch.float32 else 1e-9,
            )
            assert (got[1][2].nan_to_num(0.0) == 0).all()


def test_long_rows_take_the_chunked_path(interpreted, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Few long CUDA rows are cut into pieces that fill the device; many rows or short rows are not."""
    cuda = torch.device("cuda")
    assert interpreted._chunk_length(1, 1000, cuda) == max(interpreted._MIN_CHUNK, -(-1000 // 512))
    assert interpreted._chunk_length(1, 10**6, cuda) == -(-(10**6) // 512)
    assert interpreted._chunk_length(4, 10**5, cuda) == -(-(10**5) // 128)
    assert interpreted._chunk_length(512, 10**5, cuda) == 10**5
    assert interpreted._chunk_length(1, 100, cuda) == 100
    assert interpreted._chunk_length(1, 10**6, torch.device("cpu")) == 10**6


def _value_and_grad(fn, x: torch.Tensor, g_seed: int = 1):  # type: ignore[no-untyped-def]
    x = x.detach().clone().requires_grad_()
    y = fn(x)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(g_seed), dtype=torch.float64).to(y.dtype)
    y.backward(g)
    assert x.grad is not None
    return y.detach(), x.grad


def _inputs(dtype: torch.dtype) -> torch.Tensor:
    """Rows with distinct values, ties, all ties, a NaN, +inf and -inf."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(7, 12, generator=gen, dtype=torch.float64)
    x[1] = (x[1] * 2).round()
    x[2] = 0.7
    x[3, 5] = float("nan")
    x[4, 0] = float("inf")
    x[5, 7] = float("-inf")
    return x.to(dtype)


@pytest.mark.parametrize("reg", REGS)
@pytest.mark.parametrize("descending", [False, True], ids=["asc", "desc"])
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=lambda d: str(d).split(".")[-1]
)
def test_operators_match_cpu_kernels(triton_backend, monkeypatch, reg, descending, dtype) -> None:  # type: ignore[no-untyped-def]
    """Soft rank and soft sort through the Triton projection equal the numba path: values, gradients,
    output dtype (half inputs computed in float32), NaN for rows holding a NaN or an inf."""
    x = _inputs(dtype)
    for op in OPS:
        fn = functools.partial(op, regularization=reg, regularization_strength=0.3, descending=descending)
        got = _value_and_grad(fn, x)
        monkeypatch.setattr(iso, "_BACKEND", "auto")
        want = _value_and_grad(fn, x)
        monkeypatch.setattr(iso, "_BACKEND", "triton")
        out_dtype = iso.rank_dtype(dtype) if op is OPS[0] else dtype
        assert got[0].dtype == want[0].dtype == out_dtype
        bad = torch.zeros(7, dtype=torch.bool)
        bad[3:6] = True
        assert got[0][bad].isnan().all() and not got[0][~bad].isnan().any()
        torch.testing.assert_close(got[0], want[0], equal_nan=True, **_tol(dtype))
        torch.testing.assert_close(got[1][~bad], want[1][~bad], **_tol(dtype))
        # rows with a NaN/inf: zero gradients, NaN where the PAV statistics meet the NaN (kl; where
        # exactly differs between the numba and the PyTorch paths too)
        assert (got[1][bad].nan_to_num(0.0) == 0).all()


def _tol(dtype: torch.dtype, f64: float = 1e-10) -> dict[str, float]:
    return {"rtol": 1e-5, "atol": 1e-5} if dtype != torch.float64 else {"rtol": f64, "atol": f64}


@pytest.mark.parametrize("reg", REGS)
def test_small_strength_and_leading_dims(triton_backend, monkeypatch, reg) -> None:  # type: ignore[no-untyped-def]
    """Strength 1e-3 (hard ranks: one block per element), 1e3 (one block), n = 1, any leading dims
    and another ``dim``."""
    gen = torch.Generator().manual_seed(5)
    cases = [
        (torch.randn(2, 3, 10, generator=gen, dtype=torch.float64), {"regularization_strength": 1e-3}),
        (torch.randn(4, 10, generator=gen, dtype=torch.float64), {"regularization_strength": 1e3}),
        (torch.randn(3, 1, generator=gen, dtype=torch.float64), {}),
        (torch.randn(6, 2, generator=gen, dtype=torch.float64), {"dim": 0, "descending": True}),
    ]
    for x, kw in cases:
        for op in OPS:
            fn = functools.partial(op, regularization=reg, **kw)
            got = _value_and_grad(fn, x)
            monkeypatch.setattr(iso, "_BACKEND", "auto")
            want = _value_and_grad(fn, x)
            monkeypatch.setattr(iso, "_BACKEND", "triton")
            torch.testing.assert_close(got[0], want[0], rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(got[1], want[1], rtol=1e-10, atol=1e-10)
    hard = rankwise.soft_rank_isotonic(cases[0][0], regularization=reg, regularization_strength=1e-3)
    torch.testing.assert_close(hard, rankwise.rank(cases[0][0]).to(hard.dtype))


def test_double_backward(triton_backend) -> None:  # type: ignore[no-untyped-def]
    """Second derivatives through the Triton forward (the differentiable segment ops)."""
    x = torch.randn(1, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2), requires_grad=True)
    for op, reg in zip(OPS, REGS):
        fn = functools.partial(op, regularization=reg, regularization_strength=0.7)
        assert torch.autograd.gradgradcheck(fn, (x,), eps=1e-6, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("reg", REGS)
def test_compiled_operators_call_the_kernels_as_custom_operators(triton_backend, reg) -> None:  # type: ignore[no-untyped-def]
    """Under ``torch.compile(fullgraph=True)`` (inductor) the Triton projection is one opaque custom
    operator each way (the compiler does not see the kernels or their scratch buffers); soft rank and
    soft sort equal eager, values and gradients, on a row long enough to be cut into pieces."""
    import torch._dynamo

    torch._dynamo.reset()
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    for op in OPS:
        fn = functools.partial(op, regularization=reg, regularization_strength=0.5)
        want = _value_and_grad(fn, x)
        got = _value_and_grad(torch.compile(fn, fullgraph=True), x)
        torch.testing.assert_close(got[0], want[0], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(got[1], want[1], rtol=1e-10, atol=1e-10)
    assert hasattr(torch.ops.rankwise, "triton_projection_forward")
    assert hasattr(torch.ops.rankwise, "triton_projection_backward")
