"""Rank-N-Contrast family of the kernel layer (Zha et al., NeurIPS'23), CPU.

* :func:`order` -- every anchor's other views by decreasing label distance (stable) and the last
  position of each group of equal distances, by merging two label-sorted runs per anchor;
* :func:`forward` -- the sum over anchors and positives of ``lse(s[i, S_ij]) - s_ij`` with the
  running log-sum-exps it needs for :func:`backward`;
* :func:`backward` -- ``d total / d s``.

:func:`ready` loads the kernels on first use (as ``RANKWISE_NUMBA`` allows).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rankwise._kernels._custom import KernelOp, traced_usable
from rankwise._kernels._loader import Family

__all__ = ["FAMILY", "backward", "forward", "order", "ready"]


def _warm(k: Any) -> None:
    y = torch.tensor([0.5, 1.0, 0.0])
    o, g = _order(y, y, torch.arange(3))
    s = torch.zeros(3, 3)
    _, lcse = _forward(s, o, g)
    _backward(s, o, g, lcse)


FAMILY = Family("rnc", "rankwise._kernels._numba_rnc", _warm, start_after=1, warn=False)


def ready() -> bool:
    """Whether the kernels serve a CPU call (loaded now if needed, as ``RANKWISE_NUMBA`` allows)."""
    if torch.compiler.is_compiling():
        return traced_usable()
    return FAMILY.get(wait=True) is not None


def _k() -> Any:
    k = FAMILY.require()
    if k is None:
        raise RuntimeError("rankwise: the Rank-N-Contrast kernels need numba, which cannot be imported")
    return k


def _order(y_rows: torch.Tensor, y: torch.Tensor, self_cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(m, n - 1) order of every anchor's (labels ``y_rows``, columns ``self_cols``) other views by
    decreasing label distance, and the last position of each tie group; one-dimensional labels."""
    yn = y.detach().contiguous().numpy()
    srt = np.argsort(yn, kind="stable")  # NaN last
    m, n = y_rows.shape[0], yn.shape[0]
    out = np.empty((m, n - 1), np.int64)
    gend = np.empty((m, n - 1), np.int64)
    _k().rnc_order(y_rows.detach().contiguous().numpy(), yn, self_cols.contiguous().numpy(), srt, out, gend)
    return torch.from_numpy(out), torch.from_numpy(gend)


def _forward(s: torch.Tensor, order: torch.Tensor, gend: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(total, lcse)``: the float64 0-d sum of the terms and the running log-sum-exps."""
    lcse = np.empty(tuple(order.shape), np.float64)
    total = _k().rnc_forward(s.detach().contiguous().numpy(), order.numpy(), gend.numpy(), lcse)
    return torch.tensor(total, dtype=torch.float64), torch.from_numpy(lcse)


def _backward(s: torch.Tensor, order: torch.Tensor, gend: torch.Tensor, lcse: torch.Tensor) -> torch.Tensor:
    """``d total / d s`` (shape and dtype of ``s``)."""
    g = torch.empty(s.shape, dtype=s.dtype)
    _k().rnc_backward(s.detach().contiguous().numpy(), order.numpy(), gend.numpy(), lcse.numpy(), g.numpy())
    return g


def _order_fake(y_rows: torch.Tensor, y: torch.Tensor, self_cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (y_rows.shape[0], y.shape[0] - 1)
    return y.new_empty(shape, dtype=torch.int64), y.new_empty(shape, dtype=torch.int64)


order = KernelOp("rnc_order", "(Tensor y_rows, Tensor y, Tensor self_cols) -> (Tensor, Tensor)", _order, _order_fake)
forward = KernelOp(
    "rnc_forward",
    "(Tensor s, Tensor order, Tensor gend) -> (Tensor, Tensor)",
    _forward,
    lambda s, order, gend: (s.new_empty((), dtype=torch.float64), s.new_empty(order.shape, dtype=torch.float64)),
)
backward = KernelOp(
    "rnc_backward",
    "(Tensor s, Tensor order, Tensor gend, Tensor lcse) -> Tensor",
    _backward,
    lambda s, order, gend, lcse: s.new_empty(s.shape),
)
