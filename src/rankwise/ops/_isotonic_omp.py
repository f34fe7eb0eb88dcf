"""Row-parallel runs of the float32 isotonic kernels on torch's own OpenMP thread pool (CPU).

torch's intra-op work runs on an OpenMP team; after every parallel torch op its worker threads
spin for a while (libgomp's default wait policy) before they sleep. Work handed to separate
Python threads then competes with those spinning workers for the cores and gains little. Here the
rows are instead split over the *same* OpenMP team: :func:`run` calls the runtime's
``GOMP_parallel`` entry point (the ABI that GCC-compiled OpenMP code calls; libgomp, and Intel's
and LLVM's runtimes export it too) with a numba ``cfunc`` as the outlined region. Every team
member takes chunks of rows from a shared atomic counter until none is left (dynamic load
balancing: a core busy with another process just takes fewer chunks) and runs the
``_isotonic_numba`` kernel on them.

:func:`available` says whether torch's OpenMP runtime could be found (torch built with OpenMP as
its ATen parallel backend and the runtime already loaded); otherwise the caller uses its Python
thread pool. Importing this module compiles (or reads from numba's cache) the four tasks.

The task argument block is one int64 array: ``[0]`` the chunk counter (zero), ``[1]`` the number of
chunks, ``[2]`` rows, ``[3]`` n, then the operands (array addresses, flags, float64 scalars stored
by bit pattern) in the order each task documents.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np
import torch
from numba import carray, cfunc, types
from numba.core.extending import intrinsic

from rankwise.ops import _isotonic_numba as _k

__all__ = ["RANK_BACKWARD", "RANK_FORWARD", "SORT_BACKWARD", "SORT_FORWARD", "available", "run"]

_ARGS = 16  # length of the argument block


def _pointer_intrinsic(dtype: Any) -> Any:
    @intrinsic
    def to_pointer(typingctx, addr):  # type: ignore[no-untyped-def]
        sig = types.CPointer(dtype)(addr)

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            ty = context.get_value_type(signature.return_type)
            if isinstance(signature.args[0], types.Integer):
                return builder.inttoptr(args[0], ty)
            return builder.bitcast(args[0], ty)

        return sig, codegen

    return to_pointer


_f32p = _pointer_intrinsic(types.float32)
_f64p = _pointer_intrinsic(types.float64)
_i64p = _pointer_intrinsic(types.int64)


def _next_chunk_intrinsic(typingctx, counter):  # type: ignore[no-untyped-def]
    """Atomically ``counter[0] += 1``; the value before."""
    sig = types.int64(counter)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        one = context.get_constant(types.int64, 1)
        return builder.atomic_rmw("add", args[0], one, "monotonic")

    return sig, codegen


_next_chunk: Any = intrinsic(_next_chunk_intrinsic)
_task = cfunc(types.void(types.voidptr), cache=True)


@_task
def _rank_forward(data):  # type: ignore[no-untyped-def]
    """args[4:11]: z, perm, w (1, n), out, ids, x, kl; float64 at [11]: the divisor."""
    a = carray(_i64p(data), _ARGS)
    f = carray(_f64p(data), _ARGS)
    rows, n, chunks = a[2], a[3], a[1]
    z = carray(_f32p(a[4]), (rows, n))
    perm = carray(_i64p(a[5]), (rows, n))
    w = carray(_f32p(a[6]), (1, n))
    out = carray(_f32p(a[7]), (rows, n))
    ids = carray(_i64p(a[8]), (rows, n))
    x = carray(_f32p(a[9]), (rows, n))
    kl = a[10] != 0
    div = np.float32(f[11])
    while True:
        c = _next_chunk(_i64p(data))
        if c >= chunks:
            break
        r0, r1 = c * rows // chunks, (c + 1) * rows // chunks
        _k.soft_rank_forward(z[r0:r1], perm[r0:r1], w, kl, out[r0:r1], ids[r0:r1], x[r0:r1], div)


@_task
def _rank_backward(data):  # type: ignore[no-untyped-def]
    """args[4:11]: grad, z, perm, ids, out, grad_z, kl; float64 at [11]: the scale."""
    a = carray(_i64p(data), _ARGS)
    f = carray(_f64p(data), _ARGS)
    rows, n, chunks = a[2], a[3], a[1]
    g = carray(_f32p(a[4]), (rows, n))
    z = carray(_f32p(a[5]), (rows, n))
    perm = carray(_i64p(a[6]), (rows, n))
    ids = carray(_i64p(a[7]), (rows, n))
    out = carray(_f32p(a[8]), (rows, n))
    gz = carray(_f32p(a[9]), (rows, n))
    kl = a[10] != 0
    scale = f[11]
    while True:
        c = _next_chunk(_i64p(data))
        if c >= chunks:
            break
        r0, r1 = c * rows // chunks, (c + 1) * rows // chunks
        _k.soft_rank_backward(g[r0:r1], z[r0:r1], perm[r0:r1], ids[r0:r1], out[r0:r1], kl, scale, gz[r0:r1])


@_task
def _sort_forward(data):  # type: ignore[no-untyped-def]
    """args[4:10]: x, perm, s (1, n), out, ids, kl; float64 at [10]: the sign."""
    a = carray(_i64p(data), _ARGS)
    f = carray(_f64p(data), _ARGS)
    rows, n, chunks = a[2], a[3], a[1]
    x = carray(_f32p(a[4]), (rows, n))
    perm = carray(_i64p(a[5]), (rows, n))
    s = carray(_f32p(a[6]), (1, n))
    out = carray(_f32p(a[7]), (rows, n))
    ids = carray(_i64p(a[8]), (rows, n))
    kl = a[9] != 0
    sign = f[10]
    while True:
        c = _next_chunk(_i64p(data))
        if c >= chunks:
            break
        r0, r1 = c * rows // chunks, (c + 1) * rows // chunks
        _k.soft_sort_forward(x[r0:r1], perm[r0:r1], sign, s, kl, out[r0:r1], ids[r0:r1], True)


@_task
def _sort_backward(data):  # type: ignore[no-untyped-def]
    """args[4:10]: grad, x, perm, ids, grad_x, kl; float64 at [10]: the sign."""
    a = carray(_i64p(data), _ARGS)
    f = carray(_f64p(data), _ARGS)
    rows, n, chunks = a[2], a[3], a[1]
    g = carray(_f32p(a[4]), (rows, n))
    x = carray(_f32p(a[5]), (rows, n))
    perm = carray(_i64p(a[6]), (rows, n))
    ids = carray(_i64p(a[7]), (rows, n))
    gx = carray(_f32p(a[8]), (rows, n))
    kl = a[9] != 0
    sign = f[10]
    while True:
        c = _next_chunk(_i64p(data))
        if c >= chunks:
            break
        r0, r1 = c * rows // chunks, (c + 1) * rows // chunks
        _k.soft_sort_backward(g[r0:r1], x[r0:r1], perm[r0:r1], ids[r0:r1], sign, kl, gx[r0:r1])


RANK_FORWARD = _rank_forward.address
RANK_BACKWARD = _rank_backward.address
SORT_FORWARD = _sort_forward.address
SORT_BACKWARD = _sort_backward.address


def _torch_openmp() -> Any:
    """``GOMP_parallel`` of the OpenMP runtime torch runs its intra-op work on, or ``None``."""
    if not torch._C.has_openmp or "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    noload = getattr(os, "RTLD_NOLOAD", None)
    if noload is None:
        return None
    for name in ("libgomp.so.1", "libiomp5.so", "libomp.so"):  # only a runtime already loaded (torch's)
        try:
            lib = ctypes.CDLL(name, mode=noload | os.RTLD_LAZY)
            fn = lib.GOMP_parallel
        except (OSError, AttributeError):
            continue
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
        fn.restype = None
        return fn
    return None


_gomp_parallel = _torch_openmp()


def available() -> bool:
    return _gomp_parallel is not None


def run(task: int, rows: int, n: int, threads: int, chunks: int, operands: list[int], scalar: float) -> None:
    """Run ``task`` over ``rows`` rows in ``chunks`` chunks on ``threads`` members of the OpenMP team
    (``operands``: addresses and flags from ``args[4]`` on, then the float64 ``scalar``). The GIL is
    released while the team works (ctypes)."""
    args = np.zeros(_ARGS, np.int64)
    args[1], args[2], args[3] = chunks, rows, n
    k = 4 + len(operands)
    args[4:k] = operands
    args[k : k + 1].view(np.float64)[0] = scalar
    _gomp_parallel(task, args.ctypes.data, threads, 0)
