"""Top-k accuracy of class scores."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rankwise._validation import check_class_logits

__all__ = ["topk_accuracy"]


def _check_ks(ks: int | Sequence[int], n_classes: int) -> tuple[tuple[int, ...], bool]:
    single = isinstance(ks, int) and not isinstance(ks, bool)
    values = (ks,) if single else ks
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) == 0:
        raise TypeError(f"`ks` must be an int or a non-empty sequence of ints, got {ks!r}")
    out = []
    for k in values:
        if isinstance(k, bool) or not isinstance(k, int):
            raise TypeError(f"`ks` must hold ints, got {ks!r}")
        if not 1 <= k <= n_classes:
            raise ValueError(f"`ks` must hold values in [1, {n_classes}] (the number of classes), got {ks!r}")
        out.append(k)
    return tuple(out), single


def topk_accuracy(logits: torch.Tensor, targets: torch.Tensor, *, ks: int | Sequence[int] = (1, 5)) -> torch.Tensor:
    r"""Fraction of examples whose target class is among the ``k`` highest logits, for each ``k`` in ``ks``.

    The classes of a row are ordered by descending logit, ties broken by the lower class index first
    (the order of ``torch.sort(logits, descending=True, stable=True)``; a NaN logit counts as the
    largest, as there): the target :math:`t` is in the top ``k`` iff

    .. math::
        \#\{j : z_j > z_t\} + \#\{j < t : z_j = z_t\} < k,

    so the result never depends on how ``torch.topk`` happens to break ties.

    Returns fractions in ``[0, 1]`` (as ``torchmetrics``' ``Accuracy(top_k=k)``, not timm's
    percentages) as one tensor of shape ``(len(ks),)`` in the order of ``ks``, so that
    ``top1, top5 = topk_accuracy(logits, targets)`` unpacks as timm's ``accuracy(output, target,
    topk=(1, 5))`` does; an int ``ks`` gives a 0-d tensor. An empty batch gives NaN (no examples).
    Float32, or float64 for float64 logits; no host sync.

    Args:
        logits: class scores :math:`(*, C)`, floating.
        targets: class indices :math:`(*)`, integer, in ``[0, C)``.
        ks: an int or a sequence of ints in ``[1, C]``.

    Shape:
        - logits: :math:`(*, C)`; targets: :math:`(*)`.
        - output: :math:`(\text{len(ks)},)`, or :math:`()` for an int ``ks``.

    Example:
        >>> import torch
        >>> from rankwise.metrics import topk_accuracy
        >>> logits = torch.tensor([[0.1, 0.5, 0.4], [0.3, 0.3, 0.4], [0.9, 0.05, 0.05]])
        >>> targets = torch.tensor([2, 1, 0])
        >>> topk_accuracy(logits, targets, ks=(1, 2))
        tensor([0.3333, 0.6667])
        >>> topk_accuracy(logits, targets, ks=3)
        tensor(1.)
    """
    check_class_logits(logits, targets)
    n_classes = logits.shape[-1]
    values, single = _check_ks(ks, n_classes)
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    z = logits.detach().reshape(-1, n_classes).to(dtype)
    t = targets.reshape(-1, 1).long()
    zt = z.gather(-1, t)
    nan_j, nan_t = torch.isnan(z), torch.isnan(zt)
    above = (z > zt) | (nan_j & ~nan_t)
    equal = (z == zt) | (nan_j & nan_t)
    before = torch.arange(n_classes, device=z.device).unsqueeze(0) < t
    position = (above | (equal & before)).sum(-1)  # 0-based place of the target in the stable order
    k = torch.tensor(values, device=z.device)
    acc = (position.unsqueeze(-1) < k).to(dtype).mean(0)
    return acc[0] if single else acc
