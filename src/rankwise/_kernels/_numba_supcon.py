r"""Numba kernel of the small-batch SupCon path (:class:`rankwise.losses._supcon._SupConOutSmall`, CPU).

At small batches (``B V <= 512``) the one-pass path costs about 40 small torch ops besides its two
matrix products, and their fixed cost dominates. This kernel does, in one call, everything between
the softmax and the gradient matmul: the per-sample positive counts and weights, the loss value and
the logit gradient :math:`W = g P - T` (in place of the softmax), or for ``va == V`` the symmetric
:math:`W + W^\top` the gradient matmul needs. Positives are visited through a list of each sample's
positive samples (one scan of the mask), so the work besides the dense ``g P`` pass grows with the
number of positives, not with ``N^2`` per anchor; :math:`W + W^\top` is a row and column scaling
when the logits are symmetric and no probability underflows (``out=3``), else a pass over
cache-sized tiles. Accumulation is in float64.

Importing this module raises ``ImportError`` when numba is unavailable; the caller then uses the
torch ops (same values up to float rounding).
"""

from __future__ import annotations

import math

import numba
import numpy as np

__all__ = ["normalize_rows", "normalize_rows_backward", "supcon_out"]

#: Side of the square tiles of the symmetric pass (two 16 x 16 float64 tiles fit in L1 many times).
_TILE = 16
#: Below this probability a positive's log-sum-exp is taken from the row's maximum instead
#: (float32's smallest normal number is 1.2e-38; the relative precision is kept above it).
_TINY = 1e-30


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _row_lse(row, p, a0):  # type: ignore[no-untyped-def]
    """Log-sum-exp of a logit row from its softmax ``p``: ``row[a0] - log(p[a0])`` when that
    probability is at least ``_TINY``, else from the row's maxima (the largest probability is
    ``exp(top - lse)``)."""
    if a0 >= 0 and p[a0] >= _TINY:
        return row[a0] - math.log(p[a0])
    top = -np.inf
    p_max = 0.0
    for a in range(row.shape[0]):
        if row[a] > top:
            top = row[a]
        if p[a] > p_max:
            p_max = p[a]
    return top - math.log(p_max)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def supcon_out(prob, logits, mask, v, va, scale, out):  # type: ignore[no-untyped-def]
    r"""Loss value of SupCon ``variant="out"``; for ``out > 0`` ``prob`` is overwritten with the
    logit gradient.

    ``logits`` (m, n): anchor ``i`` (sample ``i // va``, view ``i % va``) against every view
    ``a`` (sample ``a // v``, view ``a % v``), ``m = b va``, ``n = b v``, the anchor's own entry set
    far below the others; ``prob`` (m, n): their row softmax (own entry 0); ``mask`` (b, b): bool or 0/1
    positive samples (its diagonal: whether a sample's other views are positives); ``scale``:
    ``tau / tau_b``. With :math:`|P(i)| = V \sum_j mask_{sj} - mask_{ss}`, ``c = scale / (va
    \cdot \#\{s: |P(s)| > 0\})``, :math:`g_i = c` for an anchor with a positive (else 0) and
    :math:`T_{ia} = h_i = g_i / |P(i)|` on its positives, the value is
    :math:`\sum_i g_i \operatorname{lse}_i - \sum_{ia} T_{ia} s_{ia}`. ``out``: 0 leaves ``prob``
    as it is (value only), 1 makes it :math:`W = g P - T`, 2 :math:`W + W^\top` (``va == v``) by
    a tiled transpose, 3 the same by row and column scaling, valid when the logits are symmetric
    (``va == v``) and no probability underflows (the caller's condition): then
    :math:`P_{ji} = P_{ij} e^{\operatorname{lse}_i - \operatorname{lse}_j}`.

    The log-sum-exp of a row is :math:`s_{ia} - \log P_{ia}` at its most probable positive (one log
    per anchor), or from the row's maxima when that probability is below ``_TINY``.
    """
    b = mask.shape[0]
    n = b * v
    m = b * va
    # the positive samples of each sample, as a list (CSR)
    start = np.empty(b + 1, dtype=np.int64)
    pos = np.empty(b * b, dtype=np.int64)
    npos = np.empty(b, dtype=np.float64)
    valid = 0
    k = 0
    for s in range(b):
        start[s] = k
        for j in range(b):
            if mask[s, j] != 0.0:
                pos[k] = j
                k += 1
        npos[s] = (k - start[s]) * v - (1.0 if mask[s, s] != 0.0 else 0.0)
        if npos[s] > 0.0:
            valid += 1
    start[b] = k
    c = scale / (va * max(valid, 1))
    g = np.empty(m, dtype=np.float64)
    lses = np.zeros(m, dtype=np.float64)  # rows without a positive: read by out == 3 only
    total = 0.0
    for i in range(m):
        s = i // va
        if npos[s] == 0.0:  # no positive: out of the mean, no gradient
            g[i] = 0.0
            if out == 3:
                a0 = 1 if i == 0 else 0  # any column but the own one
                lses[i] = _row_lse(logits[i], prob[i], a0)
            continue
        g[i] = c
        row = logits[i]
        p = prob[i]
        own = s * v + i - s * va  # the anchor's own column: view i % va of sample s
        pos_sum = 0.0
        best = -1  # the most probable positive
        for q in range(start[s], start[s + 1]):
            j0 = pos[q] * v
            for a in range(j0, j0 + v):
                if a != own:
                    pos_sum += row[a]
                    if best < 0 or p[a] > p[best]:
                        best = a
        lses[i] = _row_lse(row, p, best)
        total += c * lses[i] - (c / npos[s]) * pos_sum
    if out == 0:
        return total
    if out == 1:
        for i in range(m):
            gi = g[i]
            p = prob[i]
            for a in range(n):
                p[a] *= gi
    elif out == 3:  # P_ji = P_ij exp(lse_i - lse_j) for symmetric logits: row and column scaling
        ref = lses.max()
        gd = np.empty(m, dtype=prob.dtype)  # in prob's dtype: the loop vectorizes
        ed = np.empty(m, dtype=prob.dtype)
        ud = np.empty(m, dtype=prob.dtype)
        for i in range(m):
            e = math.exp(lses[i] - ref)  # in (0, 1]
            gd[i] = g[i]
            ed[i] = e
            ud[i] = g[i] / e
        for i in range(n):
            gi = gd[i]
            ei = ed[i]
            p = prob[i]
            for j in range(n):
                p[j] *= gi + ei * ud[j]
    else:  # g_i P_ij + g_j P_ji, tile by tile (the own entries, the diagonal, are 0)
        for i0 in range(0, n, _TILE):
            i1 = min(i0 + _TILE, n)
            for j0 in range(i0, n, _TILE):
                j1 = min(j0 + _TILE, n)
                for i in range(i0, i1):
                    gi = g[i]
                    for j in range(max(j0, i), j1):
                        t = gi * prob[i, j] + g[j] * prob[j, i]
                        prob[i, j] = t
                        prob[j, i] = t
    for i in range(m):  # - T (and - T^T)
        s = i // va
        if npos[s] == 0.0:
            continue
        h = c / npos[s]
        own = s * v + i - s * va
        for q in range(start[s], start[s + 1]):
            j0 = pos[q] * v
            for a in range(j0, j0 + v):
                if a != own:
                    prob[i, a] -= h
                    if out >= 2:
                        prob[a, i] -= h
    return total


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})
def normalize_rows(x, inv_tau, z, zs, norm):  # type: ignore[no-untyped-def]
    """Row normalization of the float32 (n, d) views ``x`` in one pass per row: ``norm`` (n, 1) the L2
    norms, their squares accumulated in float64 (the square of any finite float32, 3.4e38 or 1e-45,
    is a normal float64: no overflow or underflow), an all-zero row's norm set to ``inf``;
    ``z = x / norm`` (an all-zero row stays 0) and ``zs = z * inv_tau``, in float32 as the torch ops.
    (``reassoc``: the float64 sum may be vectorized, i.e. added in another order.)"""
    n, d = x.shape
    scale = np.float32(inv_tau)
    for i in range(n):
        s = 0.0
        for j in range(d):
            t = np.float64(x[i, j])
            s += t * t
        r = np.float32(math.sqrt(s))
        if r == 0:
            r = np.float32(np.inf)
        norm[i, 0] = r
        for j in range(d):
            q = x[i, j] / r
            z[i, j] = q
            zs[i, j] = q * scale


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})
def normalize_rows_backward(grad, z, norm):  # type: ignore[no-untyped-def]
    """In place, the gradient ``grad`` (n, d) on the normalized rows ``z = x / norm`` taken through the
    normalization: ``(grad - z (z . grad)) / norm`` (0 for an all-zero row, whose norm is ``inf``); the
    row dot product accumulated in float64 (``reassoc``: in any order), the rest in float32."""
    n, d = grad.shape
    for i in range(n):
        s = 0.0
        for j in range(d):
            s += np.float64(z[i, j]) * np.float64(grad[i, j])
        along = np.float32(s)
        r = norm[i, 0]
        for j in range(d):
            grad[i, j] = (grad[i, j] - z[i, j] * along) / r
