"""Input handling shared by the contrastive losses (private)."""

from __future__ import annotations

from typing import Literal

import torch

from rankwise._validation import check_choice, check_floating, check_tensor, to_compute
from rankwise.distributed import BatchLayout

Reduction = Literal["mean", "sum", "none"]
REDUCTIONS = ("mean", "sum", "none")


def as_views(features: torch.Tensor, name: str = "features", *, normalize: bool = False) -> torch.Tensor:
    """``features`` (B, D) or (B, V, D) -> (B, V, D) in the compute dtype, L2-normalized if asked."""
    check_floating(features, name)
    if features.dim() == 2:
        features = features.unsqueeze(1)
    elif features.dim() != 3:
        raise ValueError(
            f"`{name}` must have shape (B, D) or (B, V, D), got shape {tuple(features.shape)} ({features.dim()} dims)"
        )
    x = to_compute(features)
    if normalize:
        x = safe_normalize(x)
    return x


def robust_norm(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``torch.linalg.vector_norm(x, dim=dim, keepdim=True)`` computed as ``s * |x / s|`` with ``s`` the
    (detached) largest ``|x|`` of the vector: no overflow of the squares at ``|x| ~ 1e20`` in float32
    (inf, then cosine similarities of 0) nor underflow at ``1e-20`` (a norm of 0). Same gradient."""
    s = x.detach().abs().amax(dim=dim, keepdim=True)
    s = torch.where((s > 0) & torch.isfinite(s), s, torch.ones_like(s))
    return s * torch.linalg.vector_norm(x / s, dim=dim, keepdim=True)


def safe_normalize(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``F.normalize(x, dim)`` with a zero (not ``1 / 1e-12``) gradient at an all-zero vector.

    ``F.normalize`` divides by ``max(|x|, 1e-12)``, so an exactly-zero feature vector (a dead ReLU
    layer, or zero-padding) gets gradients of order 1e12: finite in float32, ``inf`` once cast back
    to float16. Its value is 0 either way. The norm is :func:`robust_norm` (any finite magnitude).
    """
    norm = robust_norm(x, dim)
    nonzero = norm > 0
    return torch.where(nonzero, x / torch.where(nonzero, norm, torch.ones_like(norm)), torch.zeros_like(x))


def as_labels(labels: torch.Tensor, batch: int, name: str = "labels", *, allow_multi: bool = False) -> torch.Tensor:
    """``labels`` (B,) or (B, 1) [or (B, K) when ``allow_multi``] -> (B,) or (B, K)."""
    check_tensor(labels, name)
    if labels.dim() == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if labels.dim() == 2 and not allow_multi:
        raise ValueError(f"`{name}` must have shape (B,) or (B, 1), got shape {tuple(labels.shape)}")
    if labels.dim() not in (1, 2):
        want = "(B,), (B, 1) or (B, K)" if allow_multi else "(B,) or (B, 1)"
        raise ValueError(f"`{name}` must have shape {want}, got shape {tuple(labels.shape)}")
    if labels.shape[0] != batch:
        raise ValueError(f"`{name}` must have {batch} rows (the batch size of `features`), got {labels.shape[0]}")
    if labels.is_complex():
        raise TypeError(f"`{name}` must be a real tensor, got dtype {labels.dtype}")
    return labels


def sample_mask(mask: torch.Tensor, batch: int, name: str = "mask") -> torch.Tensor:
    """Validate a (B, B) positive mask and return it as bool."""
    check_tensor(mask, name)
    if mask.shape != (batch, batch):
        raise ValueError(f"`{name}` must have shape ({batch}, {batch}) (B x B), got shape {tuple(mask.shape)}")
    return mask.detach() != 0


def sq_dist(z: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Squared Euclidean distances (>= 0) of the rows ``rows`` of ``z`` (all when ``None``) to every row."""
    z = z - z.mean(0, keepdim=True).detach()  # translation-invariant; reduces cancellation
    sq = (z * z).sum(-1)
    if rows is None:
        return (sq[:, None] + sq[None, :] - 2 * (z @ z.T)).clamp_min(0)
    return (sq[rows][:, None] + sq[None, :] - 2 * (z[rows] @ z.T)).clamp_min(0)


def local_view_rows(layout: BatchLayout, v: int, device: torch.device) -> torch.Tensor:
    """View-major row indices (view ``k`` of sample ``s`` is row ``k * total + s``) of this rank's samples."""
    samples = torch.arange(layout.start, layout.stop, device=device)
    return (torch.arange(v, device=device)[:, None] * layout.total + samples[None, :]).reshape(-1)


def reduce(loss: torch.Tensor, valid: torch.Tensor, reduction: str) -> torch.Tensor:
    """Mean over ``valid`` anchors (0 with graph when none), sum, or the per-anchor vector."""
    check_choice(reduction, "reduction", REDUCTIONS)
    loss = torch.where(valid, loss, torch.zeros_like(loss))
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / valid.sum().clamp(min=1).to(loss.dtype)


def zero_with_graph(*tensors: torch.Tensor) -> torch.Tensor:
    """A 0-d zero connected to the graph of every floating tensor given."""
    out: torch.Tensor | None = None
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            z = to_compute(t).sum() * 0
            out = z if out is None else out + z
    if out is None:
        raise ValueError("zero_with_graph needs a floating tensor")
    return out
