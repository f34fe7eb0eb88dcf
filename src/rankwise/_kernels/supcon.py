"""SupCon family of the kernel layer: the per-element work of the small-batch one-pass SupCon path
(:class:`rankwise.losses._supcon._SupConOutSmall`) in one numba call on CPU.

:func:`ready` says whether the kernel serves a call now ("background" loading starts at the first
call, see :mod:`rankwise._kernels._loader`); :func:`supcon_out` computes the target weights, the loss
value and the logit gradient ``W`` (or ``W + W^T``), written in place over ``prob``.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from rankwise._kernels._custom import KernelOp, traced_usable
from rankwise._kernels._loader import Family

__all__ = ["FAMILY", "ready", "supcon_out"]

logger = logging.getLogger(__name__)


def _warm(k: Any) -> None:
    one = np.full((2, 2), 0.5, dtype=np.float32)  # compiles (or reads) the float32 version
    k.supcon_out(one.copy(), one.copy(), np.ones((1, 1), dtype=np.float32), 2, 2, 1.0, 2)


FAMILY = Family("supcon", "rankwise._kernels._numba_supcon", _warm, start_after=1, warn=False)


def ready() -> bool:
    """Whether :func:`supcon_out` runs the numba kernel now (else the caller uses torch ops)."""
    if torch.compiler.is_compiling():
        return traced_usable()
    return FAMILY.get() is not None


def _supcon_out(
    prob: torch.Tensor, logits: torch.Tensor, mask: torch.Tensor, v: int, va: int, scale: float, out: int
) -> torch.Tensor:
    """The loss value (a 0-d tensor of the dtype of ``logits``) of the (m, N) softmax ``prob`` of
    ``logits`` with the (B, B) positive mask; ``out`` (0 value only, 1 ``W``, 2 ``W + W^T``, 3 the
    same from symmetric logits) says what is written over ``prob`` (contiguous CPU tensors)."""
    k = FAMILY.require()
    if k is None:
        raise RuntimeError("rankwise: the SupCon kernel needs numba, which cannot be imported")
    total = k.supcon_out(prob.numpy(), logits.detach().numpy(), mask.numpy(), v, va, scale, out)
    return torch.tensor(total, dtype=logits.dtype)


supcon_out = KernelOp(
    "supcon_out",
    "(Tensor(a!) prob, Tensor logits, Tensor mask, int v, int va, float scale, int out) -> Tensor",
    _supcon_out,
    lambda prob, logits, mask, v, va, scale, out: logits.new_empty(()),
    mutates=("prob",),
)
