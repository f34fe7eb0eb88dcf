"""Learning-to-rank family of the kernel layer: ListNet and ListMLE, value and gradient in one pass (CPU).

:func:`ready` says whether the kernels serve a call now (the first calls count towards the
background load, see :mod:`rankwise._kernels._loader`); :func:`listnet` and :func:`listmle` return
the loss (the mean over the lists, a 0-d tensor of the rows' dtype) and its gradient on the
scores (empty without ``need_grad``), rows on torch's OpenMP team (float32) or Python threads
(float64) when the batch is large and more than one thread is allowed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rankwise._kernels import _parallel
from rankwise._kernels._custom import KernelOp, traced_usable
from rankwise._kernels._loader import Family

__all__ = ["FAMILY", "listmle", "listnet", "ready"]


def _warm(k: Any) -> None:
    _parallel.find_gomp()
    for dt in (np.float32, np.float64):
        p = np.zeros((2, 3), dt)
        t = np.array([[1.0, 0.0, -1.0], [-1.0, -1.0, -1.0]], dt)
        k.listnet_rows(p, t, -1.0, 1e-10, 1.0, np.empty_like(p), True)
        order = np.tile(np.arange(3, dtype=np.int64), (2, 1))
        k.listmle_rows(p, order, t, -1.0, 1e-10, 1.0, np.empty_like(p), True)


FAMILY = Family("ltr", "rankwise._kernels._numba_ltr", _warm, start_after=1, warn=False)


def ready() -> bool:
    """Whether :func:`listnet` / :func:`listmle` run the numba kernels now (else the caller uses torch ops)."""
    if torch.compiler.is_compiling():
        return traced_usable()
    return FAMILY.get() is not None


def _k() -> Any:
    k = FAMILY.require()
    if k is None:
        raise RuntimeError("rankwise: the learning-to-rank kernels need numba, which cannot be imported")
    return k


def _run(
    name: str, p: torch.Tensor, t: torch.Tensor, order: torch.Tensor | None, ind: float, eps: float, need_grad: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    k = _k()
    p, t = p.detach().contiguous(), t.detach().contiguous()
    rows, n = p.shape
    scale = (-1.0 if name == "listnet" else 1.0) / rows
    ind = float(np.float32(ind)) if p.dtype == torch.float32 else float(ind)  # compared in the rows' dtype
    grad = torch.empty_like(p) if need_grad else p.new_empty((1, 1))  # (the placeholder is never written)
    pre = () if order is None else (order.contiguous(),)
    rows_fn = k.listnet_rows if order is None else k.listmle_rows
    threads = _parallel.team_threads(rows, rows * n, p.dtype)
    if threads:
        chunks = min(rows, threads * _parallel.CHUNKS_PER_THREAD)
        partial = torch.zeros(chunks, dtype=torch.float64)
        params = torch.tensor([ind, eps, scale], dtype=torch.float64)
        task = k.LISTNET_ROWS if order is None else k.LISTMLE_ROWS
        operands = [p, *pre, t, grad if need_grad else p, partial, params, need_grad]
        _parallel.run_task(task, rows, n, threads, operands, 0.0)
        total = float(partial.sum())
    else:
        arrays = [a.numpy() for a in (p, *pre, t)]
        gn = grad.numpy() if need_grad else np.empty((rows, 0), dtype=arrays[0].dtype)
        if _parallel.serial(rows, rows * n):
            total = rows_fn(*arrays, ind, eps, scale, gn, need_grad)
        else:
            parts: list[float] = []

            def run(r0: int, r1: int) -> None:
                parts.append(rows_fn(*[a[r0:r1] for a in arrays], ind, eps, scale, gn[r0:r1], need_grad))

            _parallel.over_rows(rows, rows * n, run)
            total = sum(parts)
    return torch.scalar_tensor(total * abs(scale), dtype=p.dtype), grad


def _listnet(p: torch.Tensor, t: torch.Tensor, ind: float, eps: float, need_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """ListNet's mean over the (rows, n) lists ``p`` / ``t`` (a slot is real where ``t != ind``; ``p``
    and ``t`` of one floating dtype) and, with ``need_grad``, its gradient on ``p`` (else a (1, 1)
    placeholder)."""
    return _run("listnet", p, t, None, ind, eps, need_grad)


def _listmle(
    p: torch.Tensor, order: torch.Tensor, t: torch.Tensor, ind: float, eps: float, need_grad: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """ListMLE's mean over the (rows, n) lists ``p[r, order[r]]`` (a slot is real where ``t != ind``)
    and, with ``need_grad``, its gradient on ``p`` (else a (1, 1) placeholder)."""
    return _run("listmle", p, t, order, ind, eps, need_grad)


def _fake_out(p: torch.Tensor, need_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return p.new_empty(()), p.new_empty(p.shape if need_grad else (1, 1))


listnet = KernelOp(
    "ltr_listnet",
    "(Tensor p, Tensor t, float ind, float eps, bool need_grad) -> (Tensor, Tensor)",
    _listnet,
    lambda p, t, ind, eps, need_grad: _fake_out(p, need_grad),
)
listmle = KernelOp(
    "ltr_listmle",
    "(Tensor p, Tensor order, Tensor t, float ind, float eps, bool need_grad) -> (Tensor, Tensor)",
    _listmle,
    lambda p, order, t, ind, eps, need_grad: _fake_out(p, need_grad),
)
