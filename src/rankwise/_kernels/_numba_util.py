"""Numba building blocks of the row-parallel tasks: typed pointers from addresses, an atomic chunk
counter, and :func:`task`, which compiles a task as a ``void(void*)`` C callback for the dispatcher
(:mod:`rankwise._kernels._parallel`).

A task's argument block is one int64 array of :data:`TASK_ARGS` entries: [0] the chunk counter
(zero), [1] the number of chunks, [2] rows, [3] n, then the operands (array addresses, flags, and a
float64 scalar stored by bit pattern) in the order each task documents. Every member of the team
takes chunks of rows from the atomic counter until none is left (dynamic load balancing: a core
busy with another process just takes fewer chunks).
"""

from __future__ import annotations

from typing import Any

from numba import cfunc, types
from numba.core.extending import intrinsic

__all__ = ["TASK_ARGS", "f32p", "f64p", "i64p", "next_chunk", "task"]

TASK_ARGS = 16  # length of the argument block of the row-parallel tasks


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


f32p = _pointer_intrinsic(types.float32)
f64p = _pointer_intrinsic(types.float64)
i64p = _pointer_intrinsic(types.int64)


def _next_chunk_intrinsic(typingctx, counter):  # type: ignore[no-untyped-def]
    """Atomically ``counter[0] += 1``; the value before."""
    sig = types.int64(counter)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        one = context.get_constant(types.int64, 1)
        return builder.atomic_rmw("add", args[0], one, "monotonic")

    return sig, codegen


next_chunk: Any = intrinsic(_next_chunk_intrinsic)


def task(fn: Any) -> int:
    """The address of ``fn`` compiled as a ``void(void*)`` C callback (cached by numba against the
    module that defines ``fn``, so it is recompiled whenever that kernel changes)."""
    address = cfunc(types.void(types.voidptr), cache=True)(fn).address
    assert address is not None
    return int(address)
