"""Sort family of the kernel layer: numba's stable row sort of float32 rows (CPU).

:func:`ready` says whether the row sort serves a call now (it counts the call towards the
background load, see :mod:`rankwise._kernels._loader`); :func:`sort_rows` returns the stable
permutation of every row, exactly ``torch.sort(stable=True).indices`` (NaN above +inf, -0.0 equal
to +0.0), rows on torch's OpenMP team with more than one thread.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rankwise._kernels import _parallel
from rankwise._kernels._custom import KernelOp, traced_usable
from rankwise._kernels._loader import Family

__all__ = ["FAMILY", "ready", "sort_rows"]


def _warm(k: Any) -> None:
    _parallel.find_gomp()
    k.sort_rows(np.zeros((2, 3), np.float32), True, np.empty((2, 3), np.int64))


FAMILY = Family("sort", "rankwise._kernels._numba_sort", _warm, start_after=2, warn=False)


def ready() -> bool:
    """Whether :func:`sort_rows` runs numba's sort now (else the caller sorts with torch)."""
    if torch.compiler.is_compiling():
        return traced_usable()
    return FAMILY.get() is not None


def _sort_rows(values: torch.Tensor, descending: bool) -> torch.Tensor:
    """``torch.sort(values, descending=descending, stable=True).indices`` of a float32 (rows, n) CPU
    tensor, by numba's linear-time radix sort per row."""
    k = FAMILY.require()
    if k is None:  # (only where a compiled graph runs without usable numba)
        return torch.sort(values, dim=-1, descending=descending, stable=True).indices
    values = values.detach().contiguous()
    rows, n = values.shape
    perm = torch.empty((rows, n), dtype=torch.int64)
    threads = _parallel.team_threads(rows, rows * n, values.dtype)
    if threads:
        _parallel.run_task(k.SORT_ROWS, rows, n, threads, [values, perm, descending], 0.0)
    else:
        k.sort_rows(values.numpy(), descending, perm.numpy())
    return perm


sort_rows = KernelOp(
    "sort_rows",
    "(Tensor values, bool descending) -> Tensor",
    _sort_rows,
    lambda values, descending: values.new_empty(values.shape, dtype=torch.int64),
)
