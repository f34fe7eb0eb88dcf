"""RankSim family of the kernel layer: the label ranks of RankSim (Gong et al., ICML'22) on CPU.

:func:`label_distance_ranks` gives, per anchor label, the ordinal ranks that
``rankwise.rank(where(keep, -|y_rows[:, None] - y|, -inf), descending=True)`` gives, by merging the
two label-sorted runs on either side of the anchor's label (O(B) per row after one sort of the
labels) instead of sorting every row. :func:`ready` loads the kernel on first use.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rankwise._kernels._custom import KernelOp, traced_usable
from rankwise._kernels._loader import Family

__all__ = ["FAMILY", "label_distance_ranks", "ready"]


def _warm(k: Any) -> None:
    y = np.array([0.5, 1.0, 0.0], np.float32)
    keep = np.ones(3, np.bool_)
    k.label_distance_ranks(y, y, keep, np.argsort(y, kind="stable"), np.empty((3, 3), np.float32))


FAMILY = Family("ranksim", "rankwise._kernels._numba_ranksim", _warm, start_after=1, warn=False)


def ready() -> bool:
    """Whether the kernel serves a CPU call (loaded now if needed, as ``RANKWISE_NUMBA`` allows)."""
    if torch.compiler.is_compiling():
        return traced_usable()
    return FAMILY.get(wait=True) is not None


def _label_distance_ranks(y_rows: torch.Tensor, y: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """(rows, B) ordinal ranks (in the dtype of ``y``) of ``-|y_rows[:, None] - y|`` descending, the
    columns ``keep == False`` last; stable ties, NaN first."""
    k = FAMILY.require()
    if k is None:
        raise RuntimeError("rankwise: the RankSim kernel needs numba, which cannot be imported")
    yn, kn = y.detach().contiguous().numpy(), keep.contiguous().numpy()
    kept = np.flatnonzero(kn)
    order = kept[np.argsort(yn[kept], kind="stable")]  # NaN labels last
    out = np.empty((y_rows.shape[0], yn.shape[0]), dtype=yn.dtype)
    k.label_distance_ranks(y_rows.detach().contiguous().numpy(), yn, kn, order, out)
    return torch.from_numpy(out)


label_distance_ranks = KernelOp(
    "ranksim_label_ranks",
    "(Tensor y_rows, Tensor y, Tensor keep) -> Tensor",
    _label_distance_ranks,
    lambda y_rows, y, keep: y.new_empty((y_rows.shape[0], y.shape[0])),
)
