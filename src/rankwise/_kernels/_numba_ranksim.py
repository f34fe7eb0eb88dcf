r"""Numba kernel for RankSim's label ranks (CPU): O(B) per row after one O(B log B) sort, not a sort per row.

For every anchor label :math:`y_r` and the batch labels :math:`y_j` it writes the ordinal ranks that
``rankwise.rank(v, descending=True)`` gives the row :math:`v_j = -|y_r - y_j|` (computed in the
dtype of ``y``), with the columns ``keep[j] == False`` set to :math:`-\infty` first, exactly:

* larger :math:`v` first, i.e. smaller label distance :math:`d_j = |y_r - y_j|` first;
* ties (equal :math:`d`, -0.0 equal to 0.0) in column order (the stable sort);
* NaN before everything (``torch.sort`` orders NaN above +inf), the :math:`-\infty` entries (kept
  columns with :math:`d = +\infty` and the masked columns) last.

With the kept columns sorted by label (``order``), the distances of one row are non-increasing to
the left of the row's own label and non-decreasing to its right (rounding is monotone), so the
row's order is a merge of two sorted runs: a linear walk, where each group of equal distances is
put in column order. Importing this module raises ``ImportError`` when numba is unavailable; the
caller then ranks with ``torch``.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["label_distance_ranks"]


@numba.njit(cache=True, nogil=True)
def _emit(out, r, cols, count, pos):  # type: ignore[no-untyped-def]
    """Give ``cols[:count]`` (a group of equal distances) the ranks ``pos, pos + 1, ...`` in column order."""
    if count > 16:
        cols[:count].sort()
    else:  # insertion sort: groups are mostly one column, or two mirrored around the row's label
        for t in range(1, count):
            c = cols[t]
            u = t - 1
            while u >= 0 and cols[u] > c:
                cols[u + 1] = cols[u]
                u -= 1
            cols[u + 1] = c
    for t in range(count):
        out[r, cols[t]] = pos + t
    return pos + count


@numba.njit(cache=True, nogil=True)
def label_distance_ranks(y_rows, y, keep, order, out):  # type: ignore[no-untyped-def]
    """``out[r, j]``: rank (1-based) of column ``j`` in row ``r``; ``order``: the kept columns sorted
    by ``y`` (stable, NaN labels last)."""
    rows = y_rows.shape[0]
    b = y.shape[0]
    k = order.shape[0]
    ys = np.empty(k, y.dtype)  # kept labels in sorted order
    all_finite = True
    for p in range(k):
        ys[p] = y[order[p]]
        all_finite = all_finite and np.isfinite(ys[p])
    masked = np.empty(b - k, np.int64)  # masked columns, in column order
    count = 0
    for j in range(b):
        if not keep[j]:
            masked[count] = j
            count += 1
    dist = np.empty(k, y.dtype)
    cols = np.empty(b, np.int64)
    for r in range(rows):
        yr = y_rows[r]
        pos = 1
        plain = all_finite and np.isfinite(yr)
        if not plain:  # 1. NaN distances (a NaN label on either side, or the same infinity), in column order
            count = 0
            for j in range(b):
                if keep[j] and np.isnan(abs(yr - y[j])):
                    cols[count] = j
                    count += 1
            pos = _emit(out, r, cols, count, pos)
        # 2. merge the run left of the row's label (walked right to left) and the run right of it;
        #    NaN distances are skipped (emitted above), an infinite distance ends the walk
        lo, hi = 0, k  # first position whose label is not < yr (NaN labels count as not smaller)
        while lo < hi:
            mid = (lo + hi) // 2
            if ys[mid] < yr:
                lo = mid + 1
            else:
                hi = mid
        for p in range(k):
            dist[p] = abs(yr - ys[p])
        left, right = lo - 1, lo
        while True:
            if not plain:
                while left >= 0 and np.isnan(dist[left]):
                    left -= 1
                while right < k and np.isnan(dist[right]):
                    right += 1
            if left >= 0:
                d = dist[left]
                if right < k and dist[right] < d:
                    d = dist[right]
            elif right < k:
                d = dist[right]
            else:
                break
            if d == np.inf:
                break
            count = 0
            while left >= 0 and dist[left] == d:
                cols[count] = order[left]
                count += 1
                left -= 1
            while right < k and dist[right] == d:
                cols[count] = order[right]
                count += 1
                right += 1
            pos = _emit(out, r, cols, count, pos)
        # 3. -inf: the kept columns at an infinite distance and the masked columns, in column order
        if left < 0 and right >= k:
            for t in range(masked.shape[0]):
                out[r, masked[t]] = pos + t
        else:
            count = 0
            for j in range(b):
                if not keep[j] or abs(yr - y[j]) == np.inf:
                    cols[count] = j
                    count += 1
            _emit(out, r, cols, count, pos)


# --------------------------------------------------------------------------------------------------
# Rank-N-Contrast
# --------------------------------------------------------------------------------------------------
