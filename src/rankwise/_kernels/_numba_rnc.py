r"""Numba kernels of Rank-N-Contrast (Zha et al., NeurIPS'23) on CPU: per anchor, the other views in
decreasing label distance (a merge of two label-sorted runs), and the running log-sum-exps of the
sorted similarities with their analytic gradient (one pass per row each).

Importing this module raises ``ImportError`` when numba is unavailable (the kernel layer then serves
the torch path).
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["rnc_backward", "rnc_forward", "rnc_order"]


@numba.njit(cache=True, nogil=True)
def _sort_group(cols, count):  # type: ignore[no-untyped-def]
    """Sort ``cols[:count]`` in place (column order inside a group of equal distances)."""
    if count > 16:
        cols[:count].sort()
        return
    for t in range(1, count):
        c = cols[t]
        u = t - 1
        while u >= 0 and cols[u] > c:
            cols[u + 1] = cols[u]
            u -= 1
        cols[u + 1] = c


@numba.njit(cache=True, nogil=True)
def rnc_order(y_rows, y, self_cols, srt, order, gend):  # type: ignore[no-untyped-def]
    """Every anchor's other views by decreasing label distance ``|y_r - y_k|`` (the order of a stable
    descending sort: NaN first, ties in column order) into ``order[r]``, and for every position the
    position of the last member of its group of equal distances into ``gend[r]`` (a NaN distance
    equals nothing: a group of its own).

    ``srt``: all columns sorted by ``y`` (stable, NaN labels last). The distances of one row are
    largest at both ends of ``srt``: the walk takes the larger end, a group of equal distances at
    a time.
    """
    rows = y_rows.shape[0]
    n = y.shape[0]
    cols = np.empty(n, np.int64)
    for r in range(rows):
        yr = y_rows[r]
        me = self_cols[r]
        q = 0
        for j in range(n):  # NaN distances first, in column order, each its own group (NaN != NaN)
            if j != me and np.isnan(abs(yr - y[j])):
                order[r, q] = j
                gend[r, q] = q
                q += 1
        left, right = 0, n - 1
        while True:
            while left <= right and (srt[left] == me or np.isnan(abs(yr - y[srt[left]]))):
                left += 1
            while right >= left and (srt[right] == me or np.isnan(abs(yr - y[srt[right]]))):
                right -= 1
            if left > right:
                break
            d = max(abs(yr - y[srt[left]]), abs(yr - y[srt[right]]))
            count = 0
            while left <= right and (srt[left] == me or abs(yr - y[srt[left]]) == d):
                if srt[left] != me:
                    cols[count] = srt[left]
                    count += 1
                left += 1
            while right >= left and (srt[right] == me or abs(yr - y[srt[right]]) == d):
                if srt[right] != me:
                    cols[count] = srt[right]
                    count += 1
                right -= 1
            _sort_group(cols, count)
            for t in range(count):
                order[r, q + t] = cols[t]
                gend[r, q + t] = q + count - 1
            q += count


@numba.njit(cache=True, nogil=True)
def rnc_forward(s, order, gend, lcse):  # type: ignore[no-untyped-def]
    r"""Sum over anchors ``r`` and positives ``j`` of ``log sum_{k in S_rj} exp(s[r, k]) - s[r, j]``.

    ``S_rj`` is the prefix of ``order[r]`` up to the end of ``j``'s group. A running log-sum-exp
    (float64, rescaled when the maximum grows) walks each row once; ``lcse[r, p]`` receives the
    value at the end of position ``p``'s group (for backward)."""
    rows, m = order.shape
    total = 0.0
    for r in range(rows):
        mx = -np.inf
        sm = 0.0
        start = 0
        for p in range(m):
            v = np.float64(s[r, order[r, p]])
            if v > mx:
                sm = sm * np.exp(mx - v) + 1.0
                mx = v
            elif v > -np.inf or v != v:  # NaN propagates
                sm += np.exp(v - mx)
            if gend[r, p] == p:
                value = mx + np.log(sm)
                for t in range(start, p + 1):
                    lcse[r, t] = value
                    total += value - np.float64(s[r, order[r, t]])
                start = p + 1
    return total


@numba.njit(cache=True, nogil=True)
def rnc_backward(s, order, gend, lcse, grad):  # type: ignore[no-untyped-def]
    r"""``grad[r, k] = d total / d s[r, k] = exp(s[r, k]) * sum_{j: k in S_rj} exp(-lcse_rj) - 1``
    (0 for the anchor's own column). Walking the groups from the last, the sum over ``j`` is a
    running log-sum-exp of ``-lcse`` over the groups at or after ``k``'s."""
    rows, m = order.shape
    for r in range(rows):
        for k in range(grad.shape[1]):
            grad[r, k] = 0.0
        log_r = -np.inf
        end = m - 1
        while end >= 0:
            start = end
            while start > 0 and gend[r, start - 1] == end:
                start -= 1
            t = np.log(np.float64(end - start + 1)) - lcse[r, end]
            if log_r == -np.inf:
                log_r = t
            elif t > log_r:
                log_r = t + np.log1p(np.exp(log_r - t))
            else:
                log_r = log_r + np.log1p(np.exp(t - log_r))
            for p in range(start, end + 1):
                k = order[r, p]
                grad[r, k] = np.exp(np.float64(s[r, k]) + log_r) - 1.0
            end = start - 1
