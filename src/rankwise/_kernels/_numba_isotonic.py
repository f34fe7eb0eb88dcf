r"""Numba pool-adjacent-violators kernels of the isotonic soft sort / rank (:mod:`rankwise.ops.isotonic`, CPU).

Both kernels solve, for every row ``r`` of ``s`` (shape ``(R, n)``) and ``w`` (shape ``(R, n)`` or
``(1, n)``, broadcast over rows), the *decreasing* isotonic regression

.. math::
    v^\star = \arg\min_{v_1 \ge \dots \ge v_n} \sum_i \ell(v_i; s_i, w_i)

with ``l2``: :math:`\ell = \tfrac12 (v_i - (s_i - w_i))^2` (block value: mean of ``s - w``) and
``kl``: :math:`\ell = e^{s_i - v_i} + e^{w_i} v_i` (block value: ``logsumexp(s_B) - logsumexp(w_B)``).
Adjacent blocks are pooled while the left value is ``<=`` the right one plus a round-off tolerance
(:data:`TIE_ULPS` float64 ulps of the magnitudes the two values are computed from: the blocks' largest
``|s|`` and ``|w|``, plus the block log-sum-exps for ``kl``; local, independent of n), so the returned
blocks have decreasing values and exact ties computed with different round-off are pooled alike on
the numba and the PyTorch path. Rows are processed inside the JIT; accumulation is in float64.
The kernels write ``mu = s - v`` (computed in float64, stored in the dtype of ``s``) into ``out_mu``
and the 0-based block index of every position into ``out_ids`` (int64); blocks are contiguous runs.

Importing this module raises ``ImportError`` when numba is unavailable; the caller falls back to
the vectorized PyTorch path.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import carray

from rankwise._kernels._numba_sort import descending_order, sort_scratch
from rankwise._kernels._numba_util import TASK_ARGS, f32p, f64p, i64p, next_chunk, task

__all__ = [
    "RANK_BACKWARD",
    "RANK_FORWARD",
    "SORT_BACKWARD",
    "SORT_FORWARD",
    "TIE_ULPS",
    "pav_backward",
    "pav_kl",
    "pav_l2",
    "soft_rank_backward",
    "soft_rank_forward",
    "soft_sort_backward",
    "soft_sort_forward",
]

#: two block values count as tied (and are pooled) when the left one exceeds the right one by at most
#: ``TIE_ULPS * eps * (m_left + m_right)``, ``m`` = the block's largest ``|s|`` + largest ``|w|``
#: (``kl``: plus ``|lse(s_B)| + |lse(w_B)| + 1``); the PyTorch path uses the same rule
TIE_ULPS = 4.0
_EPS = float(np.finfo(np.float64).eps)
_TOL = TIE_ULPS * _EPS


@numba.njit(cache=True, nogil=True, inline="always")
def _pav_l2_row(s, w, starts, sums, counts, max_s, max_w):  # type: ignore[no-untyped-def]
    """PAV (l2) of one row: blocks ``starts[b]:starts[b + 1]`` with sums and counts of ``s - w``; returns
    the number of blocks."""
    n = s.shape[0]
    nb = 0
    for i in range(n):
        si = np.float64(s[i])
        wi = np.float64(w[i])
        acc = si - wi
        cnt = 1.0
        ms = abs(si)
        mw = abs(wi)
        start = i
        # pool while the previous block's mean <= the current block's mean (+ local round-off)
        while nb > 0 and sums[nb - 1] / counts[nb - 1] <= acc / cnt + _TOL * (max_s[nb - 1] + max_w[nb - 1] + ms + mw):
            nb -= 1
            acc += sums[nb]
            cnt += counts[nb]
            ms = max(ms, max_s[nb])
            mw = max(mw, max_w[nb])
            start = starts[nb]
        starts[nb] = start
        sums[nb] = acc
        counts[nb] = cnt
        max_s[nb] = ms
        max_w[nb] = mw
        nb += 1
    starts[nb] = n
    return nb


@numba.njit(cache=True, nogil=True)
def pav_l2(s, w, out_mu, out_ids):  # type: ignore[no-untyped-def]
    rows, n = s.shape
    shared_w = w.shape[0] == 1
    starts = np.empty(n + 1, np.int64)
    sums = np.empty(n, np.float64)
    counts = np.empty(n, np.float64)
    max_s = np.empty(n, np.float64)  # largest |s| in the block
    max_w = np.empty(n, np.float64)  # largest |w| in the block
    for r in range(rows):
        nb = _pav_l2_row(s[r], w[0 if shared_w else r], starts, sums, counts, max_s, max_w)
        for b in range(nb):
            val = sums[b] / counts[b]
            for i in range(starts[b], starts[b + 1]):
                out_mu[r, i] = np.float64(s[r, i]) - val
                out_ids[r, i] = b


@numba.njit(cache=True, nogil=True, inline="always")
def _logaddexp(a, b):  # type: ignore[no-untyped-def]
    if a == -np.inf:
        return b
    if b == -np.inf:
        return a
    if a > b:
        return a + math.log1p(math.exp(b - a))
    return b + math.log1p(math.exp(a - b))


@numba.njit(cache=True, nogil=True, inline="always")
def _pav_kl_row(s, w, starts, lse_s, lse_w, max_s, max_w):  # type: ignore[no-untyped-def]
    """PAV (kl) of one row: blocks ``starts[b]:starts[b + 1]`` with the log-sum-exps of ``s`` and ``w``;
    returns the number of blocks."""
    n = s.shape[0]
    nb = 0
    for i in range(n):
        a = np.float64(s[i])
        c = np.float64(w[i])
        ms = abs(a)
        mw = abs(c)
        start = i
        # pool while the previous block's value <= the current block's value (+ local round-off)
        while nb > 0 and lse_s[nb - 1] - lse_w[nb - 1] <= a - c + _TOL * (
            (max_s[nb - 1] + max_w[nb - 1] + abs(lse_s[nb - 1]) + abs(lse_w[nb - 1]) + 1.0)
            + (ms + mw + abs(a) + abs(c) + 1.0)
        ):
            nb -= 1
            a = _logaddexp(a, lse_s[nb])
            c = _logaddexp(c, lse_w[nb])
            ms = max(ms, max_s[nb])
            mw = max(mw, max_w[nb])
            start = starts[nb]
        starts[nb] = start
        lse_s[nb] = a
        lse_w[nb] = c
        max_s[nb] = ms
        max_w[nb] = mw
        nb += 1
    starts[nb] = n
    return nb


@numba.njit(cache=True, nogil=True, inline="always")
def _pav_kl_rho_row(s, log_rho, starts, lse_s, lse_w, max_s, max_w):  # type: ignore[no-untyped-def]
    """:func:`_pav_kl_row` for ``w = log rho``, ``rho = (n, ..., 1)`` (soft ranks): the ``lse(w)`` of a
    pooled block ``j..i`` is the log of its rho sum ``(i - j + 1)(2n - j - i) / 2`` (an exact integer),
    one log per pooling instead of a log-add-exp."""
    n = s.shape[0]
    nb = 0
    for i in range(n):
        a = np.float64(s[i])
        c = log_rho[i]
        ms = abs(a)
        mw = abs(c)
        start = i
        # pool while the previous block's value <= the current block's value (+ local round-off)
        while nb > 0 and lse_s[nb - 1] - lse_w[nb - 1] <= a - c + _TOL * (
            (max_s[nb - 1] + max_w[nb - 1] + abs(lse_s[nb - 1]) + abs(lse_w[nb - 1]) + 1.0)
            + (ms + mw + abs(a) + abs(c) + 1.0)
        ):
            nb -= 1
            a = _logaddexp(a, lse_s[nb])
            start = starts[nb]
            c = math.log(np.float64((i - start + 1) * (2 * n - start - i) // 2))
            ms = max(ms, max_s[nb])
            mw = max(mw, max_w[nb])
        starts[nb] = start
        lse_s[nb] = a
        lse_w[nb] = c
        max_s[nb] = ms
        max_w[nb] = mw
        nb += 1
    starts[nb] = n
    return nb


@numba.njit(cache=True, nogil=True)
def pav_kl(s, w, out_mu, out_ids):  # type: ignore[no-untyped-def]
    rows, n = s.shape
    shared_w = w.shape[0] == 1
    starts = np.empty(n + 1, np.int64)
    lse_s = np.empty(n, np.float64)
    lse_w = np.empty(n, np.float64)
    max_s = np.empty(n, np.float64)  # largest |s| in the block
    max_w = np.empty(n, np.float64)  # largest |w| in the block
    for r in range(rows):
        nb = _pav_kl_row(s[r], w[0 if shared_w else r], starts, lse_s, lse_w, max_s, max_w)
        for b in range(nb):
            val = lse_s[b] - lse_w[b]
            for i in range(starts[b], starts[b + 1]):
                out_mu[r, i] = np.float64(s[r, i]) - val
                out_ids[r, i] = b


@numba.njit(cache=True, nogil=True)
def pav_backward(g, s, w, ids, kl, need_s, need_w, grad_s, grad_w):  # type: ignore[no-untyped-def]
    """Vector-Jacobian product of ``mu = s - v(s, w)`` for every row, block by block.

    l2: ``grad_s = g - mean_B(g)``, ``grad_w = mean_B(g)``; kl: ``grad_s = g - softmax_B(s) sum_B(g)``,
    ``grad_w = softmax_B(w) sum_B(g)``. ``grad_w`` has the shape of ``w``; a shared ``(1, n)`` ``w``
    accumulates over rows, so it must be zero-initialized.
    """
    rows, n = g.shape
    shared_w = w.shape[0] == 1
    for r in range(rows):
        wr = 0 if shared_w else r
        lo = 0
        while lo < n:
            hi = lo + 1
            while hi < n and ids[r, hi] == ids[r, lo]:
                hi += 1
            gsum = 0.0
            for i in range(lo, hi):
                gsum += np.float64(g[r, i])
            if not kl:
                mean = gsum / (hi - lo)
                for i in range(lo, hi):
                    if need_s:
                        grad_s[r, i] = np.float64(g[r, i]) - mean
                    if need_w:
                        grad_w[wr, i] += mean
            else:
                if need_s:
                    m = -np.inf
                    for i in range(lo, hi):
                        m = max(m, np.float64(s[r, i]))
                    tot = 0.0
                    for i in range(lo, hi):
                        tot += math.exp(np.float64(s[r, i]) - m)
                    for i in range(lo, hi):
                        grad_s[r, i] = np.float64(g[r, i]) - math.exp(np.float64(s[r, i]) - m) / tot * gsum
                if need_w:
                    m = -np.inf
                    for i in range(lo, hi):
                        m = max(m, np.float64(w[wr, i]))
                    tot = 0.0
                    for i in range(lo, hi):
                        tot += math.exp(np.float64(w[wr, i]) - m)
                    for i in range(lo, hi):
                        grad_w[wr, i] += math.exp(np.float64(w[wr, i]) - m) / tot * gsum
            lo = hi


# --------------------------------------------------------------------------------------------------
# fused soft rank / soft sort: gather by the sort permutation, PAV, scatter back, in one pass per row
# --------------------------------------------------------------------------------------------------


@numba.njit(cache=True, nogil=True)
def soft_rank_forward(z, perm, w, kl, out, ids, x, div, x_max):  # type: ignore[no-untyped-def]
    """Ascending soft ranks of the rows of ``z`` (the input divided by the strength, negated for
    descending): ``s = z[perm]`` (``perm`` sorts ``z`` decreasingly), ``mu = s - v(s, w)`` with
    ``w = rho`` (l2) or ``log rho`` (kl; float64, shape (1, n); kl pools by :func:`_pav_kl_rho_row`,
    which relies on ``w = log(n, ..., 1)``), ``out[perm] = mu`` (l2) or ``exp(mu)`` (kl);
    ``ids`` receives the block index of every sorted position (for backward). With ``x`` given
    (small inputs), ``z = x / div`` and ``perm`` are computed here first (as torch would: one
    division in the dtype of ``x``, a stable sort), and ``x_max[r]`` receives the row's largest
    ``|x|`` (NaN or inf when the row holds a NaN or inf): the magnitude check of the caller, read in
    the same pass."""
    rows, n = z.shape
    s = np.empty(n, z.dtype)
    starts = np.empty(n + 1, np.int64)
    acc_a = np.empty(n, np.float64)
    acc_b = np.empty(n, np.float64)
    max_s = np.empty(n, np.float64)
    max_w = np.empty(n, np.float64)
    keys, tmp_keys, tmp_perm, hist = sort_scratch(n)
    for r in range(rows):
        if x is not None:
            m = 0.0
            for i in range(n):
                xi = x[r, i]
                a = abs(np.float64(xi))
                if a > m or a != a:  # a NaN sticks (no later ``a > NaN``)
                    m = a
                z[r, i] = xi / div
            x_max[r] = m
            descending_order(z[r], perm[r], keys, tmp_keys, tmp_perm, hist)
        for i in range(n):
            s[i] = z[r, perm[r, i]]
        if kl:
            nb = _pav_kl_rho_row(s, w[0], starts, acc_a, acc_b, max_s, max_w)
        else:
            nb = _pav_l2_row(s, w[0], starts, acc_a, acc_b, max_s, max_w)
        for b in range(nb):
            val = acc_a[b] - acc_b[b] if kl else acc_a[b] / acc_b[b]
            for i in range(starts[b], starts[b + 1]):
                mu = np.float64(s[i]) - val
                out[r, perm[r, i]] = math.exp(mu) if kl else mu
                ids[r, i] = b


@numba.njit(cache=True, nogil=True)
def soft_rank_backward(grad_out, z, perm, ids, out, kl, scale, grad_z):  # type: ignore[no-untyped-def]
    """Vector-Jacobian product of :func:`soft_rank_forward`, times ``scale`` (the derivative of ``z``
    in the input): l2 ``g - mean_B(g)``, kl ``out * (g - sum_B(softmax_B(s) g))`` with ``g = grad``
    centred on each block (exactly 0 for a block-constant ``grad``)."""
    rows, n = z.shape
    g = np.empty(n, np.float64)
    e = np.empty(n, np.float64)  # kl: exp(z - block max), once per element
    for r in range(rows):
        for i in range(n):
            g[i] = np.float64(grad_out[r, perm[r, i]])
        lo = 0
        while lo < n:
            hi = lo + 1
            while hi < n and ids[r, hi] == ids[r, lo]:
                hi += 1
            # centred on the block's first cotangent: a block-constant cotangent gives exactly 0
            # (kl: r_i = p_i sum_B rho, so the product is r_j (g_j - sum_i p_i g_i))
            c0 = g[lo]
            for i in range(lo, hi):
                g[i] -= c0
            if not kl:
                gsum = 0.0
                for i in range(lo, hi):
                    gsum += g[i]
                mean = gsum / (hi - lo)
                for i in range(lo, hi):
                    grad_z[r, perm[r, i]] = (g[i] - mean) * scale
            else:
                m = -np.inf
                for i in range(lo, hi):
                    m = max(m, np.float64(z[r, perm[r, i]]))
                tot = 0.0
                for i in range(lo, hi):
                    e[i] = math.exp(np.float64(z[r, perm[r, i]]) - m)
                    tot += e[i]
                wsum = 0.0
                for i in range(lo, hi):
                    wsum += e[i] * g[i]
                wsum /= tot
                for i in range(lo, hi):
                    grad_z[r, perm[r, i]] = np.float64(out[r, perm[r, i]]) * (g[i] - wsum) * scale
            lo = hi


@numba.njit(cache=True, nogil=True)
def soft_sort_forward(x, perm, sign, s, kl, out, ids, sort):  # type: ignore[no-untyped-def]
    """Soft sort of the rows of ``x``: ``w = sign * x[perm]`` (``perm`` sorts ``sign * x``
    decreasingly; computed here when ``sort``), ``mu = s - v(s, w)`` with ``s = rho / strength``
    (shape (1, n)), ``out = sign * mu`` (sorted order); ``ids`` receives the block index of every
    position."""
    rows, n = x.shape
    w = np.empty(n, x.dtype)
    starts = np.empty(n + 1, np.int64)
    acc_a = np.empty(n, np.float64)
    acc_b = np.empty(n, np.float64)
    max_s = np.empty(n, np.float64)
    max_w = np.empty(n, np.float64)
    keys, tmp_keys, tmp_perm, hist = sort_scratch(n)
    for r in range(rows):
        if sort:
            for i in range(n):
                w[i] = sign * x[r, i]
            descending_order(w, perm[r], keys, tmp_keys, tmp_perm, hist)
        for i in range(n):
            w[i] = sign * x[r, perm[r, i]]
        if kl:
            nb = _pav_kl_row(s[0], w, starts, acc_a, acc_b, max_s, max_w)
        else:
            nb = _pav_l2_row(s[0], w, starts, acc_a, acc_b, max_s, max_w)
        for b in range(nb):
            val = acc_a[b] - acc_b[b] if kl else acc_a[b] / acc_b[b]
            for i in range(starts[b], starts[b + 1]):
                out[r, i] = sign * (np.float64(s[0, i]) - val)
                ids[r, i] = b


@numba.njit(cache=True, nogil=True)
def soft_sort_backward(grad_out, x, perm, ids, sign, kl, grad_x):  # type: ignore[no-untyped-def]
    """Vector-Jacobian product of :func:`soft_sort_forward` in ``x``: with ``g = sign * grad``,
    l2 ``mean_B(g)``, kl ``softmax_B(w) sum_B(g)``, scattered back through ``perm`` times ``sign``."""
    rows, n = x.shape
    e = np.empty(n, np.float64)  # kl: exp(w - block max), once per element
    for r in range(rows):
        lo = 0
        while lo < n:
            hi = lo + 1
            while hi < n and ids[r, hi] == ids[r, lo]:
                hi += 1
            gsum = 0.0
            for i in range(lo, hi):
                gsum += sign * np.float64(grad_out[r, i])
            if not kl:
                mean = gsum / (hi - lo)
                for i in range(lo, hi):
                    grad_x[r, perm[r, i]] = sign * mean
            else:
                m = -np.inf
                for i in range(lo, hi):
                    m = max(m, sign * np.float64(x[r, perm[r, i]]))
                tot = 0.0
                for i in range(lo, hi):
                    e[i] = math.exp(sign * np.float64(x[r, perm[r, i]]) - m)
                    tot += e[i]
                for i in range(lo, hi):
                    p = e[i] / tot
                    grad_x[r, perm[r, i]] = sign * p * gsum
            lo = hi


# --------------------------------------------------------------------------------------------------
# row-parallel tasks: plain functions compiled as ``void(void*)`` C callbacks (``_numba_util.task``,
# cached against THIS file, so that they are recompiled whenever the kernels change) and run by the
# dispatcher on torch's OpenMP team; argument block as ``_numba_util`` describes.
# --------------------------------------------------------------------------------------------------
def rank_forward_task(data):  # type: ignore[no-untyped-def]
    """args[4:12]: z, perm, w (1, n, float64), out, ids, x, kl, x_max (rows, float64); float64 at
    [12]: the divisor."""
    a = carray(i64p(data), TASK_ARGS)
    f = carray(f64p(data), TASK_ARGS)
    rows, n, chunks = a[2], a[3], a[1]
    z = carray(f32p(a[4]), (rows, n))
    perm = carray(i64p(a[5]), (rows, n))
    w = carray(f64p(a[6]), (1, n))
    out = carray(f32p(a[7]), (rows, n))
    ids = carray(i64p(a[8]), (rows, n))
    x = carray(f32p(a[9]), (rows, n))
    kl = a[10] != 0
    x_max = carray(f64p(a[11]), rows)
    div = np.float32(f[12])
    while True:
        c = next_chunk(i64p(data))
        if c >= chunks:
            break
        r0, r1 = c * rows // chunks, (c + 1) * rows // chunks
        soft_rank_forward(z[r0:r1], perm[r0:r1], w, kl, out[r0:r1], ids[r0:r1], x[r0:r1], div, x_max[r0:r1])


def rank_backward_task(data):  # type: ignore[no-untyped-def]
    """args[4:11]: grad, z, perm, ids, out, grad_z, kl; float64 at [11]: the scale."""
    a = carray(i64p(data), TASK_ARGS)
    f = carray(f64p(data), TASK_ARGS)
    rows, n, chunks = a[2], a[3], a[1]
    g = carray(f32p(a[4]), (rows, n))
    z = carray(f32p(a[5]), (rows, n))
    perm = carray(i64p(a[6]), (rows, n))
    ids = carray(i64p(a[7]), (rows, n))
    out = carray(f32p(a[8]), (rows, n))
    gz = carray(f32p(a[9]), (rows, n))
    kl = a[10] != 0
    scale = f[11]
    while True:
        c = next_chunk(i64p(data))
        if c >= chunks:
            break
        r0, r1 = c * rows // chunks, (c + 1) * rows // chunks
        soft_rank_backward(g[r0:r1], z[r0:r1], perm[r0:r1], ids[r0:r1], out[r0:r1], kl, scale, gz[r0:r1])


def sort_forward_task(data):  # type: ignore[no-untyped-def]
    """args[4:10]: x, perm, s (1, n), out, ids, kl; float64 at [10]: the sign."""
    a = carray(i64p(data), TASK_ARGS)
    f = carray(f64p(data), TASK_ARGS)
    rows, n, chunks = a[2], a[3], a[1]
    x = carray(f32p(a[4]), (rows, n))
    perm = carray(i64p(a[5]), (rows, n))
    s = carray(f32p(a[6]), (1, n))
    out = carray(f32p(a[7]), (rows, n))
    ids = carray(i64p(a[8]), (rows, n))
    kl = a[9] != 0
    sign = f[10]
    while True:
        c = next_chunk(i64p(data))
        if c >= chunks:
            break
        r0, r1 = c * rows // chunks, (c + 1) * rows // chunks
        soft_sort_forward(x[r0:r1], perm[r0:r1], sign, s, kl, out[r0:r1], ids[r0:r1], True)


def sort_backward_task(data):  # type: ignore[no-untyped-def]
    """args[4:10]: grad, x, perm, ids, grad_x, kl; float64 at [10]: the sign."""
    a = carray(i64p(data), TASK_ARGS)
    f = carray(f64p(data), TASK_ARGS)
    rows, n, chunks = a[2], a[3], a[1]
    g = carray(f32p(a[4]), (rows, n))
    x = carray(f32p(a[5]), (rows, n))
    perm = carray(i64p(a[6]), (rows, n))
    ids = carray(i64p(a[7]), (rows, n))
    gx = carray(f32p(a[8]), (rows, n))
    kl = a[9] != 0
    sign = f[10]
    while True:
        c = next_chunk(i64p(data))
        if c >= chunks:
            break
        r0, r1 = c * rows // chunks, (c + 1) * rows // chunks
        soft_sort_backward(g[r0:r1], x[r0:r1], perm[r0:r1], ids[r0:r1], sign, kl, gx[r0:r1])


#: addresses of the tasks as C callbacks for the dispatcher (:mod:`rankwise._kernels._parallel`)
RANK_FORWARD = task(rank_forward_task)
RANK_BACKWARD = task(rank_backward_task)
SORT_FORWARD = task(sort_forward_task)
SORT_BACKWARD = task(sort_backward_task)
