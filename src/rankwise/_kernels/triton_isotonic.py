r"""Triton pool-adjacent-violators kernels for the isotonic soft operators on CUDA.

They solve, for every row of ``s`` (shape ``(R, n)``) and ``w`` (``(R, n)`` or ``(1, n)``, broadcast
over rows), both sorted decreasingly, the decreasing isotonic regression of
:mod:`rankwise.ops.isotonic` (Blondel et al., ICML 2020, "Fast Differentiable Sorting and Ranking"):

.. math::
    v^\star = \arg\min_{v_1 \ge \dots \ge v_n} \sum_i \ell(v_i; s_i, w_i),

``l2``: block value ``mean(s_B - w_B)``; ``kl``: ``logsumexp(s_B) - logsumexp(w_B)``, and return
``mu = s - v``, with the same pooling rule as the CPU (numba) kernels: adjacent blocks are pooled
while the left value is ``<=`` the right one plus ``TIE_ULPS`` float64 ulps of the local magnitudes
(the blocks' largest ``|s|`` and ``|w|``, plus the block log-sum-exps and 1 for ``kl``).
Accumulation is in float64.

Many rows: one program per row, a sequential PAV with its block stack in global scratch memory
(O(n) work and memory per row; the sort before it is ``torch.sort``), then vectorized passes that
write the block index of every position (a prefix sum of the block-start flags) and ``mu``. Few long
rows: each row is cut into pieces solved by their own programs in parallel, then one program per row
runs PAV over the pieces' blocks in order (PAV pools every block a piece pooled, so this gives the
row's blocks; where the rows pool much, as soft ranks at moderate strengths do, it visits few
blocks), and a parallel pass finds every position's block by binary search and writes ``mu``.
The backward pass is vectorized too: a float64 prefix sum of the incoming gradient gives every
block's gradient sum, the forward's block statistics give its mean (l2) or softmax (kl).

The module imports :mod:`triton`; :mod:`rankwise.ops.isotonic` imports it on the first CUDA tensor
that reaches the isotonic projection. Under ``TRITON_INTERPRET=1`` (set before importing triton)
the kernels also run on CPU tensors, which is how the CPU test suite checks them.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import torch
import triton
import triton.language as tl

from rankwise._kernels._custom import KernelOp

__all__ = [
    "TIE_ULPS",
    "operator_epilogue",
    "projection_backward",
    "projection_forward",
    "rank_grad_gather",
    "rank_prologue",
    "scatter_grad",
    "sort_prologue",
]

#: tie tolerance in float64 ulps of the local magnitudes (the CPU kernels' rule)
TIE_ULPS = 4.0
_TOL = TIE_ULPS * float(torch.finfo(torch.float64).eps)

#: largest chunk of the vectorized passes (one warp per row program)
_MAX_BLOCK = 1024


@triton.jit
def _logaddexp(a, b):
    """``log(exp(a) + exp(b))`` in float64 (``-inf`` operands as the CPU kernels treat them)."""
    hi = tl.maximum(a, b)
    lo = tl.minimum(a, b)
    out = hi + tl.log(1.0 + tl.exp(lo - hi))
    out = tl.where(a == float("-inf"), b, out)
    return tl.where(b == float("-inf"), a, out)


@triton.jit
def _violates(pa, pb, pms, pmw, a, b, ms, mw, TOL: tl.constexpr, KL: tl.constexpr):
    """The left block (``p*``) does not exceed the right one beyond the round-off tolerance."""
    if KL:
        slack = TOL * ((pms + pmw + tl.abs(pa) + tl.abs(pb) + 1.0) + (ms + mw + tl.abs(a) + tl.abs(b) + 1.0))
        res = pa - pb <= a - b + slack
    else:
        res = pa / pb <= a / b + TOL * (pms + pmw + ms + mw)
    return res


@triton.jit
def _empty_stack():
    """The state of an empty PAV block stack for :func:`_push`: its size (0) and the registers of its
    top block (statistics, largest ``|s|``/``|w|``, first position)."""
    nb = tl.zeros((), tl.int32)
    ta = tl.zeros((), tl.float64)
    tb = tl.full((), 1.0, tl.float64)
    tms = tl.zeros((), tl.float64)
    tmw = tl.zeros((), tl.float64)
    tstart = tl.zeros((), tl.int32)
    return nb, ta, tb, tms, tmw, tstart


@triton.jit
def _push(
    a,
    b,
    ms,
    mw,
    start,
    nb,
    ta,
    tb,
    tms,
    tmw,
    tstart,
    acc_a,
    acc_b,
    max_s,
    max_w,
    starts,
    TOL: tl.constexpr,
    KL: tl.constexpr,
):
    """Push one element or block (statistics ``a``, ``b``, largest ``|s|``/``|w|`` ``ms``/``mw``, first
    position ``start``) onto a PAV block stack of ``nb`` blocks whose top block is also held in
    registers (``t*``), pooling while the top block violates the order; returns the new stack state."""
    go = (nb > 0) & _violates(ta, tb, tms, tmw, a, b, ms, mw, TOL, KL)
    while go:  # pool the top block into the current one
        if KL:
            a = _logaddexp(a, ta)
            b = _logaddexp(b, tb)
        else:
            a += ta
            b += tb
        ms = tl.maximum(ms, tms)
        mw = tl.maximum(mw, tmw)
        start = tstart
        nb -= 1
        tl.debug_barrier()  # the stack slots were stored by other lanes
        j = tl.maximum(nb - 1, 0)
        ta = tl.load(acc_a + j)
        tb = tl.load(acc_b + j)
        tms = tl.load(max_s + j)
        tmw = tl.load(max_w + j)
        tstart = tl.load(starts + j)
        go = (nb > 0) & _violates(ta, tb, tms, tmw, a, b, ms, mw, TOL, KL)
    tl.store(acc_a + nb, a)
    tl.store(acc_b + nb, b)
    tl.store(max_s + nb, ms)
    tl.store(max_w + nb, mw)
    tl.store(starts + nb, start)
    return nb + 1, a, b, ms, mw, start


@triton.jit
def _pav_range(s_row, w_row, lo, hi, acc_a, acc_b, max_s, max_w, starts, TOL: tl.constexpr, KL: tl.constexpr):
    """Sequential PAV over the positions ``lo .. hi - 1`` of one row; the block stack is written
    from slot 0 of the given arrays (block starts are positions in the row); returns its size."""
    nb, ta, tb, tms, tmw, tstart = _empty_stack()
    for i in range(lo, hi):
        si = tl.load(s_row + i).to(tl.float64)
        wi = tl.load(w_row + i).to(tl.float64)
        if KL:
            a = si
            b = wi
        else:
            a = si - wi
            b = tl.full((), 1.0, tl.float64)
        start = tl.zeros((), tl.int32) + i
        nb, ta, tb, tms, tmw, tstart = _push(
            a,
            b,
            tl.abs(si),
            tl.abs(wi),
            start,
            nb,
            ta,
            tb,
            tms,
            tmw,
            tstart,
            acc_a,
            acc_b,
            max_s,
            max_w,
            starts,
            TOL,
            KL,
        )
    return nb


@triton.jit
def _pav_forward_kernel(
    s_ptr,
    w_ptr,
    w_row_stride,
    mu_ptr,
    ids_ptr,
    starts_ptr,
    acc_a_ptr,
    acc_b_ptr,
    max_s_ptr,
    max_w_ptr,
    n,
    TOL: tl.constexpr,
    KL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One row: PAV, then block ids and ``mu``. Block ``b`` keeps ``acc_a[b]``, ``acc_b[b]`` (l2: sum
    of ``s - w`` and count; kl: ``lse(s_B)``, ``lse(w_B)``), its largest ``|s|``, ``|w|`` and its first
    position ``starts[b]`` (``starts[nb] = n``)."""
    row = tl.program_id(0).to(tl.int64)
    s_row = s_ptr + row * n
    w_row = w_ptr + row * w_row_stride
    mu_row = mu_ptr + row * n
    ids_row = ids_ptr + row * n
    starts = starts_ptr + row * (n + 1)
    acc_a = acc_a_ptr + row * n
    acc_b = acc_b_ptr + row * n
    max_s = max_s_ptr + row * n
    max_w = max_w_ptr + row * n

    nb = _pav_range(s_row, w_row, 0, n, acc_a, acc_b, max_s, max_w, starts, TOL, KL)
    tl.store(starts + nb, n)

    # block ids: 1 at every block start but the first, then a running sum
    offs = tl.arange(0, BLOCK)
    for c0 in range(0, n, BLOCK):
        tl.store(ids_row + c0 + offs, tl.zeros((BLOCK,), tl.int32), mask=c0 + offs < n)
    tl.debug_barrier()
    for b0 in range(0, nb, BLOCK):
        bi = b0 + offs
        mark = (bi > 0) & (bi < nb)
        first = tl.load(starts + bi, mask=mark, other=0)
        tl.store(ids_row + first, tl.full((BLOCK,), 1, tl.int32), mask=mark)
    tl.debug_barrier()
    carry = tl.zeros((), tl.int32)
    for c0 in range(0, n, BLOCK):
        m = c0 + offs < n
        flag = tl.load(ids_row + c0 + offs, mask=m, other=0)
        bid = tl.cumsum(flag, 0) + carry
        carry += tl.sum(flag, 0)
        tl.store(ids_row + c0 + offs, bid, mask=m)
        va = tl.load(acc_a + bid, mask=m, other=0.0)
        vb = tl.load(acc_b + bid, mask=m, other=1.0)
        if KL:
            val = va - vb
        else:
            val = va / vb
        sv = tl.load(s_row + c0 + offs, mask=m, other=0.0).to(tl.float64)
        tl.store(mu_row + c0 + offs, (sv - val).to(mu_ptr.dtype.element_ty), mask=m)


@triton.jit
def _pav_chunk_kernel(
    s_ptr,
    w_ptr,
    w_row_stride,
    starts_ptr,
    acc_a_ptr,
    acc_b_ptr,
    max_s_ptr,
    max_w_ptr,
    counts_ptr,
    n,
    chunk,
    TOL: tl.constexpr,
    KL: tl.constexpr,
):
    """Program ``(row, c)``: PAV over the positions ``c * chunk ..`` of the row; its block stack goes to
    the slots from ``c * chunk`` on, its size to ``counts[row, c]``."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    lo = c * chunk
    hi = tl.minimum(lo + chunk, n)
    base = row * n + lo
    nb = _pav_range(
        s_ptr + row * n,
        w_ptr + row * w_row_stride,
        lo,
        hi,
        acc_a_ptr + base,
        acc_b_ptr + base,
        max_s_ptr + base,
        max_w_ptr + base,
        starts_ptr + row * (n + 1) + lo,
        TOL,
        KL,
    )
    tl.store(counts_ptr + row * tl.num_programs(1) + c, nb)


@triton.jit
def _pav_merge_kernel(
    starts_ptr,
    acc_a_ptr,
    acc_b_ptr,
    max_s_ptr,
    max_w_ptr,
    counts_ptr,
    nbs_ptr,
    n,
    chunk,
    chunks,
    TOL: tl.constexpr,
    KL: tl.constexpr,
):
    """One row: PAV over the blocks of its chunks, in order (the isotonic solution pools every block a
    chunk pooled, so PAV over the chunks' blocks gives the row's blocks); the row's stack is compacted
    into the slots from 0 on (it never passes the block being read), its size goes to ``nbs[row]``."""
    row = tl.program_id(0).to(tl.int64)
    starts = starts_ptr + row * (n + 1)
    acc_a = acc_a_ptr + row * n
    acc_b = acc_b_ptr + row * n
    max_s = max_s_ptr + row * n
    max_w = max_w_ptr + row * n
    nb, ta, tb, tms, tmw, tstart = _empty_stack()
    for c in range(0, chunks):
        count = tl.load(counts_ptr + row * chunks + c)
        for k in range(0, count):
            j = c * chunk + k
            a = tl.load(acc_a + j)
            b = tl.load(acc_b + j)
            ms = tl.load(max_s + j)
            mw = tl.load(max_w + j)
            start = tl.load(starts + j)
            tl.debug_barrier()  # every lane has read slot j before the push may overwrite it
            nb, ta, tb, tms, tmw, tstart = _push(
                a, b, ms, mw, start, nb, ta, tb, tms, tmw, tstart, acc_a, acc_b, max_s, max_w, starts, TOL, KL
            )
    tl.store(starts + nb, n)
    tl.store(nbs_ptr + row, nb)


@triton.jit
def _ids_mu_kernel(
    s_ptr,
    mu_ptr,
    ids_ptr,
    starts_ptr,
    acc_a_ptr,
    acc_b_ptr,
    nbs_ptr,
    n,
    steps,
    KL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Program ``(row, c)``: block ids (a binary search of each position among the block starts, in
    ``steps`` halvings) and ``mu`` of the positions ``c * BLOCK ..`` of the row."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    starts = starts_ptr + row * (n + 1)
    lo = tl.zeros((BLOCK,), tl.int32)
    hi = lo + tl.load(nbs_ptr + row) - 1
    for _ in range(0, steps):  # the largest block b with starts[b] <= position
        mid = (lo + hi + 1) // 2
        ok = tl.load(starts + mid, mask=m, other=0) <= offs
        active = lo < hi
        lo = tl.where(active & ok, mid, lo)
        hi = tl.where(active & ~ok, mid - 1, hi)
    tl.store(ids_ptr + row * n + offs, lo, mask=m)
    va = tl.load(acc_a_ptr + row * n + lo, mask=m, other=0.0)
    vb = tl.load(acc_b_ptr + row * n + lo, mask=m, other=1.0)
    if KL:
        val = va - vb
    else:
        val = va / vb
    sv = tl.load(s_ptr + row * n + offs, mask=m, other=0.0).to(tl.float64)
    tl.store(mu_ptr + row * n + offs, (sv - val).to(mu_ptr.dtype.element_ty), mask=m)


@triton.jit
def _pav_backward_kernel(
    g_ptr,
    s_ptr,
    w_ptr,
    w_row_stride,
    ids_ptr,
    starts_ptr,
    acc_a_ptr,
    acc_b_ptr,
    prefix_ptr,
    gs_ptr,
    gw_ptr,
    n,
    KL: tl.constexpr,
    NEED_S: tl.constexpr,
    NEED_W: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One row of the vector-Jacobian product of ``mu = s - v(s, w)``: with ``G_B`` the block sum of
    the gradient ``g``, l2 ``grad_s = g - G_B / |B|``, ``grad_w = G_B / |B|``; kl
    ``grad_s = g - softmax_B(s) G_B``, ``grad_w = softmax_B(w) G_B``."""
    row = tl.program_id(0).to(tl.int64)
    g_row = g_ptr + row * n
    s_row = s_ptr + row * n
    w_row = w_ptr + row * w_row_stride
    ids_row = ids_ptr + row * n
    starts = starts_ptr + row * (n + 1)
    acc_a = acc_a_ptr + row * n
    acc_b = acc_b_ptr + row * n
    prefix = prefix_ptr + row * (n + 1)
    offs = tl.arange(0, BLOCK)

    # prefix[i] = g_0 + ... + g_{i-1} (float64)
    tl.store(prefix, tl.zeros((), tl.float64))
    carry = tl.zeros((), tl.float64)
    for c0 in range(0, n, BLOCK):
        m = c0 + offs < n
        g = tl.load(g_row + c0 + offs, mask=m, other=0.0).to(tl.float64)
        run = tl.cumsum(g, 0) + carry
        carry = tl.sum(tl.where(offs == BLOCK - 1, run, 0.0), 0)
        tl.store(prefix + 1 + c0 + offs, run, mask=m)
    tl.debug_barrier()
    for c0 in range(0, n, BLOCK):
        m = c0 + offs < n
        bid = tl.load(ids_row + c0 + offs, mask=m, other=0)
        lo = tl.load(starts + bid, mask=m, other=0)
        hi = tl.load(starts + bid + 1, mask=m, other=1)
        gsum = tl.load(prefix + hi, mask=m, other=0.0) - tl.load(prefix + lo, mask=m, other=0.0)
        if KL:
            if NEED_S:
                g = tl.load(g_row + c0 + offs, mask=m, other=0.0).to(tl.float64)
                sv = tl.load(s_row + c0 + offs, mask=m, other=0.0).to(tl.float64)
                p = tl.exp(sv - tl.load(acc_a + bid, mask=m, other=0.0))
                tl.store(gs_ptr + row * n + c0 + offs, (g - p * gsum).to(gs_ptr.dtype.element_ty), mask=m)
            if NEED_W:
                wv = tl.load(w_row + c0 + offs, mask=m, other=0.0).to(tl.float64)
                q = tl.exp(wv - tl.load(acc_b + bid, mask=m, other=0.0))
                tl.store(gw_ptr + row * n + c0 + offs, (q * gsum).to(gw_ptr.dtype.element_ty), mask=m)
        else:
            mean = gsum / (hi - lo).to(tl.float64)
            if NEED_S:
                g = tl.load(g_row + c0 + offs, mask=m, other=0.0).to(tl.float64)
                tl.store(gs_ptr + row * n + c0 + offs, (g - mean).to(gs_ptr.dtype.element_ty), mask=m)
            if NEED_W:
                tl.store(gw_ptr + row * n + c0 + offs, mean.to(gw_ptr.dtype.element_ty), mask=m)


# --------------------------------------------------------------------------------------------------
# The soft operators around the projection: one kernel each for what precedes and follows it
# --------------------------------------------------------------------------------------------------
@triton.jit
def _as_f64(bits):
    """A float64 passed as the int64 of its bits (Triton types a Python float argument as float32)."""
    return bits.to(tl.int64).to(tl.float64, bitcast=True)


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _row_ends(v_row, n, SIGN: tl.constexpr):
    """The first and last entries of a sorted row (times ``SIGN``) in float64, and whether the row
    holds a NaN or an inf: a sort puts them at its ends (NaN as the largest value)."""
    first = tl.load(v_row).to(tl.float64) * SIGN
    last = tl.load(v_row + n - 1).to(tl.float64) * SIGN
    bad = ~((tl.abs(first) < float("inf")) & (tl.abs(last) < float("inf")))
    return first, last, bad


@triton.jit
def _conditioned_row(v_row, s_row, n, eps, limit, gap, SIGN: tl.constexpr, BLOCK: tl.constexpr):
    """``s = y / eps`` of one decreasing row ``y = SIGN * v`` laid out run by run (runs: gaps of at
    most ``gap = limit * eps``): ``(y_i - y_first) / eps`` plus the run's offset, each run starting
    ``limit`` below the last value of the one before (``rankwise.ops.isotonic._condition_rank_inputs``).
    Sequential over the row's chunks (run starts, offsets carried)."""
    offs = tl.arange(0, BLOCK)
    carry_first = tl.zeros((), tl.int32)  # start of the run the chunk begins in
    carry_prev = tl.zeros((), tl.int32)  # start of the run before the current position's
    carry_off = tl.zeros((), tl.float64)  # offset of the run the chunk begins in
    for c0 in range(0, n, BLOCK):
        idx = c0 + offs
        m = idx < n
        y = tl.load(v_row + idx, mask=m, other=0.0).to(tl.float64) * SIGN
        yp = tl.load(v_row + idx - 1, mask=m & (idx >= 1), other=0.0).to(tl.float64) * SIGN
        ypp = tl.load(v_row + idx - 2, mask=m & (idx >= 2), other=0.0).to(tl.float64) * SIGN
        cut = m & (idx >= 1) & ((yp - y) > gap)  # position idx starts a run after a wide gap
        start = (idx == 0) | cut
        start_prev = (idx == 1) | ((idx >= 2) & ((ypp - yp) > gap))  # position idx - 1 starts a run
        first = tl.associative_scan(tl.where(m & start, idx, -1), 0, _max_combine)
        first = tl.maximum(first, carry_first)
        prev = tl.associative_scan(tl.where(m & start_prev, idx - 1, -1), 0, _max_combine)
        prev = tl.maximum(prev, carry_prev)
        y_first = tl.load(v_row + first, mask=m, other=0.0).to(tl.float64) * SIGN
        y_prev_first = tl.load(v_row + prev, mask=cut, other=0.0).to(tl.float64) * SIGN
        step = tl.where(cut, (yp - y_prev_first) / eps - limit, 0.0)
        offset = tl.cumsum(step, 0) + carry_off
        tl.store(s_row + idx, (y - y_first) / eps + offset, mask=m)
        carry_first = tl.max(tl.where(m, first, 0), 0)
        carry_prev = tl.max(tl.where(m, prev, 0), 0)
        carry_off = tl.sum(tl.where(offs == BLOCK - 1, offset, 0.0), 0)


@triton.jit(do_not_specialize=["eps_bits", "limit_bits", "far_bits", "gap_bits"])
def _rank_prologue_kernel(
    v_ptr,
    s_ptr,
    w_ptr,
    flags_ptr,
    n,
    eps_bits,
    limit_bits,
    far_bits,
    gap_bits,
    KL: tl.constexpr,
    SIGN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Program ``(row, c)``, soft ranks: ``s = y / eps`` (``y = SIGN * v``, ``v`` the sorted row; the
    division in the dtype of ``v``, as the CPU kernels divide) of the positions ``c * BLOCK ..``,
    float64; the row's flags (bit 0: a NaN or an inf, bit 1: conditioned) and, for row 0, the
    weights ``rho`` (``log rho`` for kl). A row whose largest ``|y| / eps`` exceeds ``far`` is
    conditioned as a whole (:func:`_conditioned_row`) by its program ``c = 0``."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    eps = _as_f64(eps_bits)
    v_row = v_ptr + row * n
    s_row = s_ptr + row * n
    first, last, bad = _row_ends(v_row, n, SIGN)
    far = (tl.maximum(tl.abs(first), tl.abs(last)) / eps > _as_f64(far_bits)) & ~bad
    if c == 0:
        tl.store(flags_ptr + row, (bad.to(tl.int8) + 2 * far.to(tl.int8)).to(tl.int8))
    offs = c * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    if row == 0:
        rho = tl.where(m, n - offs, 1).to(tl.float64)
        if KL:
            rho = tl.log(rho)
        tl.store(w_ptr + offs, rho, mask=m)
    if far:
        if c == 0:
            _conditioned_row(v_row, s_row, n, eps, _as_f64(limit_bits), _as_f64(gap_bits), SIGN, BLOCK)
    else:
        v = tl.load(v_row + offs, mask=m, other=0.0)
        if v_ptr.dtype.element_ty == tl.float32:
            s = tl.math.div_rn(v * SIGN, eps.to(tl.float32)).to(tl.float64)
        else:
            s = (v.to(tl.float64) * SIGN) / eps
        tl.store(s_row + offs, s, mask=m)


@triton.jit(do_not_specialize=["eps_bits", "extra_bits"])
def _sort_prologue_kernel(
    v_ptr,
    s_ptr,
    w_ptr,
    flags_ptr,
    n,
    eps_bits,
    extra_bits,
    KL: tl.constexpr,
    SIGN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Program ``(row, c)``, soft sort: the weights ``w = SIGN * v`` (float64, ``v`` the sorted row),
    the row's gap limit (l2: twice the spread of ``w``; kl: twice the spread plus ``extra = 2 log n``,
    plus 1), the targets ``s = rho / eps``, or ``rho * limit`` where ``1 / eps`` exceeds the limit
    (then every block is one entry), and the row's flags (bit 0: a NaN or an inf, bit 1: hard)."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    eps = _as_f64(eps_bits)
    v_row = v_ptr + row * n
    first, last, bad = _row_ends(v_row, n, SIGN)
    spread = tl.abs(first - last)
    if KL:
        limit = 2.0 * ((spread + _as_f64(extra_bits)) + 1.0)
    else:
        limit = 2.0 * spread
    hard = ((1.0 / eps) > limit) & ~bad
    if c == 0:
        tl.store(flags_ptr + row, (bad.to(tl.int8) + 2 * hard.to(tl.int8)).to(tl.int8))
    offs = c * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    w = tl.load(v_row + offs, mask=m, other=0.0).to(tl.float64) * SIGN
    tl.store(w_ptr + row * n + offs, w, mask=m)
    rho = (n - offs).to(tl.float64)
    s = tl.where(hard, rho * limit, rho / eps)
    tl.store(s_ptr + row * n + offs, s, mask=m)


@triton.jit
def _epilogue_kernel(
    mu_ptr,
    w_ptr,
    perm_ptr,
    flags_ptr,
    out_ptr,
    n,
    RANK: tl.constexpr,
    KL: tl.constexpr,
    SIGN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Program ``(row, c)``: the operator's output from the projection ``mu`` (sorted order). Soft
    ranks: ``mu`` (``exp(mu)`` for kl) scattered back to the input order by ``perm``; soft sort: ``mu``
    (``w`` where the row is hard) times ``SIGN``. NaN for a row holding a NaN or an inf."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    flags = tl.load(flags_ptr + row)
    bad = (flags & 1) != 0
    mu = tl.load(mu_ptr + row * n + offs, mask=m, other=0.0).to(tl.float64)
    if RANK:
        val = mu
        if KL:
            val = tl.exp(mu)
        dest = row * n + tl.load(perm_ptr + row * n + offs, mask=m, other=0)
    else:
        w = tl.load(w_ptr + row * n + offs, mask=m, other=0.0).to(tl.float64)
        val = tl.where((flags & 2) != 0, w, mu) * SIGN
        dest = row * n + offs
    val = tl.where(bad, float("nan"), val)
    tl.store(out_ptr + dest, val.to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _gather_grad_kernel(
    grad_ptr, grad_row_stride, grad_col_stride, perm_ptr, mu_ptr, g_ptr, n, KL: tl.constexpr, BLOCK: tl.constexpr
):
    """Program ``(row, c)``, soft ranks' backward: the incoming gradient in sorted order, float64,
    times ``exp(mu)`` for kl (the derivative of ``r = exp(mu)``)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    p = tl.load(perm_ptr + row * n + offs, mask=m, other=0)
    g = tl.load(grad_ptr + row * grad_row_stride + p * grad_col_stride, mask=m, other=0.0).to(tl.float64)
    if KL:
        g = g * tl.exp(tl.load(mu_ptr + row * n + offs, mask=m, other=0.0).to(tl.float64))
    tl.store(g_ptr + row * n + offs, g, mask=m)


@triton.jit(do_not_specialize=["scale_bits"])
def _scatter_grad_kernel(
    gp_ptr,
    grad_ptr,
    grad_row_stride,
    grad_col_stride,
    perm_ptr,
    flags_ptr,
    gx_ptr,
    n,
    scale_bits,
    RANK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Program ``(row, c)``: the gradient of the operator's input from the projection's (``gp``,
    sorted order), scattered back by ``perm``. Soft ranks: ``gp * scale`` (``scale = ±1 / eps``);
    soft sort: ``gp``, or the incoming gradient itself where the row is hard. 0 for a row holding a
    NaN or an inf."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    flags = tl.load(flags_ptr + row)
    g = tl.load(gp_ptr + row * n + offs, mask=m, other=0.0).to(tl.float64)
    if RANK:
        g = g * _as_f64(scale_bits)
    elif (flags & 2) != 0:
        g = tl.load(grad_ptr + row * grad_row_stride + offs * grad_col_stride, mask=m, other=0.0).to(tl.float64)
    g = tl.where((flags & 1) != 0, 0.0, g)
    dest = row * n + tl.load(perm_ptr + row * n + offs, mask=m, other=0)
    tl.store(gx_ptr + dest, g.to(gx_ptr.dtype.element_ty), mask=m)


#: shortest piece of a row solved by its own program before the merge
_MIN_CHUNK = 64

#: positions per program of the block-id / ``mu`` pass after a merge
_IDS_BLOCK = 1024

#: programs that fill a large GPU (four per multiprocessor of an H100: 132 x 4)
_TARGET_PROGRAMS = 512

#: halvings of the binary search of a position among a row's block starts (positions are int32)
_SEARCH_STEPS = 31


def _chunk_length(rows: int, n: int, device: torch.device) -> int:
    """Length of the row pieces of :func:`projection_forward`: ``n`` (one program per row) when the
    rows alone fill the device or are short, else the length that splits each row into enough
    pieces to fill it (at least ``_MIN_CHUNK``). The pieces' sequential PAVs run in parallel; the
    merge then only visits the blocks they leave (few where the rows pool, ``n`` where nothing
    pools: about the cost of one sequential PAV)."""
    if device.type != "cuda" or n < 2 * _MIN_CHUNK or rows >= _TARGET_PROGRAMS:
        return n
    return max(_MIN_CHUNK, triton.cdiv(n, _TARGET_PROGRAMS // rows))


def _block(n: int) -> int:
    return max(16, min(_MAX_BLOCK, triton.next_power_of_2(max(n, 1))))


def projection_forward(
    s: torch.Tensor, w: torch.Tensor, kl: bool, *, chunk: int | None = None
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``mu = s - v(s, w)`` and the state of :func:`projection_backward` (see
    :func:`_projection_forward`); under ``torch.compile`` one opaque custom operator
    (``torch.ops.rankwise.triton_projection_forward``: the compiler neither traces nor reorders the
    kernels and their scratch buffers). ``chunk``: as :func:`_projection_forward` (eager only)."""
    if chunk is not None:
        return _projection_forward(s, w, kl, chunk=chunk)
    mu, ids, starts, acc_a, acc_b = _FORWARD_OP(s, w, kl)
    return mu, (ids, starts, acc_a, acc_b)


def _forward_op_impl(
    s: torch.Tensor, w: torch.Tensor, kl: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    mu, (ids, starts, acc_a, acc_b) = _projection_forward(s, w, kl)
    return mu, ids, starts, acc_a, acc_b


def _forward_op_fake(
    s: torch.Tensor, w: torch.Tensor, kl: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, n = s.shape
    return (
        s.new_empty((rows, n)),
        s.new_empty((rows, n), dtype=torch.int32),
        s.new_empty((rows, n + 1), dtype=torch.int32),
        s.new_empty((rows, n), dtype=torch.float64),
        s.new_empty((rows, n), dtype=torch.float64),
    )


def _projection_forward(
    s: torch.Tensor, w: torch.Tensor, kl: bool, *, chunk: int | None = None
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``mu = s - v(s, w)`` for the rows of ``s`` (``(R, n)``, sorted decreasingly; float32/float64)
    and ``w`` (``(R, n)`` or ``(1, n)``), and the state the backward pass needs: block ids (int32,
    ``(R, n)``), block starts (int32, ``(R, n + 1)``) and the blocks' two float64 statistics.

    ``chunk``: the length of the pieces of a row solved in parallel before their blocks are merged
    (default: :func:`_chunk_length`; ``n`` or more: one sequential PAV per row)."""
    rows, n = s.shape
    s = s.detach().contiguous()
    w = w.detach().to(s.dtype).contiguous()
    dev = s.device
    mu = torch.empty((rows, n), dtype=s.dtype, device=dev)
    ids = torch.empty((rows, n), dtype=torch.int32, device=dev)
    starts = torch.empty((rows, n + 1), dtype=torch.int32, device=dev)
    acc_a = torch.empty((rows, n), dtype=torch.float64, device=dev)
    acc_b = torch.empty((rows, n), dtype=torch.float64, device=dev)
    scratch = torch.empty((2, rows, n), dtype=torch.float64, device=dev)  # the blocks' largest |s|, |w|
    length = n if chunk is None else max(1, min(int(chunk), n))
    if chunk is None and rows and n:
        length = _chunk_length(rows, n, dev)
    if rows and n and length >= n:
        _pav_forward_kernel[(rows,)](
            s,
            w,
            0 if w.shape[0] == 1 else n,
            mu,
            ids,
            starts,
            acc_a,
            acc_b,
            scratch[0],
            scratch[1],
            n,
            TOL=_TOL,
            KL=kl,
            BLOCK=_block(n),
            num_warps=1,
        )
    elif rows and n:  # long rows, few of them: chunks in parallel, then one merge per row
        chunks = triton.cdiv(n, length)
        counts = torch.empty((rows, chunks), dtype=torch.int32, device=dev)
        nbs = torch.empty((rows,), dtype=torch.int32, device=dev)
        w_stride = 0 if w.shape[0] == 1 else n
        tables = (starts, acc_a, acc_b, scratch[0], scratch[1])
        _pav_chunk_kernel[(rows, chunks)](s, w, w_stride, *tables, counts, n, length, TOL=_TOL, KL=kl, num_warps=1)
        _pav_merge_kernel[(rows,)](*tables, counts, nbs, n, length, chunks, TOL=_TOL, KL=kl, num_warps=1)
        grid = (rows, triton.cdiv(n, _IDS_BLOCK))
        _ids_mu_kernel[grid](
            s, mu, ids, starts, acc_a, acc_b, nbs, n, _SEARCH_STEPS, KL=kl, BLOCK=_IDS_BLOCK, num_warps=4
        )
    return mu, (ids, starts, acc_a, acc_b)


def projection_backward(
    grad: torch.Tensor,
    s: torch.Tensor,
    w: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    kl: bool,
    need_s: bool,
    need_w: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """:func:`_projection_backward`; under ``torch.compile`` one opaque custom operator
    (``torch.ops.rankwise.triton_projection_backward``)."""
    grad_s, grad_w = _BACKWARD_OP(grad, s, w, *state, kl, need_s, need_w)
    return (grad_s if need_s else None), (grad_w if need_w else None)


def _backward_op_impl(
    grad: torch.Tensor,
    s: torch.Tensor,
    w: torch.Tensor,
    ids: torch.Tensor,
    starts: torch.Tensor,
    acc_a: torch.Tensor,
    acc_b: torch.Tensor,
    kl: bool,
    need_s: bool,
    need_w: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    grad_s, grad_w = _projection_backward(grad, s, w, (ids, starts, acc_a, acc_b), kl, need_s, need_w)
    empty = s.new_empty((0,))  # an operator returns tensors: an empty one where a gradient is not needed
    return (empty if grad_s is None else grad_s), (empty if grad_w is None else grad_w)


def _backward_op_fake(
    grad: torch.Tensor,
    s: torch.Tensor,
    w: torch.Tensor,
    ids: torch.Tensor,
    starts: torch.Tensor,
    acc_a: torch.Tensor,
    acc_b: torch.Tensor,
    kl: bool,
    need_s: bool,
    need_w: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        s.new_empty(s.shape if need_s else (0,)),
        s.new_empty(w.shape if need_w else (0,)),
    )


_FORWARD_OP = KernelOp(
    "triton_projection_forward",
    "(Tensor s, Tensor w, bool kl) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    _forward_op_impl,
    _forward_op_fake,
    device_types=None,
)
_BACKWARD_OP = KernelOp(
    "triton_projection_backward",
    "(Tensor grad, Tensor s, Tensor w, Tensor ids, Tensor starts, Tensor acc_a, Tensor acc_b, bool kl, "
    "bool need_s, bool need_w) -> (Tensor, Tensor)",
    _backward_op_impl,
    _backward_op_fake,
    device_types=None,
)


def _projection_backward(
    grad: torch.Tensor,
    s: torch.Tensor,
    w: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    kl: bool,
    need_s: bool,
    need_w: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Vector-Jacobian product of :func:`projection_forward` (``state`` is its second output):
    ``(grad_s, grad_w)`` in the dtype of ``s``, ``grad_w`` of the shape of ``w`` (a shared ``(1, n)``
    ``w`` sums over rows); ``None`` where not needed."""
    rows, n = s.shape
    ids, starts, acc_a, acc_b = state
    dev = s.device
    g = grad.detach().to(s.dtype).contiguous()
    s = s.detach().contiguous()
    w = w.detach().to(s.dtype).contiguous()
    grad_s = torch.empty((rows, n), dtype=s.dtype, device=dev) if need_s else None
    grad_w = torch.empty((rows, n), dtype=s.dtype, device=dev) if need_w else None
    if rows and n and (need_s or need_w):
        prefix = torch.empty((rows, n + 1), dtype=torch.float64, device=dev)
        _pav_backward_kernel[(rows,)](
            g,
            s,
            w,
            0 if w.shape[0] == 1 else n,
            ids,
            starts,
            acc_a,
            acc_b,
            prefix,
            grad_s if grad_s is not None else g,
            grad_w if grad_w is not None else g,
            n,
            KL=kl,
            NEED_S=need_s,
            NEED_W=need_w,
            BLOCK=_block(n),
            num_warps=1,
        )
    if grad_w is not None and w.shape[0] != rows:
        grad_w = grad_w.sum(0, keepdim=True)
    return grad_s, grad_w


# --------------------------------------------------------------------------------------------------
# The soft operators' kernels around the projection (custom operators under torch.compile)
# --------------------------------------------------------------------------------------------------
def _bits(x: float) -> int:
    """A float64 as the int64 of its bits (see :func:`_as_f64`)."""
    return int(struct.unpack("<q", struct.pack("<d", float(x)))[0])


def _grid(rows: int, n: int) -> tuple[tuple[int, int], int, int]:
    """Grid, block and warps of the element-wise passes: programs ``(row, chunk)``."""
    block = _block(n)
    return (rows, triton.cdiv(n, block)), block, (4 if block >= 512 else 1)


def _rank_prologue_impl(
    v: torch.Tensor, eps: float, limit: float, far: float, descending: bool, kl: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, n = v.shape
    v = v.detach().contiguous()
    s, w, flags = _prologue_outputs(v, rows, n, 1)
    if rows and n:
        grid, block, warps = _grid(rows, n)
        _rank_prologue_kernel[grid](
            v, s, w, flags, n, _bits(eps), _bits(limit), _bits(far), _bits(limit * eps),
            KL=kl, SIGN=-1.0 if descending else 1.0, BLOCK=block, num_warps=warps,
        )  # fmt: skip
    return s, w, flags


def _rank_prologue_fake(
    v: torch.Tensor, eps: float, limit: float, far: float, descending: bool, kl: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, n = v.shape
    return _prologue_outputs(v, rows, n, 1)


def _sort_prologue_fake(
    v: torch.Tensor, eps: float, descending: bool, kl: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, n = v.shape
    return _prologue_outputs(v, rows, n, rows)


def _prologue_outputs(
    v: torch.Tensor, rows: int, n: int, w_rows: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``s`` (rows, n), ``w`` (w_rows, n), both float64, and the rows' int8 flags, uninitialized."""
    f64 = torch.float64
    flags = v.new_empty((rows,), dtype=torch.int8)
    return v.new_empty((rows, n), dtype=f64), v.new_empty((w_rows, n), dtype=f64), flags


def _sort_prologue_impl(
    v: torch.Tensor, eps: float, descending: bool, kl: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, n = v.shape
    v = v.detach().contiguous()
    s, w, flags = _prologue_outputs(v, rows, n, rows)
    if rows and n:
        grid, block, warps = _grid(rows, n)
        extra = 2.0 * math.log(max(n, 1))
        _sort_prologue_kernel[grid](
            v, s, w, flags, n, _bits(eps), _bits(extra),
            KL=kl, SIGN=1.0 if descending else -1.0, BLOCK=block, num_warps=warps,
        )  # fmt: skip
    return s, w, flags


def _epilogue_impl(
    mu: torch.Tensor, w: torch.Tensor, perm: torch.Tensor, flags: torch.Tensor, rank: bool, kl: bool,
    descending: bool, dtype: torch.dtype,
) -> torch.Tensor:  # fmt: skip
    rows, n = mu.shape
    out = torch.empty((rows, n), dtype=dtype, device=mu.device)
    if rows and n:
        grid, block, warps = _grid(rows, n)
        sign = 1.0 if (descending or rank) else -1.0
        _epilogue_kernel[grid](
            mu, w, perm.contiguous(), flags, out, n, RANK=rank, KL=kl, SIGN=sign, BLOCK=block, num_warps=warps
        )
    return out


def _epilogue_fake(mu: torch.Tensor, *args: Any) -> torch.Tensor:
    return mu.new_empty(mu.shape, dtype=args[-1])


def _rank_grad_gather_impl(grad: torch.Tensor, perm: torch.Tensor, mu: torch.Tensor, kl: bool) -> torch.Tensor:
    rows, n = mu.shape
    g = torch.empty((rows, n), dtype=torch.float64, device=mu.device)
    if rows and n:
        grid, block, warps = _grid(rows, n)
        _gather_grad_kernel[grid](
            grad, grad.stride(0), grad.stride(1), perm.contiguous(), mu, g, n, KL=kl, BLOCK=block, num_warps=warps
        )
    return g


def _rank_grad_gather_fake(grad: torch.Tensor, perm: torch.Tensor, mu: torch.Tensor, kl: bool) -> torch.Tensor:
    return mu.new_empty(mu.shape, dtype=torch.float64)


def _scatter_grad_impl(
    gp: torch.Tensor, grad: torch.Tensor, perm: torch.Tensor, flags: torch.Tensor, scale: float, rank: bool,
    dtype: torch.dtype,
) -> torch.Tensor:  # fmt: skip
    rows, n = gp.shape
    gx = torch.empty((rows, n), dtype=dtype, device=gp.device)
    if rows and n:
        grid, block, warps = _grid(rows, n)
        _scatter_grad_kernel[grid](
            gp, grad, grad.stride(0), grad.stride(1), perm.contiguous(), flags, gx, n, _bits(scale),
            RANK=rank, BLOCK=block, num_warps=warps,
        )  # fmt: skip
    return gx


def _scatter_grad_fake(gp: torch.Tensor, *args: Any) -> torch.Tensor:
    return gp.new_empty(gp.shape, dtype=args[-1])


_RANK_PROLOGUE_OP = KernelOp(
    "triton_rank_prologue",
    "(Tensor v, float eps, float limit, float far, bool descending, bool kl) -> (Tensor, Tensor, Tensor)",
    _rank_prologue_impl,
    _rank_prologue_fake,
    device_types=None,
)
_SORT_PROLOGUE_OP = KernelOp(
    "triton_sort_prologue",
    "(Tensor v, float eps, bool descending, bool kl) -> (Tensor, Tensor, Tensor)",
    _sort_prologue_impl,
    _sort_prologue_fake,
    device_types=None,
)
_EPILOGUE_OP = KernelOp(
    "triton_operator_epilogue",
    "(Tensor mu, Tensor w, Tensor perm, Tensor flags, bool rank, bool kl, bool descending, ScalarType dtype) -> Tensor",
    _epilogue_impl,
    _epilogue_fake,
    device_types=None,
)
_GATHER_OP = KernelOp(
    "triton_rank_grad_gather",
    "(Tensor grad, Tensor perm, Tensor mu, bool kl) -> Tensor",
    _rank_grad_gather_impl,
    _rank_grad_gather_fake,
    device_types=None,
)
_SCATTER_OP = KernelOp(
    "triton_scatter_grad",
    "(Tensor gp, Tensor grad, Tensor perm, Tensor flags, float scale, bool rank, ScalarType dtype) -> Tensor",
    _scatter_grad_impl,
    _scatter_grad_fake,
    device_types=None,
)


def rank_prologue(
    v: torch.Tensor, eps: float, limit: float, far: float, descending: bool, kl: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Soft ranks before the projection, one kernel: for ``v`` (rows, n) sorted (decreasingly, or
    increasingly when ``descending``: ``y = -v`` is then decreasing), ``s = y / eps`` in float64
    (divided in the dtype of ``v``; rows whose largest ``|y| / eps`` exceeds ``far`` laid out run by
    run as ``rankwise.ops.isotonic._condition_rank_inputs`` does, with gap limit ``limit``), the
    weights ``rho`` (``log rho`` for ``kl``; (1, n) float64) and the rows' flags (int8, bit 0: a NaN
    or an inf; bit 1: conditioned)."""
    return _RANK_PROLOGUE_OP(v, eps, limit, far, descending, kl)


def sort_prologue(
    v: torch.Tensor, eps: float, descending: bool, kl: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Soft sort before the projection, one kernel: for ``v`` (rows, n) sorted so that
    ``w = v`` (``descending``) or ``w = -v`` is decreasing: the targets ``s`` (``rho / eps``, or
    ``rho`` times the row's gap limit where ``1 / eps`` exceeds it), ``w`` in float64 and the rows'
    flags (bit 0: a NaN or an inf; bit 1: hard, the result is ``w`` itself)."""
    return _SORT_PROLOGUE_OP(v, eps, descending, kl)


def operator_epilogue(
    mu: torch.Tensor,
    w: torch.Tensor,
    perm: torch.Tensor,
    flags: torch.Tensor,
    rank: bool,
    kl: bool,
    descending: bool,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The soft operator's output in ``dtype`` from the projection ``mu``, one kernel: soft ranks
    (``rank``): ``mu`` (``exp(mu)`` for ``kl``) in the input order (``perm``); soft sort: ``mu``, or
    ``w`` on hard rows, signed back (ascending: ``-``); NaN on rows flagged as holding a NaN/inf."""
    return _EPILOGUE_OP(mu, w, perm, flags, rank, kl, descending, dtype)


def rank_grad_gather(grad: torch.Tensor, perm: torch.Tensor, mu: torch.Tensor, kl: bool) -> torch.Tensor:
    """Soft ranks' backward, one kernel: ``grad`` (any strides) in sorted order, float64, times
    ``exp(mu)`` for ``kl``."""
    return _GATHER_OP(grad, perm, mu, kl)


def scatter_grad(
    gp: torch.Tensor,
    grad: torch.Tensor,
    perm: torch.Tensor,
    flags: torch.Tensor,
    scale: float,
    rank: bool,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The gradient of the operator's input in ``dtype``, one kernel: the projection's gradient
    ``gp`` (sorted order) times ``scale`` (soft ranks) or, soft sort, ``gp`` with the incoming
    ``grad`` on hard rows, scattered to the input order by ``perm``; 0 on rows holding a NaN/inf."""
    return _SCATTER_OP(gp, grad, perm, flags, scale, rank, dtype)
