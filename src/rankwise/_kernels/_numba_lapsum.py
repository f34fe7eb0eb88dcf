"""Numba kernels of LapSum (Struski et al., ICML 2025, "LapSum - One Method to Differentiate Them
All"): soft rank, soft sort and soft top-k of float32/float64 rows, forward and backward, one pass
per row after one sort, every intermediate in float64.

For the ascending slice :math:`y_0 \\le .. \\le y_{n-1}` (``y = -x`` for descending) with
:math:`E_m = e^{(y_m - y_{m+1})/\\alpha}`, the prefix and suffix sums
:math:`A_m = \\sum_{j \\le m} e^{(y_j - y_m)/\\alpha}` and :math:`B_m = \\sum_{j \\ge m} e^{(y_m - y_j)/\\alpha}`
follow from :math:`A_m = A_{m-1} E_{m-1} + 1`, :math:`B_m = B_{m+1} E_m + 1` (factors at most 1: no
overflow); :math:`G(y_m) = m + \\tfrac12 + (B_m - A_m)/2` (0-based). The inverse of :math:`G` on a
segment is the closed form of :func:`rankwise.ops.lapsum._inverse`. Gradients (``K(u) =
e^{-|u|/\\alpha}``):

* rank :math:`r_l = \\tfrac12 + \\sum_j F((y_l - y_j)/\\alpha)`:
  :math:`\\partial L/\\partial y_l = (g_l \\sum_j K(y_l - y_j) - \\sum_i g_i K(y_i - y_l)) / (2\\alpha)`,
  both sums by the same prefix/suffix recursions;
* sort :math:`s_i = G^{-1}(i + \\tfrac12)`: :math:`\\partial s_i / \\partial y_j = K(s_i - y_j) / Z_i`,
  :math:`Z_i = \\sum_l K(s_i - y_l)`, so :math:`\\partial L/\\partial y_j = \\sum_i (g_i / Z_i) K(s_i - y_j)`,
  by two sweeps over the merged ascending sequences ``s`` and ``y``;
* top-k :math:`p_j = F((t - y_j)/\\alpha)`, :math:`G(t) = k`: with :math:`f_j = K(t - y_j)/2`,
  :math:`\\partial L/\\partial y_l = (f_l/\\alpha) (\\sum_j g_j f_j / \\sum_j f_j - g_l)`.

A row holding a NaN or inf gets NaN values and a zero gradient (the operators' NaN policy).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from rankwise._kernels._numba_sort import sort_scratch, stable_order

__all__ = ["lapsum_backward", "lapsum_forward"]

RANK, SORT, TOPK = 0, 1, 2


@numba.njit(cache=True, nogil=True)
def _finite(row):  # type: ignore[no-untyped-def]
    for v in row:
        if not math.isfinite(v):
            return False
    return True


@numba.njit(cache=True, nogil=True)
def _sums(x_row, perm, sign, alpha, ys, e, a, b):  # type: ignore[no-untyped-def]
    """``ys`` = the ascending ``sign * x_row`` (order ``perm``), ``e``, ``a``, ``b``: ``E``, ``A``, ``B``."""
    n = x_row.shape[0]
    for m in range(n):
        ys[m] = sign * np.float64(x_row[perm[m]])
    for m in range(n - 1):
        e[m] = math.exp((ys[m] - ys[m + 1]) / alpha)
    a[0] = 1.0
    for m in range(1, n):
        a[m] = a[m - 1] * e[m - 1] + 1.0
    b[n - 1] = 1.0
    for m in range(n - 2, -1, -1):
        b[m] = b[m + 1] * e[m] + 1.0


@numba.njit(cache=True, nogil=True, inline="always")
def _knot(a, b, m):  # type: ignore[no-untyped-def]
    return m + 0.5 + 0.5 * (b[m] - a[m])


@numba.njit(cache=True, nogil=True)
def _inverse(ys, e, a, b, seg, w, alpha):  # type: ignore[no-untyped-def]
    """The solution ``t`` of ``G(t) = w`` on segment ``seg`` (``-1..n-1``, knots ``g_seg < w <=
    g_{seg+1}``) and ``Z = sum_l exp(-|t - y_l| / alpha)``."""
    n = ys.shape[0]
    lo = seg if seg > 0 else 0
    hi = seg + 1 if seg + 1 < n else n - 1
    r, s = ys[lo], ys[hi]
    p = a[lo] if seg >= 0 else 0.0
    q = b[hi] if seg <= n - 2 else 0.0
    pqe = p * q * e[lo] if hi > lo else 0.0
    d = w - (seg + 1)
    if d > 0:
        t = s - alpha * math.log(q) + alpha * math.log(d + math.sqrt(d * d + pqe))
    elif d < 0:
        t = r + alpha * math.log(p) - alpha * math.log(math.sqrt(d * d + pqe) - d)
    else:
        t = 0.5 * (r + s) + 0.5 * alpha * (math.log(p) - math.log(q))
    z = 0.0
    if p > 0:
        z += p * math.exp((r - t) / alpha)
    if q > 0:
        z += q * math.exp((t - s) / alpha)
    return t, z


@numba.njit(cache=True, nogil=True)
def _segment(a, b, w, start):  # type: ignore[no-untyped-def]
    """``searchsorted(knots, w, side="left") - 1``, scanning from segment ``start``."""
    n = a.shape[0]
    seg = start
    while seg + 1 < n and _knot(a, b, seg + 1) < w:
        seg += 1
    return seg


@numba.njit(cache=True, nogil=True)
def _threshold(ys, e, a, b, k, alpha):  # type: ignore[no-untyped-def]
    n = ys.shape[0]
    lo, hi = 0, n  # first knot >= k by bisection (knots increase)
    while lo < hi:
        mid = (lo + hi) // 2
        if _knot(a, b, mid) < k:
            lo = mid + 1
        else:
            hi = mid
    return _inverse(ys, e, a, b, lo - 1, k, alpha)


@numba.njit(cache=True, nogil=True, inline="always")
def _cdf(u):  # type: ignore[no-untyped-def]
    return 0.5 * math.exp(u) if u <= 0 else 1.0 - 0.5 * math.exp(-u)


@numba.njit(cache=True, nogil=True)
def lapsum_forward(x, kind, alpha, descending, k, out, perm):  # type: ignore[no-untyped-def]
    """``out[r]`` = LapSum's soft rank / sort / top-k (``kind`` 0/1/2) of every row of ``x`` (rows, n)
    and ``perm[r]`` its ascending order of ``sign * x[r]`` (for :func:`lapsum_backward`)."""
    rows, n = x.shape
    sign = -1.0 if descending else 1.0
    keys, tmp_keys, tmp_perm, hist = sort_scratch(n)
    ys, e, a, b = np.empty(n), np.empty(max(n - 1, 1)), np.empty(n), np.empty(n)
    for r in range(rows):
        if not _finite(x[r]):
            out[r, :] = np.nan
            for m in range(n):
                perm[r, m] = m
            continue
        stable_order(x[r], descending, perm[r], keys, tmp_keys, tmp_perm, hist)
        _sums(x[r], perm[r], sign, alpha, ys, e, a, b)
        if kind == RANK:
            for m in range(n):
                out[r, perm[r, m]] = m + 1.0 + 0.5 * (b[m] - a[m])
        elif kind == SORT:
            seg = -1
            for i in range(n):
                seg = _segment(a, b, i + 0.5, seg)
                t, _ = _inverse(ys, e, a, b, seg, i + 0.5, alpha)
                out[r, i] = sign * t
        else:
            t, _ = _threshold(ys, e, a, b, k, alpha)
            for j in range(n):
                out[r, j] = _cdf((t - sign * np.float64(x[r, j])) / alpha)


@numba.njit(cache=True, nogil=True)
def lapsum_backward(grad, x, perm, kind, alpha, descending, k, gx):  # type: ignore[no-untyped-def]
    """``gx[r]`` = the vector-Jacobian product of :func:`lapsum_forward`'s row ``r`` with ``grad[r]``
    (zero for rows holding a NaN or inf)."""
    rows, n = x.shape
    sign = -1.0 if descending else 1.0
    ys, e, a, b = np.empty(n), np.empty(max(n - 1, 1)), np.empty(n), np.empty(n)
    c, s, h = np.empty(n), np.empty(n), np.empty(n)
    for r in range(rows):
        if not _finite(x[r]):
            gx[r, :] = 0.0
            continue
        pr = perm[r]
        _sums(x[r], pr, sign, alpha, ys, e, a, b)
        if kind == RANK:
            # c: sum_{i<=l} g_i K(y_i - y_l); then the suffix part on the way back
            for m in range(n):
                gm = np.float64(grad[r, pr[m]])
                c[m] = gm if m == 0 else c[m - 1] * e[m - 1] + gm
            dsum = 0.0
            for m in range(n - 1, -1, -1):
                gm = np.float64(grad[r, pr[m]])
                dsum = gm if m == n - 1 else dsum * e[m] + gm
                gx[r, pr[m]] = sign * (gm * (a[m] + b[m]) - c[m] - dsum) / (2.0 * alpha)
        elif kind == SORT:
            seg = -1
            for i in range(n):
                seg = _segment(a, b, i + 0.5, seg)
                t, z = _inverse(ys, e, a, b, seg, i + 0.5, alpha)
                s[i] = t
                h[i] = sign * np.float64(grad[r, i]) / z  # dL/ds_i of the ascending sort (sign twice)
            # left sweep: sum over s_i <= y_j of h_i K(s_i - y_j)
            i, acc, pos = 0, 0.0, 0.0
            for j in range(n):
                while i < n and s[i] <= ys[j]:
                    acc = (acc * math.exp((pos - s[i]) / alpha) if i > 0 else 0.0) + h[i]
                    pos = s[i]
                    i += 1
                if i > 0:
                    acc *= math.exp((pos - ys[j]) / alpha)
                    pos = ys[j]
                c[j] = acc
            # right sweep: s_i > y_j
            i, acc, pos, started = n - 1, 0.0, 0.0, False
            for j in range(n - 1, -1, -1):
                while i >= 0 and s[i] > ys[j]:
                    acc = (acc * math.exp((s[i] - pos) / alpha) if started else 0.0) + h[i]
                    pos = s[i]
                    started = True
                    i -= 1
                if started:
                    acc *= math.exp((ys[j] - pos) / alpha)
                    pos = ys[j]
                gx[r, pr[j]] = sign * (c[j] + acc)
        else:
            t, _ = _threshold(ys, e, a, b, k, alpha)
            fsum, gf = 0.0, 0.0
            for j in range(n):
                f = 0.5 * math.exp(-abs(t - sign * np.float64(x[r, j])) / alpha)
                fsum += f
                gf += np.float64(grad[r, j]) * f
            ratio = gf / fsum
            for j in range(n):
                f = 0.5 * math.exp(-abs(t - sign * np.float64(x[r, j])) / alpha)
                gx[r, j] = sign * (f / alpha) * (ratio - np.float64(grad[r, j]))
