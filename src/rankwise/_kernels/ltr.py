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

__all__ = ["FAMILY", "listmle", "listmle_keys", "listnet", "ready"]


def _warm(k: Any) -> None:
    _parallel.find_gomp()
    for dt in (np.float32, np.float64):
        p = np.zeros((2, 3), dt)
        t = np.array([[1.0, 0.0, -1.0], [-1.0, -1.0, -1.0]], dt)
        k.listnet_rows(p, t, -1.0, 1e-10, 1.0, np.empty_like(p), True)
        perm = np.arange(3, dtype=np.int64)
        keys = np.empty_like(t)
        k.listmle_keys(t, perm, -1.0, keys)
        k.listmle_rows(p, perm, np.tile(perm, (2, 1)), t, -1.0, 1e-10, 1.0, np.empty_like(p), True)


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


def _rows_ind(ind: float, dtype: torch.dtype) -> float:
    """The padding label as the rows compare it (a float32 row compares with the float32 label)."""
    return float(np.float32(ind)) if dtype == torch.float32 else float(ind)


def _run(
    name: str,
    p: torch.Tensor,
    t: torch.Tensor,
    order: tuple[torch.Tensor, ...],
    ind: float,
    eps: float,
    need_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    k = _k()
    p, t = p.detach().contiguous(), t.detach().contiguous()
    rows, n = p.shape
    scale = (-1.0 if name == "listnet" else 1.0) / rows
    ind = _rows_ind(ind, p.dtype)
    grad = torch.empty_like(p) if need_grad else p.new_empty((1, 1))  # (the placeholder is never written)
    pre = tuple(o.contiguous() for o in order)
    rows_fn = k.listnet_rows if name == "listnet" else k.listmle_rows
    threads = _parallel.team_threads(rows, rows * n, p.dtype)
    if threads:
        chunks = min(rows, threads * _parallel.CHUNKS_PER_THREAD)
        partial = torch.zeros(chunks, dtype=torch.float64)
        params = torch.tensor([ind, eps, scale], dtype=torch.float64)
        task = k.LISTNET_ROWS if name == "listnet" else k.LISTMLE_ROWS
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
                sub = [a if a.ndim == 1 else a[r0:r1] for a in arrays]  # (perm is one row)
                parts.append(rows_fn(*sub, ind, eps, scale, gn[r0:r1], need_grad))

            _parallel.over_rows(rows, rows * n, run)
            total = sum(parts)
    return torch.scalar_tensor(total * abs(scale), dtype=p.dtype), grad


def _listnet(
    p: torch.Tensor, t: torch.Tensor, ind: float, eps: float, need_grad: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """ListNet's mean over the (rows, n) lists ``p`` / ``t`` (a slot is real where ``t != ind``; ``p``
    and ``t`` of one floating dtype) and, with ``need_grad``, its gradient on ``p`` (else a (1, 1)
    placeholder)."""
    return _run("listnet", p, t, (), ind, eps, need_grad)


def _listmle(
    p: torch.Tensor, perm: torch.Tensor, idx: torch.Tensor, t: torch.Tensor, ind: float, eps: float, need_grad: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """ListMLE's mean over the (rows, n) lists ``p[r, perm[idx[r]]]`` (a slot is real where
    ``t != ind``) and, with ``need_grad``, its gradient on ``p`` (else a (1, 1) placeholder)."""
    return _run("listmle", p, t, (perm, idx), ind, eps, need_grad)


def _listmle_keys(t: torch.Tensor, perm: torch.Tensor, ind: float) -> torch.Tensor:
    """``t[:, perm]`` with ``-inf`` in the padded slots (``== ind``): the sort keys of ListMLE's
    label order (one pass instead of a comparison, a fill and a gather)."""
    t = t.detach().contiguous()
    out = torch.empty_like(t)
    _k().listmle_keys(t.numpy(), perm.contiguous().numpy(), _rows_ind(ind, t.dtype), out.numpy())
    return out


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
    "(Tensor p, Tensor perm, Tensor idx, Tensor t, float ind, float eps, bool need_grad) -> (Tensor, Tensor)",
    _listmle,
    lambda p, perm, idx, t, ind, eps, need_grad: _fake_out(p, need_grad),
)
listmle_keys = KernelOp(
    "ltr_listmle_keys",
    "(Tensor t, Tensor perm, float ind) -> Tensor",
    _listmle_keys,
    lambda t, perm, ind: torch.empty_like(t),
)
