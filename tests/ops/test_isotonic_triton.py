"""The Triton PAV kernels of the isotonic operators (``rankwise._kernels.triton_isotonic``).

Without a GPU they run on CPU tensors under the Triton interpreter, against the numba kernels:
``tests/ops/triton_interpreter_cases.py``, in a subprocess (``TRITON_INTERPRET=1`` must be set before
triton is imported). The ``cuda``-marked tests run the compiled kernels on a GPU.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

import rankwise
from rankwise.ops import isotonic as iso

REGS = ["l2", "kl"]
OPS = [rankwise.soft_rank_isotonic, rankwise.soft_sort_isotonic]
_ROOT = Path(__file__).resolve().parents[2]


def test_interpreter_cases() -> None:
    """The interpreter cases (values, block ids and gradients of the projection against numba's;
    soft rank / sort against the numba path: ties, NaN/inf rows, both directions, float16/bfloat16,
    leading dims, double backward) pass in a process with ``TRITON_INTERPRET=1``."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "RANKWISE_NUMBA": "sync"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT / "src"), str(_ROOT), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore::RuntimeWarning"]
    cmd.append("tests/ops/triton_interpreter_cases.py")
    res = subprocess.run(cmd, cwd=_ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]
    assert " passed" in res.stdout and "skipped" not in res.stdout.splitlines()[-1], res.stdout[-2000:]


def _value_and_grad(fn, x: torch.Tensor, g_seed: int = 1):  # type: ignore[no-untyped-def]
    x = x.detach().clone().requires_grad_()
    y = fn(x)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(g_seed), dtype=torch.float64).to(y.dtype)
    y.backward(g.to(y.device))
    assert x.grad is not None
    return y.detach(), x.grad


def _tol(dtype: torch.dtype) -> dict[str, float]:
    return {"rtol": 1e-5, "atol": 1e-5} if dtype != torch.float64 else {"rtol": 1e-10, "atol": 1e-10}


_FWD_SIG = {
    "s_ptr": "*fp32",
    "w_ptr": "*fp32",
    "w_row_stride": "i32",
    "mu_ptr": "*fp32",
    "ids_ptr": "*i32",
    "starts_ptr": "*i32",
    "acc_a_ptr": "*fp64",
    "acc_b_ptr": "*fp64",
    "max_s_ptr": "*fp64",
    "max_w_ptr": "*fp64",
    "n": "i32",
    "TOL": "constexpr",
    "KL": "constexpr",
    "BLOCK": "constexpr",
}
_BWD_SIG = {
    "g_ptr": "*fp32",
    "s_ptr": "*fp32",
    "w_ptr": "*fp32",
    "w_row_stride": "i32",
    "ids_ptr": "*i32",
    "starts_ptr": "*i32",
    "acc_a_ptr": "*fp64",
    "acc_b_ptr": "*fp64",
    "prefix_ptr": "*fp64",
    "gs_ptr": "*fp32",
    "gw_ptr": "*fp32",
    "n": "i32",
    "KL": "constexpr",
    "NEED_S": "constexpr",
    "NEED_W": "constexpr",
    "BLOCK": "constexpr",
}


@pytest.mark.parametrize("kl", [False, True], ids=["l2", "kl"])
def test_kernels_compile_for_hopper(kl: bool) -> None:
    """The kernels compile ahead of time for sm_90 (no GPU needed: Triton's bundled ptxas): the
    compiler front end is stricter than the interpreter (types of loop-carried values); float64
    exp/log go through libdevice, and no value spills to local memory."""
    triton = pytest.importorskip("triton")
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as exc:
        pytest.skip(f"this Triton has no ahead-of-time compile API: {exc}")
    from rankwise._kernels import triton_isotonic as tk

    target = GPUTarget("cuda", 90, 32)
    fwd = triton.compile(
        ASTSource(tk._pav_forward_kernel, _FWD_SIG, {"TOL": tk._TOL, "KL": kl, "BLOCK": 256}),
        target=target,
        options={"num_warps": 1},
    )
    bwd = triton.compile(
        ASTSource(tk._pav_backward_kernel, _BWD_SIG, {"KL": kl, "NEED_S": True, "NEED_W": True, "BLOCK": 256}),
        target=target,
        options={"num_warps": 1},
    )
    tables = {"starts_ptr": "*i32", "acc_a_ptr": "*fp64", "acc_b_ptr": "*fp64", "max_s_ptr": "*fp64"}
    tables["max_w_ptr"] = "*fp64"
    chunk_sig = {"s_ptr": "*fp64", "w_ptr": "*fp64", "w_row_stride": "i32", **tables, "counts_ptr": "*i32"}
    chunk_sig.update({"n": "i32", "chunk": "i32", "TOL": "constexpr", "KL": "constexpr"})
    merge_sig = {**tables, "counts_ptr": "*i32", "nbs_ptr": "*i32", "n": "i32", "chunk": "i32", "chunks": "i32"}
    merge_sig.update({"TOL": "constexpr", "KL": "constexpr"})
    ids_sig = {"s_ptr": "*fp64", "mu_ptr": "*fp64", "ids_ptr": "*i32", "starts_ptr": "*i32", "acc_a_ptr": "*fp64"}
    ids_sig.update({"acc_b_ptr": "*fp64", "nbs_ptr": "*i32", "n": "i32", "steps": "i32"})
    ids_sig.update({"KL": "constexpr", "BLOCK": "constexpr"})
    chunked = [
        triton.compile(ASTSource(tk._pav_chunk_kernel, chunk_sig, {"TOL": tk._TOL, "KL": kl}), target=target),
        triton.compile(ASTSource(tk._pav_merge_kernel, merge_sig, {"TOL": tk._TOL, "KL": kl}), target=target),
        triton.compile(ASTSource(tk._ids_mu_kernel, ids_sig, {"KL": kl, "BLOCK": 1024}), target=target),
    ]
    for kernel in (fwd, bwd, *chunked):
        ptx = kernel.asm["ptx"]
        assert "ld.local" not in ptx and "st.local" not in ptx
    assert "bar.sync" in fwd.asm["ptx"]  # the stack slots are read after a barrier
    if kl:
        assert "__nv_exp" in fwd.asm["ptx"] and "__nv_log" in fwd.asm["ptx"]
    else:
        assert "div.rn.f64" in fwd.asm["ptx"]


@pytest.mark.parametrize("kl", [False, True], ids=["l2", "kl"])
@pytest.mark.parametrize("dtype", ["fp32", "fp64"])
def test_operator_kernels_compile_for_hopper(kl: bool, dtype: str) -> None:
    """The kernels around the projection (prologues, epilogue, the backward's gather and scatter)
    compile ahead of time for sm_90, for float32 and float64 inputs, both directions."""
    triton = pytest.importorskip("triton")
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as exc:
        pytest.skip(f"this Triton has no ahead-of-time compile API: {exc}")
    from rankwise._kernels import triton_isotonic as tk

    target = GPUTarget("cuda", 90, 32)
    f64, i64, i32, i8 = "*fp64", "i64", "i32", "*i8"
    rank_pro = {"v_ptr": f"*{dtype}", "s_ptr": f64, "w_ptr": f64, "flags_ptr": i8, "n": i32}
    rank_pro.update({"eps_bits": i64, "limit_bits": i64, "far_bits": i64, "gap_bits": i64})
    sort_pro = {"v_ptr": f"*{dtype}", "s_ptr": f64, "w_ptr": f64, "flags_ptr": i8, "n": i32}
    sort_pro.update({"eps_bits": i64, "extra_bits": i64})
    epi = {"mu_ptr": f64, "w_ptr": f64, "perm_ptr": "*i64", "flags_ptr": i8, "out_ptr": f"*{dtype}", "n": i32}
    gather = {"grad_ptr": f"*{dtype}", "grad_row_stride": i32, "grad_col_stride": i32, "perm_ptr": "*i64"}
    gather.update({"mu_ptr": f64, "g_ptr": f64, "n": i32})
    scatter = {"gp_ptr": f64, "grad_ptr": f"*{dtype}", "grad_row_stride": i32, "grad_col_stride": i32}
    scatter.update({"perm_ptr": "*i64", "flags_ptr": i8, "gx_ptr": f"*{dtype}", "n": i32, "scale_bits": i64})
    compiled = []
    for sign in (1.0, -1.0):
        for kernel, sig, consts in [
            (tk._rank_prologue_kernel, rank_pro, {"KL": kl, "SIGN": sign, "BLOCK": 1024}),
            (tk._sort_prologue_kernel, sort_pro, {"KL": kl, "SIGN": sign, "BLOCK": 1024}),
            (tk._epilogue_kernel, epi, {"RANK": True, "KL": kl, "SIGN": sign, "BLOCK": 1024}),
            (tk._epilogue_kernel, epi, {"RANK": False, "KL": kl, "SIGN": sign, "BLOCK": 1024}),
        ]:
            sig = {**sig, **{k: "constexpr" for k in consts}}
            compiled.append(triton.compile(ASTSource(kernel, sig, consts), target=target, options={"num_warps": 4}))
    for rank in (True, False):
        sig = {**scatter, "RANK": "constexpr", "BLOCK": "constexpr"}
        src = ASTSource(tk._scatter_grad_kernel, sig, {"RANK": rank, "BLOCK": 256})
        compiled.append(triton.compile(src, target=target, options={"num_warps": 1}))
    sig = {**gather, "KL": "constexpr", "BLOCK": "constexpr"}
    compiled.append(triton.compile(ASTSource(tk._gather_grad_kernel, sig, {"KL": kl, "BLOCK": 256}), target=target))
    for kernel in compiled:
        ptx = kernel.asm["ptx"]
        assert "ld.local" not in ptx and "st.local" not in ptx
    prologue = compiled[0].asm["ptx"]
    assert "bar.sync" in prologue  # the scans of the conditioned rows
    if dtype == "fp32":
        assert "div.rn.f32" in prologue  # x / eps rounded as the CPU kernels divide


def test_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto``: CUDA rows of at least ``_TRITON_MIN_N`` go to Triton, CPU and meta never; ``torch``
    never."""
    sentinel = object()
    monkeypatch.setattr(iso, "_triton_kernels", lambda: sentinel)
    cuda_like = types.SimpleNamespace(device=torch.device("cuda"), shape=(4, 100))
    short = types.SimpleNamespace(device=torch.device("cuda"), shape=(4, 3))
    monkeypatch.setattr(iso, "_TRITON_MIN_N", 16)
    assert iso._triton_for(cuda_like) is sentinel
    assert iso._triton_for(short) is None
    assert iso._triton_for(torch.zeros(4, 100)) is None
    assert iso._triton_for(torch.zeros(4, 100, device="meta")) is None
    monkeypatch.setattr(iso, "_BACKEND", "torch")
    assert iso._triton_for(cuda_like) is None


def test_cpu_path_does_not_import_triton() -> None:
    """Triton is imported only when a CUDA tensor reaches the projection."""
    code = (
        "import sys, torch, rankwise\n"
        "x = torch.randn(3, 5, requires_grad=True)\n"
        "rankwise.soft_rank_isotonic(x).sum().backward()\n"
        "rankwise.soft_sort_isotonic(x, regularization='kl').sum().backward()\n"
        "assert 'rankwise._kernels.triton_isotonic' not in sys.modules\n"
        "assert 'triton' not in sys.modules, 'triton imported'\n"
    )
    env = {**os.environ, "RANKWISE_NUMBA": "sync"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=300)


# --------------------------------------------------------------------------------------------------
# on a GPU (compiled kernels)
# --------------------------------------------------------------------------------------------------
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("reg", REGS)
@pytest.mark.parametrize("descending", [False, True], ids=["asc", "desc"])
def test_cuda_matches_cpu_kernels(reg: str, descending: bool) -> None:
    """Long rows, ties and NaN/inf rows on CUDA: values and gradients equal numba's on CPU."""
    gen = torch.Generator().manual_seed(7)
    for rows, n in [(64, 1000), (3, 20000), (300, 7)]:
        x = torch.randn(rows, n, generator=gen, dtype=torch.float64)
        x[1] = (x[1] * 3).round()
        x[2, n // 2] = float("nan")
        if rows > 3:
            x[3, 0] = float("inf")
        for dtype in (torch.float32, torch.float64):
            for op in OPS:
                fn = functools.partial(op, regularization=reg, regularization_strength=0.2, descending=descending)
                want = _value_and_grad(fn, x.to(dtype))
                got = _value_and_grad(fn, x.to(dtype).cuda())
                torch.testing.assert_close(got[0].cpu(), want[0], equal_nan=True, **_tol(dtype))
                # rows with a NaN/inf: NaN values; their gradients are zero or NaN (where exactly
                # differs between the numba and the torch-ops paths), the other rows' are compared
                bad = ~torch.isfinite(x).all(-1)
                assert got[0][bad].isnan().all()
                tol: dict[str, Any] = _tol(dtype)
                if reg == "kl" and dtype == torch.float64:
                    # the kl gradient's block sums come from differences of a float64 prefix sum over the
                    # row of ``g * r`` (entries up to |g| n): a round-off of sqrt(n) ulps of max |g * y| /
                    # strength, where the CPU kernel sums each block on its own (1e-9 at n = 20,000)
                    g = torch.randn(want[0].shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
                    scale = (g * want[0]).nan_to_num(0.0, 0.0, 0.0).abs().max().item() / 0.2
                    tol = {"rtol": 1e-10, "atol": max(1e-10, n**0.5 * torch.finfo(torch.float64).eps * scale)}
                if reg == "kl" and dtype == torch.float32:
                    # soft_rank kl: the CPU kernel fuses ``exp`` and the projection's backward in
                    # float64; on CUDA autograd hands the projection ``g * exp(mu)`` already rounded
                    # to float32 (entries up to |g| n), and the block softmax backward
                    # ``g' - softmax_B * sum_B g'`` cancels them down to O(|g|), times 1/strength:
                    # an absolute error of a few float32 ulps of max |g * y| / strength (measured on
                    # an H100: 7e-4 at n = 1000, 0.1% of the entries; bound here about 4x that).
                    g = torch.randn(want[0].shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
                    scale = (g * want[0].double()).nan_to_num(0.0, 0.0, 0.0).abs().max().item() / 0.2
                    tol = {"rtol": 1e-5, "atol": max(1e-5, 2 * torch.finfo(torch.float32).eps * scale)}
                torch.testing.assert_close(got[1].cpu()[~bad], want[1][~bad], **tol)
                assert (got[1].cpu()[bad].nan_to_num(0.0) == 0).all()


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("reg", REGS)
def test_cuda_triton_equals_minmax_and_no_sync(reg: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both CUDA paths (Triton; the O(n^2) min-max one below ``_TRITON_MIN_N``) agree, and the
    Triton path runs without a host synchronization."""
    x = torch.randn(16, 300, dtype=torch.float64, device="cuda")
    g = torch.randn(16, 300, dtype=torch.float64, device="cuda")
    for op in OPS:
        fn = functools.partial(op, regularization=reg, regularization_strength=0.5)
        _value_and_grad(fn, x)  # compile outside the sync check
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            xt = x.clone().requires_grad_()
            fn(xt).backward(g)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        monkeypatch.setattr(iso, "_TRITON_MIN_N", 10**9)
        xm = x.clone().requires_grad_()
        ym = fn(xm)
        ym.backward(g)
        monkeypatch.setattr(iso, "_TRITON_MIN_N", 1)
        torch.testing.assert_close(fn(x), ym.detach(), rtol=1e-10, atol=1e-10)
        assert xt.grad is not None and xm.grad is not None
        torch.testing.assert_close(xt.grad, xm.grad, rtol=1e-10, atol=1e-10)


@pytest.mark.cuda
@cuda
def test_cuda_long_row_linear_memory() -> None:
    """A row of n = 1e6 fits in O(n) memory (the min-max path would need terabytes)."""
    torch.cuda.reset_peak_memory_stats()
    x = torch.randn(1, 1_000_000, device="cuda", requires_grad=True)
    base = torch.cuda.max_memory_allocated()
    for reg in REGS:
        y = rankwise.soft_rank_isotonic(x, regularization=reg)
        y.sum().backward()
    assert torch.isfinite(x.grad).all()  # type: ignore[arg-type]
    assert torch.cuda.max_memory_allocated() - base < 200 * x.numel()  # bytes per element
