"""Exact pool-adjacent-violators (test reference, independent of the library's kernels).

Solves the decreasing isotonic regression of :mod:`rankwise.ops.isotonic` exactly for the given
float64 inputs: ``l2`` in integer arithmetic (every float64 is a dyadic rational, so all block sums
are exact after scaling by a common power of two); ``kl`` with ``mpmath`` at 192-bit precision
(block values compared as ratios of sums of exponentials, no rounding at the 1e-16 level). Blocks
are pooled when the left value is <= the right one (exact ties pooled, as torchsort does).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

#: working precision (bits) of the KL reference: rounding far below float64's 53 bits
_KL_PREC = 192


def _dyadic(values: np.ndarray) -> tuple[list[int], int]:
    """Integers ``k_i`` and a power of two ``D`` with ``values[i] == k_i / D`` exactly."""
    ratios = [float(v).as_integer_ratio() for v in values]
    den = max(d for _, d in ratios)
    return [n * (den // d) for n, d in ratios], den


def exact_pav(s: np.ndarray, w: np.ndarray, reg: str) -> tuple[np.ndarray, np.ndarray]:
    """Block ids (0-based, int64) and block values (float64, correctly rounded) of
    ``argmin_{v_1 >= ... >= v_n} sum_i loss(v_i; s_i, w_i)`` for one row."""
    s = np.asarray(s, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    n = len(s)
    starts: list[int] = []
    if reg == "l2":
        ks, ds = _dyadic(s)
        kw, dw = _dyadic(w)
        den = max(ds, dw)
        t = [a * (den // ds) - b * (den // dw) for a, b in zip(ks, kw)]
        sums: list[int] = []
        counts: list[int] = []
        for i in range(n):
            acc, cnt, start = t[i], 1, i
            # previous mean <= current mean  <=>  S_p * c <= S * c_p (counts > 0)
            while sums and sums[-1] * cnt <= acc * counts[-1]:
                acc += sums.pop()
                cnt += counts.pop()
                start = starts.pop()
            sums.append(acc)
            counts.append(cnt)
            starts.append(start)
        vals = [float(Fraction(a, c * den)) for a, c in zip(sums, counts)]
    elif reg == "kl":
        from mpmath import libmp  # mpmath ships with torch (via sympy)

        prec = _KL_PREC
        es = [libmp.mpf_exp(libmp.from_float(float(v)), prec) for v in s]
        ew = [libmp.mpf_exp(libmp.from_float(float(v)), prec) for v in w]
        ss: list = []
        sw: list = []
        for i in range(n):
            a, c, start = es[i], ew[i], i
            # lse(s_p) - lse(w_p) <= lse(s) - lse(w)  <=>  Es_p * Ew <= Es * Ew_p
            while ss and libmp.mpf_le(libmp.mpf_mul(ss[-1], c, prec), libmp.mpf_mul(a, sw[-1], prec)):
                a = libmp.mpf_add(a, ss.pop(), prec)
                c = libmp.mpf_add(c, sw.pop(), prec)
                start = starts.pop()
            ss.append(a)
            sw.append(c)
            starts.append(start)
        vals = [
            libmp.to_float(libmp.mpf_sub(libmp.mpf_log(a, prec), libmp.mpf_log(c, prec), prec), rnd=libmp.round_nearest)
            for a, c in zip(ss, sw)
        ]
    else:
        raise ValueError(reg)
    ids = np.empty(n, dtype=np.int64)
    v = np.empty(n, dtype=np.float64)
    bounds = [*starts, n]
    for b in range(len(starts)):
        ids[bounds[b] : bounds[b + 1]] = b
        v[bounds[b] : bounds[b + 1]] = vals[b]
    return ids, v
