r"""Numba pool-adjacent-violators kernels for :mod:`rankwise.ops.isotonic` (CPU).

Both kernels solve, for every row ``r`` of ``s`` (shape ``(R, n)``) and ``w`` (shape ``(R, n)`` or
``(1, n)``, broadcast over rows), the *decreasing* isotonic regression

.. math::
    v^\star = \arg\min_{v_1 \ge \dots \ge v_n} \sum_i \ell(v_i; s_i, w_i)

with ``l2``: :math:`\ell = \tfrac12 (v_i - (s_i - w_i))^2` (block value: mean of ``s - w``) and
``kl``: :math:`\ell = e^{s_i - v_i} + e^{w_i} v_i` (block value: ``logsumexp(s_B) - logsumexp(w_B)``).
Adjacent blocks are pooled while the left value is ``<=`` the right one plus a round-off tolerance
(:func:`tie_tolerance`, shared with the PyTorch path so that both pool exact ties alike), so the
returned blocks have decreasing values. Rows are processed inside the JIT; accumulation is in float64.
The kernels write ``mu = s - v`` (computed in float64, stored in the dtype of ``s``) into ``out_mu``
and the 0-based block index of every position into ``out_ids`` (int64); blocks are contiguous runs.

Importing this module raises ``ImportError`` when numba is unavailable; the caller falls back to
the vectorized PyTorch path.
"""

from __future__ import annotations

import math

import numba
import numpy as np

__all__ = ["pav_backward", "pav_kl", "pav_l2", "tie_tolerance"]

#: relative tolerance (times n and the row's magnitude) under which two block values count as tied
TIE_RTOL = 8 * float(np.finfo(np.float64).eps)


@numba.njit(cache=True, nogil=True)
def tie_tolerance(s_row, w_row):  # type: ignore[no-untyped-def]
    """``TIE_RTOL * n * (max|s| + max|w| + 1)`` for one row."""
    ms = 0.0
    for i in range(s_row.shape[0]):
        ms = max(ms, abs(np.float64(s_row[i])))
    mw = 0.0
    for i in range(w_row.shape[0]):
        mw = max(mw, abs(np.float64(w_row[i])))
    return TIE_RTOL * s_row.shape[0] * (ms + mw + 1.0)


@numba.njit(cache=True, nogil=True)
def pav_l2(s, w, out_mu, out_ids):  # type: ignore[no-untyped-def]
    rows, n = s.shape
    shared_w = w.shape[0] == 1
    starts = np.empty(n + 1, np.int64)
    sums = np.empty(n, np.float64)
    counts = np.empty(n, np.float64)
    for r in range(rows):
        wr = 0 if shared_w else r
        tol = tie_tolerance(s[r], w[wr])
        nb = 0
        for i in range(n):
            acc = np.float64(s[r, i]) - np.float64(w[wr, i])
            cnt = 1.0
            start = i
            # pool while the previous block's mean <= the current block's mean (+ tolerance)
            while nb > 0 and sums[nb - 1] / counts[nb - 1] <= acc / cnt + tol:
                nb -= 1
                acc += sums[nb]
                cnt += counts[nb]
                start = starts[nb]
            starts[nb] = start
            sums[nb] = acc
            counts[nb] = cnt
            nb += 1
        starts[nb] = n
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


@numba.njit(cache=True, nogil=True)
def pav_kl(s, w, out_mu, out_ids):  # type: ignore[no-untyped-def]
    rows, n = s.shape
    shared_w = w.shape[0] == 1
    starts = np.empty(n + 1, np.int64)
    lse_s = np.empty(n, np.float64)
    lse_w = np.empty(n, np.float64)
    for r in range(rows):
        wr = 0 if shared_w else r
        tol = tie_tolerance(s[r], w[wr])
        nb = 0
        for i in range(n):
            a = np.float64(s[r, i])
            c = np.float64(w[wr, i])
            start = i
            # pool while the previous block's value <= the current block's value (+ tolerance)
            while nb > 0 and lse_s[nb - 1] - lse_w[nb - 1] <= a - c + tol:
                nb -= 1
                a = _logaddexp(a, lse_s[nb])
                c = _logaddexp(c, lse_w[nb])
                start = starts[nb]
            starts[nb] = start
            lse_s[nb] = a
            lse_w[nb] = c
            nb += 1
        starts[nb] = n
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
