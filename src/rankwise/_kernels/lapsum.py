"""LapSum family of the kernel layer: soft rank / sort / top-k, forward and backward (CPU).

:func:`ready` says whether the kernels serve a call now (the first calls count towards the
background load, see :mod:`rankwise._kernels._loader`); :func:`forward` returns the operator's
values of the float32/float64 (rows, n) tensor and the sort permutation that :func:`backward`
takes with the input to compute the vector-Jacobian product (one sort, then O(n) per row; see
:mod:`rankwise._kernels._numba_lapsum`). Rows run on Python threads when the batch is large and more
than one thread is allowed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rankwise._kernels import _parallel
from rankwise._kernels._custom import KernelOp, traced_usable
from rankwise._kernels._loader import Family

__all__ = ["FAMILY", "KINDS", "backward", "forward", "ready"]

#: the operators, as the kernels number them
KINDS = {"rank": 0, "sort": 1, "topk": 2}


def _warm(k: Any) -> None:
    for dt in (np.float32, np.float64):
        x = np.array([[0.5, -1.0, 0.5], [2.0, 0.0, 1.0]], dt)
        for kind in range(3):
            for desc in (False, True):
                out, perm = np.empty_like(x), np.empty(x.shape, np.int64)
                k.lapsum_forward(x, kind, 1.0, desc, 1.5, out, perm)
                k.lapsum_backward(np.ones_like(x), x, perm, kind, 1.0, desc, 1.5, np.empty_like(x))


FAMILY = Family("lapsum", "rankwise._kernels._numba_lapsum", _warm, start_after=1, warn=False)


def ready() -> bool:
    """Whether :func:`forward` / :func:`backward` run the numba kernels now (else the caller uses torch ops)."""
    if torch.compiler.is_compiling():
        return traced_usable()
    return FAMILY.get() is not None


def _k() -> Any:
    k = FAMILY.require()
    if k is None:
        raise RuntimeError("rankwise: the LapSum kernels need numba, which cannot be imported")
    return k


def _forward(x: torch.Tensor, kind: int, alpha: float, descending: bool, k: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft rank / sort / top-k (``kind``: :data:`KINDS`) of the rows of the float32/float64 (rows, n)
    CPU tensor ``x`` (NaN rows where a row holds a NaN or inf) and the ascending order of
    ``-x if descending else x`` per row."""
    kern = _k()
    x = x.detach().contiguous()
    rows, n = x.shape
    out = torch.empty_like(x)
    perm = torch.empty((rows, n), dtype=torch.int64)
    xn, on, pn = x.numpy(), out.numpy(), perm.numpy()

    def run(r0: int, r1: int) -> None:
        kern.lapsum_forward(xn[r0:r1], kind, alpha, descending, k, on[r0:r1], pn[r0:r1])

    _parallel.over_rows(rows, rows * n, run)
    return out, perm


def _backward(
    grad: torch.Tensor, x: torch.Tensor, perm: torch.Tensor, kind: int, alpha: float, descending: bool, k: float
) -> torch.Tensor:
    """The vector-Jacobian product of :func:`forward` with ``grad`` (zero rows where ``x`` is not finite)."""
    kern = _k()
    x = x.detach().contiguous()
    g = grad.detach().to(x.dtype).contiguous()
    rows, n = x.shape
    gx = torch.empty_like(x)
    xn, gn, pn, on = x.numpy(), g.numpy(), perm.contiguous().numpy(), gx.numpy()

    def run(r0: int, r1: int) -> None:
        kern.lapsum_backward(gn[r0:r1], xn[r0:r1], pn[r0:r1], kind, alpha, descending, k, on[r0:r1])

    _parallel.over_rows(rows, rows * n, run)
    return gx


forward = KernelOp(
    "lapsum_forward",
    "(Tensor x, int kind, float alpha, bool descending, float k) -> (Tensor, Tensor)",
    _forward,
    lambda x, kind, alpha, descending, k: (torch.empty_like(x), x.new_empty(x.shape, dtype=torch.int64)),
)
backward = KernelOp(
    "lapsum_backward",
    "(Tensor grad, Tensor x, Tensor perm, int kind, float alpha, bool descending, float k) -> Tensor",
    _backward,
    lambda grad, x, perm, kind, alpha, descending, k: torch.empty_like(x),
)
