r"""Numba kernels of the listwise learning-to-rank losses ListNet and ListMLE (CPU): the value and the
gradient of each list in one pass over its row, rows in parallel.

These losses are memory-bound and their lists short: the torch formulation costs a dozen small
ops (masks, two masked softmaxes, a log, a reverse cumulative sum, their backward), whose fixed
cost dominates at ``n = 10``. Here one call reads the scores and labels once per row and writes
the gradient of the mean over the lists (scaled by ``scale``, the caller's ``-1 / B`` or ``1 / B``),
so the backward is one multiplication by the incoming gradient. Sums and the softmax / cumulative
sums are accumulated in float64, whatever the dtype of the rows.

* :func:`listnet_rows` -- ListNet (Cao et al., ICML 2007): ``-sum_i q_i log(s_i + eps)`` with
  ``s = softmax(p)``, ``q = softmax(t)`` over the real slots (``t != ind``); gradient
  ``-(u - s sum(u))``, ``u = q s / (s + eps)``.
* :func:`listmle_rows` -- ListMLE (Xia et al., ICML 2008): with the row's slots in the caller's
  ``order`` (labels descending after allRank's shuffle), ``z = p - max p`` over the real slots and
  ``T_i = sum_{j >= i} exp(z_j)``: ``sum_i log(T_i + eps) - z_i``; gradient
  ``exp(z_k) sum_{i <= k} 1 / (T_i + eps) - 1`` and minus the row's sum of it to the arg-max (the
  path through the max, as autograd takes it).

A list without a real slot adds 0 and gets a zero gradient. Importing this module raises
``ImportError`` when numba is unavailable (the losses then take their torch path).
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import carray

from rankwise._kernels._numba_util import TASK_ARGS, f32p, f64p, i64p, next_chunk, task

__all__ = ["LISTMLE_ROWS", "LISTNET_ROWS", "listmle_rows", "listnet_rows"]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def listnet_rows(p, t, ind, eps, scale, grad, need_grad):  # type: ignore[no-untyped-def]
    """Sum over the rows of ``-sum_i q_i log(s_i + eps)``; with ``need_grad`` ``grad`` (the shape and
    dtype of ``p``) receives ``scale * -(u - s sum(u))`` (0 in the padded slots and dead lists).

    ``s``: the softmax of ``p`` over the slots with ``t != ind`` (0 when every real score is -inf);
    ``q``: that of ``t`` (0, the list adding nothing, when there is no real slot or every real
    label is -inf). With ``eps == 0`` a padded slot adds nothing (not ``0 * log 0``)."""
    rows, n = p.shape
    es = np.empty(n, np.float64)  # exp(p - max p), then s
    eq = np.empty(n, np.float64)  # exp(t - max t), then u
    total = 0.0
    for r in range(rows):
        mp = -np.inf
        mt = -np.inf
        alive = False
        for i in range(n):
            if t[r, i] != ind:
                alive = True
                if p[r, i] > mp:
                    mp = np.float64(p[r, i])
                if t[r, i] > mt:
                    mt = np.float64(t[r, i])
        if not alive or mt == -np.inf:  # q = 0: the list adds 0
            if need_grad:
                for i in range(n):
                    grad[r, i] = 0.0
            continue
        sp = 0.0
        st = 0.0
        for i in range(n):
            if t[r, i] != ind:
                e = math.exp(p[r, i] - mp) if mp > -np.inf else 0.0
                es[i] = e
                sp += e
                e = math.exp(t[r, i] - mt)
                eq[i] = e
                st += e
            else:
                es[i] = 0.0
                eq[i] = 0.0
        inv_p = 1.0 / sp if sp > 0.0 else 0.0
        inv_t = 1.0 / st
        row = 0.0
        su = 0.0
        for i in range(n):
            if t[r, i] != ind:
                s = es[i] * inv_p
                q = eq[i] * inv_t
                d = s + eps
                row -= q * math.log(d)
                ui = q * s / d
                es[i] = s
                eq[i] = ui
                su += ui
        total += row
        if need_grad:
            for i in range(n):
                grad[r, i] = scale * (eq[i] - es[i] * su)
    return total


@numba.njit(cache=True, nogil=True, error_model="numpy")
def listmle_rows(p, order, t, ind, eps, scale, grad, need_grad):  # type: ignore[no-untyped-def]
    """Sum over the rows of ``sum_i log(T_i + eps) - z_i`` over the real slots of ``p[r, order[r]]``
    (a slot is real where ``t != ind``); with ``need_grad`` ``grad`` (the shape and dtype of ``p``,
    in the slots of ``p``) receives ``scale`` times its gradient."""
    rows, n = p.shape
    ex = np.empty(n, np.float64)
    den = np.empty(n, np.float64)
    gz = np.empty(n, np.float64)
    total = 0.0
    for r in range(rows):
        top = -np.inf
        arg = -1
        for i in range(n):
            k = order[r, i]
            if t[r, k] != ind and p[r, k] > top:
                top = np.float64(p[r, k])
                arg = i
        if arg < 0:  # no real slot (or every real score -inf: the value is inf or NaN either way)
            top = 0.0
        tail = 0.0
        for i in range(n - 1, -1, -1):
            k = order[r, i]
            if t[r, k] != ind:
                e = math.exp(p[r, k] - top)
                ex[i] = e
                tail += e
                den[i] = tail + eps
            else:
                ex[i] = -1.0  # marks a padded slot
        row = 0.0
        acc = 0.0
        gsum = 0.0
        for i in range(n):
            if ex[i] >= 0.0:
                k = order[r, i]
                row += math.log(den[i]) - (p[r, k] - top)
                acc += 1.0 / den[i]
                g = ex[i] * acc - 1.0
                gz[i] = g
                gsum += g
            else:
                gz[i] = 0.0
        total += row
        if need_grad:
            if arg >= 0:
                gz[arg] -= gsum
            for i in range(n):
                grad[r, order[r, i]] = scale * gz[i]
    return total


def listnet_task(data):  # type: ignore[no-untyped-def]
    """args[4:10]: p, t, grad (float32), partial (float64, one per chunk), params (float64: ind,
    eps, scale), need_grad (:func:`listnet_rows` on chunks of rows)."""
    a = carray(i64p(data), TASK_ARGS)
    rows, n, chunks = a[2], a[3], a[1]
    p = carray(f32p(a[4]), (rows, n))
    t = carray(f32p(a[5]), (rows, n))
    grad = carray(f32p(a[6]), (rows, n))
    partial = carray(f64p(a[7]), chunks)
    params = carray(f64p(a[8]), 3)
    need_grad = a[9] != 0
    ind = np.float32(params[0])
    while True:
        c = next_chunk(i64p(data))
        if c >= chunks:
            break
        r0, r1 = c * rows // chunks, (c + 1) * rows // chunks
        partial[c] = listnet_rows(p[r0:r1], t[r0:r1], ind, params[1], params[2], grad[r0:r1], need_grad)


def listmle_task(data):  # type: ignore[no-untyped-def]
    """args[4:11]: p, order (int64), t, grad (float32), partial (float64, one per chunk), params
    (float64: ind, eps, scale), need_grad (:func:`listmle_rows` on chunks of rows)."""
    a = carray(i64p(data), TASK_ARGS)
    rows, n, chunks = a[2], a[3], a[1]
    p = carray(f32p(a[4]), (rows, n))
    order = carray(i64p(a[5]), (rows, n))
    t = carray(f32p(a[6]), (rows, n))
    grad = carray(f32p(a[7]), (rows, n))
    partial = carray(f64p(a[8]), chunks)
    params = carray(f64p(a[9]), 3)
    need_grad = a[10] != 0
    ind = np.float32(params[0])
    while True:
        c = next_chunk(i64p(data))
        if c >= chunks:
            break
        r0, r1 = c * rows // chunks, (c + 1) * rows // chunks
        partial[c] = listmle_rows(
            p[r0:r1], order[r0:r1], t[r0:r1], ind, params[1], params[2], grad[r0:r1], need_grad
        )


#: addresses of the row-parallel tasks as C callbacks for the dispatcher
LISTNET_ROWS = task(listnet_task)
LISTMLE_ROWS = task(listmle_task)
