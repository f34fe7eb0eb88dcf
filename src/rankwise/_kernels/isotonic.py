"""Isotonic family of the kernel layer: pool-adjacent-violators (PAV) soft rank / soft sort on CPU.

The typed interface of :mod:`rankwise.ops.isotonic` (which keeps the autograd Functions, the
validation and the torch path used on other devices). Every function takes and returns CPU
tensors; rows are the last dim of a 2-D tensor:

* :func:`ready` -- whether the kernels serve a CPU call on ``rows x n`` now;
* :func:`rank_forward` / :func:`rank_backward` -- ascending soft ranks of ``x / eps`` (negated for
  descending) in one fused pass per row (sort, gather, PAV, scatter), and its vector-Jacobian
  product; :func:`rank_forward_checked` (eager) also returns the inputs' magnitude, read in the
  same pass;
* :func:`sort_forward` / :func:`sort_backward` -- the same for the soft sort;
* :func:`pav` / :func:`pav_backward` -- the decreasing isotonic regression of sorted rows (the
  projection step alone) and its vector-Jacobian product.

float32 passes over more than :data:`rankwise._kernels._parallel.PARALLEL_MIN_NUMEL` elements run on
torch's OpenMP team with more than one thread; float64 ones on Python threads.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any

import numpy as np
import torch

from rankwise._kernels import _parallel
from rankwise._kernels._custom import KernelOp, traced_usable
from rankwise._kernels._loader import WARMUP_TORCH_MAX, Family

__all__ = [
    "FAMILY",
    "pav",
    "pav_backward",
    "rank_backward",
    "rank_forward",
    "rank_forward_checked",
    "ready",
    "sort_backward",
    "sort_forward",
]

#: float64 inputs below this many elements are sorted in the kernels (numba's merge sort beats
#: torch.sort's overhead); float32 rows are always sorted in the kernels (insertion / radix sort of
#: the float bits: faster than torch's sort at every shape, and no torch op between the passes)
SORT_INSIDE_MAX_NUMEL = 2048
#: float64 rows up to this length are sorted inside the kernels whatever their number (short rows:
#: numba's merge sort per row beats torch's sort)
SORT_INSIDE_MAX_N = int(os.environ.get("RANKWISE_SORT_INSIDE_MAX_N", "128"))
#: with more than one torch thread, float64 rows (2 or more) are sorted inside the kernels at every
#: length: the rows are then split across the threads in ONE parallel region per pass, instead of
#: one per torch op of the sort (each a barrier, costly when other processes share the cores)
SORT_INSIDE_WHEN_THREADED = True


def _sort_inside(rows: int, n: int, dtype: torch.dtype) -> bool:
    if dtype == torch.float32 or rows * n < SORT_INSIDE_MAX_NUMEL or n <= SORT_INSIDE_MAX_N:
        return True
    return SORT_INSIDE_WHEN_THREADED and rows > 1 and torch.get_num_threads() > 1


def _warm(k: Any) -> None:
    """Read (or compile) the float32 specializations the operators use, through the interface."""
    _parallel.find_gomp()
    x = torch.tensor([[0.3, -1.2, 0.7], [2.0, 0.1, -0.4]])
    g = torch.ones_like(x)
    for kl in (False, True):
        out, z, perm, ids = rank_forward(x, 1.0, False, kl)
        rank_backward(g, z, perm, ids, out, kl, 1.0)
        out, perm, ids = sort_forward(x, 1.0, True, kl)
        sort_backward(g, x, perm, ids, True, kl)


FAMILY = Family("isotonic", "rankwise._kernels._numba_isotonic", _warm, start_after=2, warn=True)


def ready(rows: int, n: int, *, call: bool = True) -> bool:
    """Whether the kernels serve a CPU call on ``rows x n`` now (see :mod:`rankwise._kernels._loader`:
    in "background" mode inputs above ``WARMUP_TORCH_MAX`` rows * n^2 wait for them); ``call``: an
    operator call (counted towards the background load), not a step inside one."""
    if torch.compiler.is_compiling():
        return traced_usable()
    if FAMILY.loaded:
        return True
    return FAMILY.get(wait=rows * n * n > WARMUP_TORCH_MAX, call=call) is not None


def _nb() -> Any:
    k = FAMILY.require()
    if k is None:
        raise RuntimeError("rankwise: the isotonic kernels need numba, which cannot be imported")
    return k


@functools.lru_cache(maxsize=64)
def _rank_weights(n: int, kl: bool) -> torch.Tensor:
    """``rho = (n, ..., 1)`` (or ``log rho`` for kl) as a float64 (1, n) row (read-only use)."""
    rho = torch.arange(n, 0, -1, dtype=torch.float64).unsqueeze(0)
    return torch.log(rho) if kl else rho


@functools.lru_cache(maxsize=64)
def _rank_weights_np(n: int, kl: bool) -> np.ndarray:
    """:func:`_rank_weights` as a NumPy array (read-only use; cached: no conversion per call)."""
    return _rank_weights(n, kl).numpy()


@functools.lru_cache(maxsize=64)
def _sort_targets(n: int, dtype: torch.dtype, eps: float) -> torch.Tensor:
    """``rho / eps`` as a (1, n) row, as the composite soft sort computes it (read-only use)."""
    return (torch.arange(n, 0, -1, dtype=dtype) / eps).unsqueeze(0)


def _plain(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` detached, in ``dtype`` and contiguous (no op where it is already)."""
    if t.dtype != dtype:
        t = t.to(dtype)
    if t.requires_grad:
        t = t.detach()
    return t if t.is_contiguous() else t.contiguous()


# --------------------------------------------------------------------------------------------------
# soft rank
# --------------------------------------------------------------------------------------------------
def rank_forward_checked(
    x: torch.Tensor, eps: float, descending: bool, kl: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float, bool]:
    """Ascending soft ranks of the rows of ``x / eps`` (``-x / eps`` when ``descending``):
    ``(out, z, perm, ids, magnitude, finite)`` with ``z`` the divided input, ``perm`` its decreasing
    order and ``ids`` the PAV blocks (what :func:`rank_backward` needs); ``magnitude``: the largest
    ``|x|`` over the rows holding no NaN or inf (0.0 when there is none), ``finite``: whether every
    entry is finite -- read by the kernel while it divides (the caller's magnitude check at no extra
    pass). Eager only (:func:`rank_forward` is the traceable entry point)."""
    nb = _nb()
    xc = x.detach()
    if not xc.is_contiguous():
        xc = xc.contiguous()
    rows, n = xc.shape
    div = -eps if descending else eps
    wn = _rank_weights_np(n, kl)  # float64 for every input dtype (one specialization)
    out = torch.empty((rows, n), dtype=xc.dtype)
    # the internal buffers (saved for backward, never handed to the user) are allocated by numpy:
    # cheaper per call than torch.empty + .numpy() at small sizes
    idn = np.empty((rows, n), np.int64)
    x_max = np.empty(rows, np.float64)  # row maxima of |x| (NaN / inf: the row is not finite)
    on, x_np = out.numpy(), xc.numpy()
    threads = _parallel.team_threads(rows, rows * n, xc.dtype)
    if threads:  # float32: divide and sort in the kernel, rows on torch's OpenMP team
        z = torch.empty((rows, n), dtype=xc.dtype)
        perm, ids = torch.empty((rows, n), dtype=torch.int64), torch.from_numpy(idn)
        operands = [z, perm, wn.ctypes.data, out, ids, xc, kl, x_max.ctypes.data]
        _parallel.run_task(nb.RANK_FORWARD, rows, n, threads, operands, div)
    elif _sort_inside(rows, n, xc.dtype):  # divide and sort in the kernel too (no torch ops)
        zn, pn = np.empty((rows, n), x_np.dtype), np.empty((rows, n), np.int64)
        dv = x_np.dtype.type(div)
        if _parallel.serial(rows, rows * n):
            nb.soft_rank_forward(zn, pn, wn, kl, on, idn, x_np, dv, x_max)
        else:
            _parallel.over_rows(
                rows,
                rows * n,
                lambda a, b: nb.soft_rank_forward(
                    zn[a:b], pn[a:b], wn, kl, on[a:b], idn[a:b], x_np[a:b], dv, x_max[a:b]
                ),
            )
        z, perm, ids = torch.from_numpy(zn), torch.from_numpy(pn), torch.from_numpy(idn)
    else:
        z = (xc / div).contiguous()
        perm = torch.sort(z, dim=-1, descending=True, stable=True).indices.contiguous()
        ids = torch.from_numpy(idn)
        zn, pn = z.numpy(), perm.numpy()
        _parallel.over_rows(
            rows,
            rows * n,
            lambda a, b: nb.soft_rank_forward(zn[a:b], pn[a:b], wn, kl, on[a:b], idn[a:b], None, 1.0, x_max),
        )
        np.abs(x_np).max(axis=-1, out=x_max)  # (NaN propagates, as in the kernel)
    magnitude = float(x_max[0]) if rows == 1 else float(x_max.max())
    finite = math.isfinite(magnitude)
    if not finite:  # the rare path: the largest |x| of the finite rows only
        kept = x_max[np.isfinite(x_max)]
        magnitude = float(kept.max()) if kept.size else 0.0
    return out, z, perm, ids, magnitude, finite


def _rank_forward(
    x: torch.Tensor, eps: float, descending: bool, kl: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`rank_forward_checked` without the magnitude check."""
    return rank_forward_checked(x, eps, descending, kl)[:4]


def _rank_backward(
    grad: torch.Tensor,
    z: torch.Tensor,
    perm: torch.Tensor,
    ids: torch.Tensor,
    out: torch.Tensor,
    kl: bool,
    scale: float,
) -> torch.Tensor:
    """Gradient of the soft ranks on ``z``, times ``scale`` (``±1 / eps``: the gradient on ``x``)."""
    nb = _nb()
    rows, n = z.shape
    g = _plain(grad, z.dtype)
    grad_x = torch.empty_like(z)
    threads = _parallel.team_threads(rows, rows * n, z.dtype)
    if threads:
        _parallel.run_task(nb.RANK_BACKWARD, rows, n, threads, [g, z, perm, ids, out, grad_x, kl], scale)
        return grad_x
    gn, zn, pn, idn, on, gx = g.numpy(), z.numpy(), perm.numpy(), ids.numpy(), out.numpy(), grad_x.numpy()
    if _parallel.serial(rows, rows * n):
        nb.soft_rank_backward(gn, zn, pn, idn, on, kl, scale, gx)
        return grad_x
    _parallel.over_rows(
        rows,
        rows * n,
        lambda a, b: nb.soft_rank_backward(gn[a:b], zn[a:b], pn[a:b], idn[a:b], on[a:b], kl, scale, gx[a:b]),
    )
    return grad_x


# --------------------------------------------------------------------------------------------------
# soft sort
# --------------------------------------------------------------------------------------------------
def _sort_forward(
    x: torch.Tensor, eps: float, descending: bool, kl: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Soft sort of the rows of ``x``: ``(out, perm, ids)`` (``perm``: the decreasing order of
    ``x``, of ``-x`` when ascending; ``ids``: the PAV blocks)."""
    nb = _nb()
    xc = x.detach().contiguous()
    rows, n = xc.shape
    sign = 1.0 if descending else -1.0  # ascending sort = -(descending sort of -x)
    s = _sort_targets(n, xc.dtype, eps)
    x_np = xc.numpy()
    out = torch.empty((rows, n), dtype=xc.dtype)
    ids = torch.empty((rows, n), dtype=torch.int64)
    perm = torch.empty((rows, n), dtype=torch.int64)
    sn, on, idn, pn = s.numpy(), out.numpy(), ids.numpy(), perm.numpy()
    threads = _parallel.team_threads(rows, rows * n, xc.dtype)
    if threads:  # float32: sort in the kernel, rows on torch's OpenMP team
        _parallel.run_task(nb.SORT_FORWARD, rows, n, threads, [xc, perm, s, out, ids, kl], sign)
    elif _sort_inside(rows, n, xc.dtype):  # sort in the kernel too
        _parallel.over_rows(
            rows,
            rows * n,
            lambda a, b: nb.soft_sort_forward(x_np[a:b], pn[a:b], sign, sn, kl, on[a:b], idn[a:b], True),
        )
    else:
        perm.copy_(torch.sort(xc if descending else -xc, dim=-1, descending=True, stable=True).indices)
        _parallel.over_rows(
            rows,
            rows * n,
            lambda a, b: nb.soft_sort_forward(x_np[a:b], pn[a:b], sign, sn, kl, on[a:b], idn[a:b], False),
        )
    return out, perm, ids


def _sort_backward(
    grad: torch.Tensor, x: torch.Tensor, perm: torch.Tensor, ids: torch.Tensor, descending: bool, kl: bool
) -> torch.Tensor:
    """Gradient of the soft sort on ``x``."""
    nb = _nb()
    rows, n = x.shape
    sign = 1.0 if descending else -1.0
    xc = x.detach().contiguous()
    g = grad.detach().to(xc.dtype).contiguous()
    grad_x = torch.empty((rows, n), dtype=xc.dtype)
    threads = _parallel.team_threads(rows, rows * n, xc.dtype)
    if threads:
        _parallel.run_task(nb.SORT_BACKWARD, rows, n, threads, [g, xc, perm, ids, grad_x, kl], sign)
        return grad_x
    gn, xn, pn, idn, gx = g.numpy(), xc.numpy(), perm.numpy(), ids.numpy(), grad_x.numpy()
    _parallel.over_rows(
        rows, rows * n, lambda a, b: nb.soft_sort_backward(gn[a:b], xn[a:b], pn[a:b], idn[a:b], sign, kl, gx[a:b])
    )
    return grad_x


# --------------------------------------------------------------------------------------------------
# the projection alone (sorted rows)
# --------------------------------------------------------------------------------------------------
def _pav(s: torch.Tensor, w: torch.Tensor, kl: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``mu = s - v`` and the block ids of the decreasing isotonic regression ``v`` of the
    decreasingly sorted rows of ``s`` with ``w`` ((rows, n) or (1, n))."""
    nb = _nb()
    s_np = s.detach().contiguous().numpy()
    w_np = w.detach().to(s.dtype).contiguous().numpy()
    mu = torch.empty(s.shape, dtype=s.dtype)
    ids = torch.empty(s.shape, dtype=torch.int64)
    (nb.pav_kl if kl else nb.pav_l2)(s_np, w_np, mu.numpy(), ids.numpy())
    return mu, ids


def _pav_backward(
    grad: torch.Tensor, s: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, kl: bool, need_s: bool, need_w: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of ``mu`` on ``s`` and ``w`` (a (1, 1) placeholder where not ``need_*``; the
    gradient on a shared (1, n) ``w`` is summed over the rows)."""
    nb = _nb()
    g = grad.detach().to(s.dtype).contiguous()
    gs = torch.empty_like(g) if need_s else torch.empty((1, 1), dtype=s.dtype)
    gw = torch.zeros(w.shape, dtype=s.dtype) if need_w else torch.empty((1, 1), dtype=s.dtype)
    nb.pav_backward(
        g.numpy(),
        s.detach().contiguous().numpy(),
        w.detach().to(s.dtype).contiguous().numpy(),
        ids.numpy(),
        kl,
        need_s,
        need_w,
        gs.numpy(),
        gw.numpy(),
    )
    return gs, gw


# --------------------------------------------------------------------------------------------------
# the interface (custom operators when traced)
# --------------------------------------------------------------------------------------------------
def _like(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    return x.new_empty(x.shape, dtype=dtype or x.dtype)


def _rank_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    _, eps, descending, kl = inputs
    out, z, perm, ids = output
    ctx.save_for_backward(z, perm, ids, out)
    ctx.cfg = ((-1.0 if descending else 1.0) / eps, kl)


def _rank_vjp(ctx: Any, grad: torch.Tensor, *_: Any) -> tuple[Any, ...]:
    z, perm, ids, out = ctx.saved_tensors
    scale, kl = ctx.cfg
    return rank_backward(grad, z, perm, ids, out, kl, scale), None, None, None


def _sort_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    x, _, descending, kl = inputs
    _, perm, ids = output
    ctx.save_for_backward(x, perm, ids)
    ctx.cfg = (descending, kl)


def _sort_vjp(ctx: Any, grad: torch.Tensor, *_: Any) -> tuple[Any, ...]:
    x, perm, ids = ctx.saved_tensors
    descending, kl = ctx.cfg
    return sort_backward(grad, x, perm, ids, descending, kl), None, None, None


rank_forward = KernelOp(
    "isotonic_rank_forward",
    "(Tensor x, float eps, bool descending, bool kl) -> (Tensor, Tensor, Tensor, Tensor)",
    _rank_forward,
    lambda x, eps, descending, kl: (_like(x), _like(x), _like(x, torch.int64), _like(x, torch.int64)),
    backward=_rank_vjp,
    setup_context=_rank_setup,
)
rank_backward = KernelOp(
    "isotonic_rank_backward",
    "(Tensor grad, Tensor z, Tensor perm, Tensor ids, Tensor out, bool kl, float scale) -> Tensor",
    _rank_backward,
    lambda grad, z, perm, ids, out, kl, scale: _like(z),
)
sort_forward = KernelOp(
    "isotonic_sort_forward",
    "(Tensor x, float eps, bool descending, bool kl) -> (Tensor, Tensor, Tensor)",
    _sort_forward,
    lambda x, eps, descending, kl: (_like(x), _like(x, torch.int64), _like(x, torch.int64)),
    backward=_sort_vjp,
    setup_context=_sort_setup,
)
sort_backward = KernelOp(
    "isotonic_sort_backward",
    "(Tensor grad, Tensor x, Tensor perm, Tensor ids, bool descending, bool kl) -> Tensor",
    _sort_backward,
    lambda grad, x, perm, ids, descending, kl: _like(x),
)
pav = KernelOp(
    "isotonic_pav",
    "(Tensor s, Tensor w, bool kl) -> (Tensor, Tensor)",
    _pav,
    lambda s, w, kl: (_like(s), _like(s, torch.int64)),
)


def _pav_backward_fake(
    grad: torch.Tensor, s: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, kl: bool, need_s: bool, need_w: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    one = s.new_empty((1, 1))
    return (_like(s) if need_s else one), (w.new_empty(w.shape, dtype=s.dtype) if need_w else s.new_empty((1, 1)))


pav_backward = KernelOp(
    "isotonic_pav_backward",
    "(Tensor grad, Tensor s, Tensor w, Tensor ids, bool kl, bool need_s, bool need_w) -> (Tensor, Tensor)",
    _pav_backward,
    _pav_backward_fake,
)
