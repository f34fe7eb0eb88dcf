"""The row-parallel dispatcher of the kernel layer (CPU): torch's OpenMP team, or Python threads.

torch's intra-op work runs on an OpenMP team; after every parallel torch op its worker threads
spin for a while (libgomp's default wait policy) before they sleep. Work handed to separate
Python threads then competes with those spinning workers for the cores and gains little. Rows of
a float32 pass are instead split over the *same* OpenMP team: :func:`run_task` calls the runtime's
``GOMP_parallel`` entry point (the ABI that GCC-compiled OpenMP code calls; libgomp, and Intel's
and LLVM's runtimes export it too) with a numba C callback as the outlined region (the ``*_task``
functions of the ``_numba_*`` modules; argument block as :mod:`rankwise._kernels._numba_util`
describes), in which every team member takes chunks of rows from a shared atomic counter.

Passes that the team cannot run (float64 rows, or torch without an OpenMP runtime) are split over a
small pool of Python threads (:func:`over_rows`; the kernels release the GIL). Both run the rows
serially below :data:`PARALLEL_MIN_NUMEL` elements or with one torch thread.

Fork safety: a forked child (a ``DataLoader`` worker) inherits neither the parent's OpenMP team
nor its thread pool, and libgomp cannot start a new team in a child forked after the parent used
one (the call hangs). A fork handler (``os.register_at_fork``) therefore turns the team route off
in every child: its float32 passes run serially, or on Python threads when the child asks for
more than one torch thread; the thread pool is re-created in the child on first use.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

__all__ = [
    "CHUNKS_PER_THREAD",
    "PARALLEL_MIN_NUMEL",
    "gomp_available",
    "over_rows",
    "run_task",
    "serial",
    "team_threads",
]

#: from this many elements on, rows are split across ``torch.get_num_threads()`` threads
PARALLEL_MIN_NUMEL = 1 << 15
#: row chunks per thread of a team pass (taken dynamically: a core shared with another process takes fewer)
CHUNKS_PER_THREAD = 4
#: length of a task's argument block (:data:`rankwise._kernels._numba_util.TASK_ARGS`)
_TASK_ARGS = 16


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


#: ``GOMP_parallel`` of torch's OpenMP runtime, or ``None`` (found when the kernel layer loads a
#: family that has row-parallel tasks; tests set it to ``None`` to take the thread-pool route)
gomp: Any = None
_gomp_searched = False


def find_gomp() -> Any:
    """Look up torch's ``GOMP_parallel`` (once; called by the loader, never on a call path)."""
    global gomp, _gomp_searched
    if not _gomp_searched:
        gomp = _torch_openmp()
        _gomp_searched = True
    return gomp


def gomp_available() -> bool:
    return gomp is not None


def team_threads(rows: int, numel: int, dtype: torch.dtype) -> int:
    """Members of torch's OpenMP team a float32 pass over ``rows`` rows should run on (0: none)."""
    threads = min(torch.get_num_threads(), rows)
    if threads < 2 or numel < PARALLEL_MIN_NUMEL or dtype != torch.float32 or gomp is None:
        return 0  # (None in a forked child)
    return threads


def run_task(task: int, rows: int, n: int, threads: int, operands: list[Any], scalar: float) -> None:
    """Run the C callback ``task`` over ``rows`` rows on ``threads`` members of the OpenMP team, in
    ``CHUNKS_PER_THREAD`` chunks per thread taken dynamically (``operands``: contiguous tensors, by
    address, and integer flags, from ``args[4]`` on; then the float64 ``scalar``). The GIL is
    released while the team works (ctypes)."""
    args = np.zeros(_TASK_ARGS, np.int64)
    args[1], args[2], args[3] = min(rows, threads * CHUNKS_PER_THREAD), rows, n
    k = 4 + len(operands)
    args[4:k] = [t.data_ptr() if isinstance(t, torch.Tensor) else int(t) for t in operands]
    args[k : k + 1].view(np.float64)[0] = scalar
    gomp(task, args.ctypes.data, threads, 0)


_pool: ThreadPoolExecutor | None = None


def _after_fork_in_child() -> None:
    global gomp, _gomp_searched, _pool
    gomp, _gomp_searched, _pool = None, True, None


os.register_at_fork(after_in_child=_after_fork_in_child)


def serial(rows: int, numel: int) -> bool:
    """Whether :func:`over_rows` runs a pass over ``rows`` rows (``numel`` elements) as one call
    (callers then call the kernel on the whole arrays, without building row slices)."""
    return numel < PARALLEL_MIN_NUMEL or rows < 2 or torch.get_num_threads() < 2


def over_rows(rows: int, numel: int, run: Callable[[int, int], None]) -> None:
    """``run(r0, r1)`` over the row range, in parallel chunks on Python threads when it pays off."""
    if serial(rows, numel):
        run(0, rows)
        return
    threads = min(torch.get_num_threads(), rows)
    global _pool
    if _pool is None or _pool._max_workers < threads - 1:
        _pool = ThreadPoolExecutor(max_workers=threads - 1, thread_name_prefix="rankwise-kernels")
    bounds = [rows * t // threads for t in range(threads + 1)]
    futures = [_pool.submit(run, bounds[t], bounds[t + 1]) for t in range(1, threads)]
    run(bounds[0], bounds[1])
    for f in futures:
        f.result()
