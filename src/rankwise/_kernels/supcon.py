"""SupCon family of the kernel layer: the per-element work of the small-batch one-pass SupCon path
(:class:`rankwise.losses._supcon._SupConOutSmall`) in one numba call on CPU.

:func:`ready` says whether the kernel serves a call now ("background" loading starts at the first
call, see :mod:`rankwise._kernels._loader`); :func:`supcon_out` computes the target weights, the loss
value and the logit gradient ``W`` (or ``W + W^T``), written in place over ``prob``;
:func:`normalize_rows` and :func:`normalize_rows_backward` are the L2 normalization of float32 views
before the logits and the gradient through it after the gradient matmul (one pass each, the sums in
float64).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from rankwise._kernels._custom import KernelOp, traced_usable
from rankwise._kernels._loader import Family

__all__ = ["FAMILY", "normalize_rows", "normalize_rows_backward", "ready", "supcon_out"]

logger = logging.getLogger(__name__)


def _warm(k: Any) -> None:
    one = np.full((2, 2), 0.5, dtype=np.float32)  # compiles (or reads) the float32 version
    k.supcon_out(one.copy(), one.copy(), np.ones((1, 1), dtype=np.float32), 2, 2, 1.0, 2)
    k.supcon_out(one.copy(), one.copy(), np.ones((1, 1), dtype=np.bool_), 2, 2, 1.0, 2)  # the loss's bool mask
    norm = np.ones((2, 1), dtype=np.float32)
    k.normalize_rows(one, 1.0, one.copy(), one.copy(), norm)
    k.normalize_rows_backward(one.copy(), one, norm)


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
    ``logits`` with the (B, B) positive mask (bool, or 0/1 in any dtype); ``out`` (0 value only, 1
    ``W``, 2 ``W + W^T``, 3 the same from symmetric logits) says what is written over ``prob``
    (contiguous CPU tensors)."""
    k = FAMILY.require()
    if k is None:
        raise RuntimeError("rankwise: the SupCon kernel needs numba, which cannot be imported")
    total = k.supcon_out(prob.numpy(), logits.detach().numpy(), mask.numpy(), v, va, scale, out)
    return torch.scalar_tensor(total, dtype=logits.dtype)  # (a few times cheaper than torch.tensor)


supcon_out = KernelOp(
    "supcon_out",
    "(Tensor(a!) prob, Tensor logits, Tensor mask, int v, int va, float scale, int out) -> Tensor",
    _supcon_out,
    lambda prob, logits, mask, v, va, scale, out: logits.new_empty(()),
    mutates=("prob",),
)


def _normalize_rows(x: torch.Tensor, inv_tau: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(z, z * inv_tau, norm)`` of the float32 (n, d) CPU rows ``x``: ``norm`` (n, 1) their L2 norms
    (squares summed in float64: no overflow or underflow at any finite magnitude; ``inf`` for an
    all-zero row) and ``z = x / norm`` (an all-zero row stays 0)."""
    k = FAMILY.require()
    if k is None:
        raise RuntimeError("rankwise: the SupCon kernel needs numba, which cannot be imported")
    x = x.detach().contiguous()
    z, zs = torch.empty_like(x), torch.empty_like(x)
    norm = x.new_empty(x.shape[0], 1)
    k.normalize_rows(x.numpy(), inv_tau, z.numpy(), zs.numpy(), norm.numpy())
    return z, zs, norm


normalize_rows = KernelOp(
    "supcon_normalize_rows",
    "(Tensor x, float inv_tau) -> (Tensor, Tensor, Tensor)",
    _normalize_rows,
    lambda x, inv_tau: (torch.empty_like(x), torch.empty_like(x), x.new_empty(x.shape[0], 1)),
)


def _normalize_rows_backward(grad: torch.Tensor, z: torch.Tensor, norm: torch.Tensor) -> None:
    """In place: the gradient ``grad`` (n, d) on ``z`` of :func:`normalize_rows` becomes the gradient on
    its input, ``(grad - z (z . grad)) / norm`` (0 for an all-zero row); contiguous float32 CPU tensors."""
    k = FAMILY.require()
    if k is None:
        raise RuntimeError("rankwise: the SupCon kernel needs numba, which cannot be imported")
    k.normalize_rows_backward(grad.numpy(), z.numpy(), norm.numpy())


normalize_rows_backward = KernelOp(
    "supcon_normalize_rows_backward",
    "(Tensor(a!) grad, Tensor z, Tensor norm) -> ()",
    _normalize_rows_backward,
    lambda grad, z, norm: None,
    mutates=("grad",),
)
