r"""Numba kernel of the small-batch SupCon path (:class:`rankwise.losses._supcon._SupConOutSmall`, CPU).

At small batches (``B V <= 256``) the one-pass path costs about 40 small torch ops besides its two
matrix products, and their fixed cost dominates. This kernel does, in one call, everything between
the softmax and the gradient matmul: the per-sample positive counts and weights, the log-sum-exps,
the loss value and the logit gradient :math:`W = g P - T` (in place of the softmax), and for
``va == V`` the symmetric :math:`W + W^\top` the gradient matmul needs. Accumulation is in float64.

Importing this module raises ``ImportError`` when numba is unavailable; the caller then uses the
torch ops (same values up to float rounding).
"""

from __future__ import annotations

import math

import numba
import numpy as np

__all__ = ["supcon_out"]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def supcon_out(prob, logits, mask, v, va, scale, symmetrize):  # type: ignore[no-untyped-def]
    r"""Loss value of SupCon ``variant="out"``; ``prob`` is overwritten with the logit gradient.

    ``logits`` (m, n): anchor ``i`` (sample ``i // va``, view ``i % va``) against every view
    ``a`` (sample ``a // v``, view ``a % v``), ``m = b va``, ``n = b v``, the anchor's own entry set
    far below the others; ``prob`` (m, n): their row softmax (own entry 0); ``mask`` (b, b): 0/1
    positive samples (its diagonal: whether a sample's other views are positives); ``scale``:
    ``tau / tau_b``. With :math:`|P(i)| = V \sum_j mask_{sj} - mask_{ss}`, ``c = scale / (va
    \cdot \#\{s: |P(s)| > 0\})``, :math:`g_i = c` for an anchor with a positive (else 0) and
    :math:`T_{ia} = g_i / |P(i)|` on its positives, the value is
    :math:`\sum_i g_i \operatorname{lse}_i - \sum_{ia} T_{ia} s_{ia}` and ``prob`` becomes
    :math:`W = g P - T` (``symmetrize``: :math:`W + W^\top`, square ``prob`` only).
    """
    b = mask.shape[0]
    n = b * v
    npos = np.empty(b, dtype=np.float64)
    valid = 0
    for s in range(b):
        row_sum = 0.0
        for j in range(b):
            row_sum += mask[s, j]
        npos[s] = row_sum * v - mask[s, s]
        if npos[s] > 0.0:
            valid += 1
    c = scale / (va * max(valid, 1))
    total = 0.0
    for i in range(b * va):
        s = i // va
        p = prob[i]
        if npos[s] == 0.0:  # no positive: out of the mean, no gradient
            for a in range(n):
                p[a] = 0.0
            continue
        row = logits[i]
        top = -np.inf
        p_max = 0.0
        for a in range(n):
            if row[a] > top:
                top = row[a]
            if p[a] > p_max:
                p_max = p[a]
        lse = top - math.log(p_max)  # the largest probability is exp(top - lse)
        for a in range(n):
            p[a] *= c
        h = c / npos[s]
        own = s * v + i - s * va  # the anchor's own column: view i % va of sample s
        pos_sum = 0.0
        for j in range(b):
            if mask[s, j] != 0.0:
                for a in range(j * v, j * v + v):
                    if a != own:
                        pos_sum += row[a]
                        p[a] -= h
        total += c * lse - h * pos_sum
    if symmetrize:
        for i in range(n):
            prob[i, i] *= 2.0
            for j in range(i + 1, n):
                t = prob[i, j] + prob[j, i]
                prob[i, j] = t
                prob[j, i] = t
    return total
