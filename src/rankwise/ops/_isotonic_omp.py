"""Row-parallel runs of the float32 isotonic kernels on torch's own OpenMP thread pool (CPU).

torch's intra-op work runs on an OpenMP team; after every parallel torch op its worker threads
spin for a while (libgomp's default wait policy) before they sleep. Work handed to separate
Python threads then competes with those spinning workers for the cores and gains little. Here the
rows are instead split over the *same* OpenMP team: :func:`run` calls the runtime's
``GOMP_parallel`` entry point (the ABI that GCC-compiled OpenMP code calls; libgomp, and Intel's
and LLVM's runtimes export it too) with a numba ``cfunc`` as the outlined region: the tasks of
``_isotonic_numba`` (``*_task``), in which every team member takes chunks of rows from a shared
atomic counter until none is left (dynamic load balancing: a core busy with another process just
takes fewer chunks) and runs the kernel on them.

:func:`available` says whether torch's OpenMP runtime could be found (torch built with OpenMP as
its ATen parallel backend and the runtime already loaded); otherwise the caller uses its Python
thread pool. Importing this module compiles (or reads from numba's cache) the four tasks.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np
import torch
from numba import cfunc, types

from rankwise.ops import _isotonic_numba as _k

__all__ = ["RANK_BACKWARD", "RANK_FORWARD", "SORT_BACKWARD", "SORT_FORWARD", "SORT_ROWS", "available", "run"]

# cached against _isotonic_numba.py, where the functions are defined
_task = cfunc(types.void(types.voidptr), cache=True)
RANK_FORWARD = _task(_k.rank_forward_task).address
RANK_BACKWARD = _task(_k.rank_backward_task).address
SORT_FORWARD = _task(_k.sort_forward_task).address
SORT_BACKWARD = _task(_k.sort_backward_task).address
SORT_ROWS = _task(_k.sort_rows_task).address


def _loaded_runtimes() -> list[str]:
    """Paths of the OpenMP runtimes loaded in this process (Linux), torch's own first."""
    try:
        with open("/proc/self/maps") as f:
            fields = [line.split(None, 5) for line in f]
    except OSError:
        return []
    paths = {f[5].strip() for f in fields if len(f) == 6}
    names = ("libgomp", "libiomp5", "libomp")
    found = [p for p in paths if p.startswith("/") and os.path.basename(p).startswith(names) and ".so" in p]
    torch_dir = os.path.dirname(torch.__file__)
    return sorted(found, key=lambda p: not p.startswith(torch_dir))


def _torch_openmp() -> Any:
    """``GOMP_parallel`` of the OpenMP runtime torch runs its intra-op work on, or ``None``."""
    if not torch._C.has_openmp or "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    noload = getattr(os, "RTLD_NOLOAD", None)
    if noload is None:
        return None
    # only a runtime already loaded (by torch): its copy in torch's folder (any name), else by soname
    for name in (*_loaded_runtimes(), "libgomp.so.1", "libiomp5.so", "libomp.so"):
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
    args = np.zeros(_k.TASK_ARGS, np.int64)
    args[1], args[2], args[3] = chunks, rows, n
    k = 4 + len(operands)
    args[4:k] = operands
    args[k : k + 1].view(np.float64)[0] = scalar
    _gomp_parallel(task, args.ctypes.data, threads, 0)
