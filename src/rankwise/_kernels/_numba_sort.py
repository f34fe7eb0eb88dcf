"""Numba stable row sort of float32 rows (CPU): an LSD radix sort of the float bits (insertion sort
for short rows), exactly ``torch.sort(stable=True)``'s order (NaN above +inf, -0.0 equal to +0.0),
linear in n. Shared by the row sort of :func:`rankwise.ops._sort.sort_last` and the fused isotonic
kernels (:mod:`rankwise._kernels._numba_isotonic`).

Importing this module raises ``ImportError`` when numba is unavailable.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import carray

from rankwise._kernels._numba_util import TASK_ARGS, f32p, i64p, next_chunk, task

__all__ = ["SORT_ROWS", "sort_rows", "sort_rows_task", "stable_order"]

#: float32 rows up to this length are sorted by insertion (fewer steps than the radix passes' buckets)
_INSERTION_MAX_N = 64
#: float32 rows from this length on are sorted with 11-bit digits (3 passes), shorter ones with 8-bit digits
_RADIX11_MIN_N = 8192


@numba.njit(cache=True, nogil=True)
def sort_scratch(n):  # type: ignore[no-untyped-def]
    """Scratch arrays of :func:`descending_order` for rows of length ``n``: keys, their copy (uint32),
    a permutation buffer (int64) and the radix histograms (4 passes of up to 2^11 buckets)."""
    return np.empty(n, np.uint32), np.empty(n, np.uint32), np.empty(n, np.int64), np.empty(4 << 11, np.int64)


@numba.njit(cache=True, nogil=True, inline="always")
def _sort_key(b, flip):  # type: ignore[no-untyped-def]
    """uint32 key of float32 bits ``b`` whose ascending order is the order of ``torch.sort``: -0.0
    and +0.0 equal, every NaN equal and above +inf; ``flip`` = ``0xFFFFFFFF`` reverses it
    (descending: NaN first), 0 keeps it. The sign is applied without a branch (random signs would
    mispredict): positives get the top bit set, negatives all bits inverted."""
    a = b & np.uint32(0x7FFFFFFF)
    if a == 0:
        b = np.uint32(0)  # -0.0 -> +0.0
    k = b ^ (np.uint32(0) - (b >> np.uint32(31)) | np.uint32(0x80000000))
    if a > np.uint32(0x7F800000):  # NaN
        k = np.uint32(0xFFFFFFFF)
    return np.uint32(k ^ flip)


@numba.njit(cache=True, nogil=True)
def stable_order(z_row, descending, perm_row, keys, tmp_keys, tmp_perm, hist):  # type: ignore[no-untyped-def]
    """``perm_row`` = the stable order of ``z_row`` (ties in index order), exactly
    ``torch.sort(z_row, descending=descending, stable=True).indices``. float32: insertion sort of
    uint32 keys (:func:`_sort_key`) for short rows, else an LSD radix sort of the keys (8-bit
    digits, 11-bit for long rows; a pass whose digit is the same for every key is skipped);
    float64: numba's merge sort (finite values)."""
    n = z_row.shape[0]
    if z_row.itemsize != 4:
        perm_row[:] = np.argsort(-z_row if descending else z_row, kind="mergesort")
        return
    u = z_row.view(np.uint32)
    flip = np.uint32(0xFFFFFFFF) if descending else np.uint32(0)
    if n <= _INSERTION_MAX_N:
        for i in range(n):
            k = _sort_key(u[i], flip)
            j = i
            while j > 0 and keys[j - 1] > k:
                keys[j] = keys[j - 1]
                perm_row[j] = perm_row[j - 1]
                j -= 1
            keys[j] = k
            perm_row[j] = i
        return
    bits = 11 if n >= _RADIX11_MIN_N else 8
    passes = (32 + bits - 1) // bits
    buckets = 1 << bits
    mask = np.uint32(buckets - 1)
    hist[: passes * buckets] = 0
    for i in range(n):
        k = _sort_key(u[i], flip)
        keys[i] = k
        for d in range(passes):
            hist[d * buckets + ((k >> np.uint32(d * bits)) & mask)] += 1
    src_k, dst_k, src_p, dst_p = keys, tmp_keys, perm_row, tmp_perm
    first = True
    done = 0
    for d in range(passes):
        base = d * buckets
        shift = np.uint32(d * bits)
        if hist[base + ((src_k[0] >> shift) & mask)] == n:
            continue  # every key has this digit
        total = 0
        for j in range(buckets):
            c = hist[base + j]
            hist[base + j] = total
            total += c
        for i in range(n):
            k = src_k[i]
            slot = base + ((k >> shift) & mask)
            pos = hist[slot]
            hist[slot] = pos + 1
            dst_k[pos] = k
            dst_p[pos] = i if first else src_p[i]
        first = False
        done += 1
        src_k, dst_k, src_p, dst_p = dst_k, src_k, dst_p, src_p
    if first:  # all keys equal
        for i in range(n):
            perm_row[i] = i
    elif done % 2 == 1:  # the result is in tmp_perm
        perm_row[:] = tmp_perm


@numba.njit(cache=True, nogil=True)
def descending_order(z_row, perm_row, keys, tmp_keys, tmp_perm, hist):  # type: ignore[no-untyped-def]
    """``perm_row`` = the stable descending order of ``z_row``, as ``torch.sort`` (see
    :func:`stable_order`; the soft operators' rows are finite, NaN rows are overwritten by the
    caller)."""
    stable_order(z_row, True, perm_row, keys, tmp_keys, tmp_perm, hist)


@numba.njit(cache=True, nogil=True)
def sort_rows(z, descending, perm):  # type: ignore[no-untyped-def]
    """``perm[r]`` = ``torch.sort(z[r], descending=descending, stable=True).indices`` for every
    row of the float32 (rows, n) array ``z`` (NaN, +-inf and +-0.0 ordered as torch orders them):
    one LSD radix sort per row, linear in n (:func:`stable_order`)."""
    keys, tmp_keys, tmp_perm, hist = sort_scratch(z.shape[1])
    for r in range(z.shape[0]):
        stable_order(z[r], descending, perm[r], keys, tmp_keys, tmp_perm, hist)


def sort_rows_task(data):  # type: ignore[no-untyped-def]
    """args[4:7]: z (float32), perm, descending (:func:`sort_rows` on a chunk of rows)."""
    a = carray(i64p(data), TASK_ARGS)
    rows, n, chunks = a[2], a[3], a[1]
    z = carray(f32p(a[4]), (rows, n))
    perm = carray(i64p(a[5]), (rows, n))
    descending = a[6] != 0
    while True:
        c = next_chunk(i64p(data))
        if c >= chunks:
            break
        r0, r1 = c * rows // chunks, (c + 1) * rows // chunks
        sort_rows(z[r0:r1], descending, perm[r0:r1])


#: address of :func:`sort_rows_task` as a C callback for the dispatcher
SORT_ROWS = task(sort_rows_task)
