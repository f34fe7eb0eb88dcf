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

A list without a real slot adds 0 and gets a zero gradient. The sum is NaN when any element of
``p`` or ``t`` is not finite (padding included: the NaN policy of the batch losses, checked in the
pass that reads them anyway). Importing this module raises
``ImportError`` when numba is unavailable (the losses then take their torch path).
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import carray, types
from numba.core.extending import intrinsic

from rankwise._kernels._numba_util import TASK_ARGS, f32p, f64p, i64p, next_chunk, task

__all__ = ["LISTMLE_ROWS", "LISTNET_ROWS", "listmle_keys", "listmle_rows", "listnet_rows"]


def _f32_from_bits_intrinsic(typingctx, bits):  # type: ignore[no-untyped-def]
    """The float32 whose bit pattern is the int32 ``bits``."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


_f32_from_bits: Any = intrinsic(_f32_from_bits_intrinsic)


# exp of float32 (Cephes' expf: x = k ln 2 + r, ln 2 in two parts, a degree-7 polynomial on |r| <= ln 2 / 2,
# 2^k from the exponent bits); about 1 ulp, flushed to 0 below -87 (where exp is near float32's
# smallest normal number). Pure arithmetic, so the loops that call it vectorize (libm's exp does not).
_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693359375)
_LN2_LO = np.float32(-2.12194440e-4)
_E0 = np.float32(1.9875691500e-4)
_E1 = np.float32(1.3981999507e-3)
_E2 = np.float32(8.3334519073e-3)
_E3 = np.float32(4.1665795894e-2)
_E4 = np.float32(1.6666665459e-1)
_E5 = np.float32(5.0000001201e-1)
_EXP_LO = np.float32(-87.0)
_HALF = np.float32(0.5)
_ONE = np.float32(1.0)
_ZERO = np.float32(0.0)


@numba.njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _exp32(x):  # type: ignore[no-untyped-def]
    """``exp(x)`` of a float32 ``x <= 0`` (NaN and values below -87 give 0)."""
    c = x if x > _EXP_LO else _EXP_LO
    k = np.floor(c * _LOG2E + _HALF)
    r = c - k * _LN2_HI - k * _LN2_LO
    y = (((((_E0 * r + _E1) * r + _E2) * r + _E3) * r + _E4) * r + _E5) * (r * r) + r + _ONE
    y = y * _f32_from_bits((np.int32(k) + np.int32(127)) << np.int32(23))
    return y if x > _EXP_LO else _ZERO


#: below this ``eps / s``, ``log(s + eps) = log s + log1p(eps / s)`` takes log1p from three terms of its
#: series (error under 1e-17) and ``log s`` from the scores (no log per slot)
_SERIES_MAX = 1e-4


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"}, error_model="numpy")
def listnet_rows(p, t, ind, eps, scale, grad, need_grad):  # type: ignore[no-untyped-def]
    """Sum over the rows of ``-sum_i q_i log(s_i + eps)``; with ``need_grad`` ``grad`` (the shape and
    dtype of ``p``) receives ``scale * -(u - s sum(u))`` (0 in the padded slots and dead lists).

    ``s``: the softmax of ``p`` over the slots with ``t != ind`` (0 when every real score is -inf);
    ``q``: that of ``t`` (0, the list adding nothing, when there is no real slot or every real
    label is -inf). With ``eps == 0`` a padded slot adds nothing (not ``0 * log 0``).

    float32 rows with finite extremes take their exponentials from :func:`_exp32` (float32, as
    torch's softmax) and ``log(s_i + eps)`` as ``p_i - max p - log sum e`` plus the series of
    ``log1p(eps / s_i)`` where ``eps / s_i < _SERIES_MAX`` (libm's log elsewhere): no libm call per
    slot, so the passes vectorize. float64 rows (and rows with an infinite extreme) use libm's
    ``exp`` and ``log`` per slot."""
    rows, n = p.shape
    es = np.empty(n, np.float32)  # float32 rows: exp(p - max p)
    eq = np.empty(n, np.float32)  # float32 rows: exp(t - max t)
    sv = np.empty(n, np.float64)  # s
    uv = np.empty(n, np.float64)  # u
    fast = p.itemsize == 4 and t.itemsize == 4
    total = 0.0
    poison = 0.0
    for r in range(rows):
        mp = -np.inf
        mt = -np.inf
        alive = False
        for i in range(n):
            poison += np.float64(p[r, i]) * 0.0 + np.float64(t[r, i]) * 0.0
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
        row = 0.0
        su = 0.0
        if fast and -np.inf < mp < np.inf and mt < np.inf:
            mp32 = np.float32(mp)
            mt32 = np.float32(mt)
            sp = 0.0
            st = 0.0
            for i in range(n):
                keep = t[r, i] != ind
                e = _exp32(np.float32(p[r, i] - mp32))
                e = e if keep else _ZERO
                es[i] = e
                sp += e
                e = _exp32(np.float32(t[r, i] - mt32))
                e = e if keep else _ZERO
                eq[i] = e
                st += e
            inv_p = 1.0 / sp
            inv_t = 1.0 / st
            base = mp + math.log(sp)  # log s_i = p_i - base
            eps_sp = np.float32(eps * sp)  # eps / s_i = eps sp / e_i (float32: it corrects a small term)
            rare = 0
            for i in range(n):
                e = es[i]
                y = np.float64(eps_sp / e)  # inf for e = 0, NaN for eps = e = 0: the exact formula below
                near = y < _SERIES_MAX
                q = eq[i] * inv_t
                lg = (np.float64(p[r, i]) - base) + y * (1.0 - y * (0.5 - y * (1.0 / 3.0)))  # log(s + eps)
                row -= q * lg if near else 0.0
                u = q * (1.0 - y * (1.0 - y)) if near else 0.0  # q s / (s + eps) = q / (1 + y)
                sv[i] = e * inv_p
                uv[i] = u
                su += u
                rare += 0 if near or t[r, i] == ind else 1
            if rare:  # real slots where eps is not small beside s: log(s + eps) itself
                for i in range(n):
                    if t[r, i] != ind and not np.float64(eps_sp / es[i]) < _SERIES_MAX:
                        s = sv[i]
                        q = eq[i] * inv_t
                        d = s + eps
                        row -= q * math.log(d)
                        u = q * s / d
                        uv[i] = u
                        su += u
        else:
            sp = 0.0
            st = 0.0
            for i in range(n):
                if t[r, i] != ind:
                    e = math.exp(p[r, i] - mp) if mp > -np.inf else 0.0
                    sv[i] = e
                    sp += e
                    e = math.exp(t[r, i] - mt)
                    uv[i] = e
                    st += e
                else:
                    sv[i] = 0.0
                    uv[i] = 0.0
            inv_p = 1.0 / sp if sp > 0.0 else 0.0
            inv_t = 1.0 / st
            for i in range(n):
                if t[r, i] != ind:
                    s = sv[i] * inv_p
                    q = uv[i] * inv_t
                    d = s + eps
                    row -= q * math.log(d)
                    u = q * s / d
                    sv[i] = s
                    uv[i] = u
                    su += u
        total += row
        if need_grad:
            for i in range(n):
                grad[r, i] = scale * (uv[i] - sv[i] * su)
    return total + poison


@numba.njit(cache=True, nogil=True, error_model="numpy")
def listmle_keys(t, perm, ind, out):  # type: ignore[no-untyped-def]
    """``out[r, j] = t[r, perm[j]]``, or ``-inf`` where that is padding (``== ind``): the keys whose
    descending sort gives ListMLE's label order of the shuffled lists."""
    rows, n = t.shape
    for r in range(rows):
        for j in range(n):
            v = t[r, perm[j]]
            out[r, j] = v if v != ind else -np.inf


@numba.njit(cache=True, nogil=True, error_model="numpy")
def listmle_rows(p, perm, idx, t, ind, eps, scale, grad, need_grad):  # type: ignore[no-untyped-def]
    """Sum over the rows of ``sum_i log(T_i + eps) - z_i`` over the real slots of ``p[r, order[r]]``,
    ``order[r] = perm[idx[r]]`` (a slot is real where ``t != ind``); with ``need_grad`` ``grad`` (the
    shape and dtype of ``p``, in the slots of ``p``) receives ``scale`` times its gradient."""
    rows, n = p.shape
    ex = np.empty(n, np.float64)
    den = np.empty(n, np.float64)
    gz = np.empty(n, np.float64)
    total = 0.0
    poison = 0.0
    for r in range(rows):
        top = -np.inf
        arg = -1
        for i in range(n):
            k = perm[idx[r, i]]
            poison += np.float64(p[r, k]) * 0.0 + np.float64(t[r, k]) * 0.0
            if t[r, k] != ind and p[r, k] > top:
                top = np.float64(p[r, k])
                arg = i
        if arg < 0:  # no real slot (or every real score -inf: the value is inf or NaN either way)
            top = 0.0
        tail = 0.0
        for i in range(n - 1, -1, -1):
            k = perm[idx[r, i]]
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
                k = perm[idx[r, i]]
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
                grad[r, perm[idx[r, i]]] = scale * gz[i]
    return total + poison


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
    """args[4:12]: p, perm (int64, n), idx (int64), t, grad (float32), partial (float64, one per
    chunk), params (float64: ind, eps, scale), need_grad (:func:`listmle_rows` on chunks of rows)."""
    a = carray(i64p(data), TASK_ARGS)
    rows, n, chunks = a[2], a[3], a[1]
    p = carray(f32p(a[4]), (rows, n))
    perm = carray(i64p(a[5]), n)
    idx = carray(i64p(a[6]), (rows, n))
    t = carray(f32p(a[7]), (rows, n))
    grad = carray(f32p(a[8]), (rows, n))
    partial = carray(f64p(a[9]), chunks)
    params = carray(f64p(a[10]), 3)
    need_grad = a[11] != 0
    ind = np.float32(params[0])
    while True:
        c = next_chunk(i64p(data))
        if c >= chunks:
            break
        r0, r1 = c * rows // chunks, (c + 1) * rows // chunks
        partial[c] = listmle_rows(
            p[r0:r1], perm, idx[r0:r1], t[r0:r1], ind, params[1], params[2], grad[r0:r1], need_grad
        )


#: addresses of the row-parallel tasks as C callbacks for the dispatcher
LISTNET_ROWS = task(listnet_task)
LISTMLE_ROWS = task(listmle_task)
