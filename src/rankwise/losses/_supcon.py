"""Supervised contrastive loss (SupCon) and SimCLR's NT-Xent, with optional anchor chunking."""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import nn

from rankwise._registry import Example
from rankwise._validation import check_choice, check_positive
from rankwise.distributed import (
    DistributedFlag,
    _global_batch_on,
    all_gather_no_grad,
    all_gather_with_grad,
    all_reduce_sum,
    batch_layout,
    get_world_size,
)
from rankwise.losses._contrastive_common import (
    as_labels,
    as_views,
    local_view_rows,
    random_features,
    sample_mask,
    zero_with_graph,
)
from rankwise.losses._registry import register_loss

__all__ = ["SupConLoss", "supcon_loss"]

ContrastMode = Literal["all", "one"]
_AUTO_BLOCK_ELEMENTS = 1 << 22
Variant = Literal["out", "in"]


def _check_chunk(chunk_size: int | None) -> int | None:
    if chunk_size is None:
        return None
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise TypeError(f"`chunk_size` must be an int or None, got {type(chunk_size).__name__}")
    if chunk_size < 1:
        raise ValueError(f"`chunk_size` must be >= 1, got {chunk_size}")
    return chunk_size


def _block_masks(
    anchor_idx: torch.Tensor, n: int, keys: torch.Tensor, batch: int, use_mask: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(c, N) positives (self excluded) and self masks of a block of anchors, in O(c * N) memory.

    Columns are views in view-major order (column k is sample ``k % batch``); ``anchor_idx`` is the
    column of each anchor itself. ``keys``: a (B, B) bool positive mask when ``use_mask``, else
    per-sample keys (B,) where equal keys are positives.
    """
    cols = torch.arange(n, device=anchor_idx.device)
    col_sample = cols % batch
    row_sample = anchor_idx % batch
    if use_mask:
        pos = keys[row_sample][:, col_sample]
    else:
        pos = keys[row_sample][:, None] == keys[col_sample][None, :]
    is_self = anchor_idx[:, None] == cols[None, :]
    return pos & ~is_self, is_self


def _block_stats_inplace(
    anchors: torch.Tensor,
    contrast: torch.Tensor,
    pos: torch.Tensor,
    is_self: torch.Tensor,
    temperature: float,
    variant: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-anchor loss, validity, lse over A(i), lse over P(i) (mean positive logit for ``"out"``)
    and |P(i)| of a block of anchors (no autograd), reusing one (c, N) buffer in place. Rows without
    a positive are computed on finite values (self not masked) and zeroed."""
    npos = pos.sum(1)
    valid = npos > 0
    npos_f = npos.clamp(min=1).to(anchors.dtype)
    logits = torch.mm(anchors, contrast.T).div_(temperature)
    if variant == "out":
        lse_pos = logits.mul(pos).sum(1).div_(npos_f)  # mean positive logit
    logits.masked_fill_(is_self & valid[:, None], -math.inf)
    lse = torch.logsumexp(logits, dim=1)
    if variant == "out":
        loss = lse - lse_pos
    else:
        lse_pos = torch.logsumexp(logits.masked_fill_(~pos & valid[:, None], -math.inf), dim=1)
        loss = lse - lse_pos + torch.log(npos_f)
    return torch.where(valid, loss, torch.zeros_like(loss)), valid, lse, lse_pos, npos_f


class _ChunkedSupCon(torch.autograd.Function):
    r"""Per-anchor SupCon losses computed block by block, with an analytic blockwise backward.

    Only O(N) statistics per anchor are saved; backward recomputes each block's logits, so the
    peak memory is O(chunk * N) for forward and backward alike. With :math:`P_{ia}` the softmax of
    the logits over :math:`A(i)`, :math:`\partial \ell_i / \partial s_{ia} = P_{ia} - q_{ia}`
    where :math:`q_{ia} = [a \in P(i)] / |P(i)|` (``"out"``) or the softmax over :math:`P(i)` (``"in"``).
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        anchors: torch.Tensor,
        contrast: torch.Tensor,
        keys: torch.Tensor,
        batch: int,
        use_mask: bool,
        temperature: float,
        variant: str,
        chunk: int,
        anchor_cols: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n_anchor, n = anchors.shape[0], contrast.shape[0]
        outs = []
        for start in range(0, n_anchor, chunk):
            idx = _cols(anchor_cols, start, min(start + chunk, n_anchor), anchors.device)
            pos, is_self = _block_masks(idx, n, keys, batch, use_mask)
            outs.append(
                _block_stats_inplace(anchors[start : start + chunk], contrast, pos, is_self, temperature, variant)
            )
        loss, valid, lse, lse_pos, npos = (torch.cat(t) for t in zip(*outs))
        ctx.save_for_backward(anchors, contrast, keys, valid, lse, lse_pos, npos)
        ctx.cfg = (batch, use_mask, temperature, variant, chunk)
        ctx.anchor_cols = anchor_cols
        ctx.mark_non_differentiable(valid)
        return loss, valid

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_loss: torch.Tensor, _grad_valid: Any) -> tuple[Any, ...]:  # type: ignore[override]
        anchors, contrast, keys, valid, lse, lse_pos, npos = ctx.saved_tensors
        batch, use_mask, temperature, variant, chunk = ctx.cfg
        n_anchor, n = anchors.shape[0], contrast.shape[0]
        grad_anchors = torch.zeros_like(anchors)
        grad_contrast = torch.zeros_like(contrast)
        g_all = torch.where(valid, grad_loss.to(anchors.dtype), torch.zeros_like(lse)) / temperature
        for start in range(0, n_anchor, chunk):
            sl = slice(start, min(start + chunk, n_anchor))
            idx = _cols(ctx.anchor_cols, sl.start, sl.stop, anchors.device)
            pos, is_self = _block_masks(idx, n, keys, batch, use_mask)
            a = anchors[sl]
            logits = (a @ contrast.T) / temperature
            if variant == "out":
                q = pos.to(logits.dtype) / npos[sl, None]
            else:
                q = torch.exp(logits - lse_pos[sl, None]).masked_fill_(~pos, 0)
            g = torch.exp_(logits.sub_(lse[sl, None])).masked_fill_(is_self, 0).sub_(q).mul_(g_all[sl, None])
            grad_anchors[sl] = g @ contrast
            grad_contrast.addmm_(g.T, a)
        return grad_anchors, grad_contrast, None, None, None, None, None, None, None


def _cols(anchor_cols: torch.Tensor | None, start: int, stop: int, device: torch.device) -> torch.Tensor:
    """Columns of anchors ``start:stop`` (anchor ``a`` is column ``a`` unless ``anchor_cols`` maps it)."""
    if anchor_cols is None:
        return torch.arange(start, stop, device=device)
    return anchor_cols[start:stop]


def supcon_loss(
    features: torch.Tensor,
    labels: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    *,
    temperature: float = 0.1,
    base_temperature: float | None = None,
    contrast_mode: ContrastMode = "all",
    variant: Variant = "out",
    normalize: bool = True,
    chunk_size: int | None = None,
    distributed: DistributedFlag = False,
) -> torch.Tensor:
    r"""Supervised contrastive loss (Khosla et al., NeurIPS'20); SimCLR's NT-Xent without labels.

    The ``B x V`` views :math:`z_a` (L2-normalized when ``normalize``) are all contrasted with each
    other. For an anchor :math:`i`, :math:`A(i)` is every other view and :math:`P(i) \subset A(i)`
    its positives: views of samples with the same label (``labels``), of samples ``j`` with
    ``mask[i, j] != 0`` (``mask``, may be asymmetric), or — with neither — the other views of the
    same sample (SimCLR NT-Xent, Chen et al. 2020). With :math:`s_{ia} = z_i \cdot z_a / \tau`:

    .. math::
        \ell^{out}_i = -\frac{1}{|P(i)|} \sum_{p \in P(i)}
            \log \frac{e^{s_{ip}}}{\sum_{a \in A(i)} e^{s_{ia}}} \quad\text{(eq. 2, ``variant="out"``)}

        \ell^{in}_i = -\log \Bigl(\frac{1}{|P(i)|} \sum_{p \in P(i)}
            \frac{e^{s_{ip}}}{\sum_{a \in A(i)} e^{s_{ia}}}\Bigr) \quad\text{(eq. 3, ``variant="in"``)}

    The loss is :math:`\frac{\tau}{\tau_b}` times the mean of :math:`\ell_i` over the anchors that
    have at least one positive (``base_temperature`` :math:`\tau_b`, ``None`` = ``temperature``, so
    the factor is 1 by default). ``contrast_mode="all"`` uses every view as an anchor, ``"one"``
    only view 0 (the contrast set is always all views). Everything is computed with ``logsumexp``
    (self excluded by ``-inf`` masking), so large unnormalized features, ``temperature=0.01`` and
    half precision give finite values.

    Differences from the public SupCon code: features are normalized here by default (the public
    loss expects normalized input and gives NaN otherwise); anchors without any positive are
    *excluded* from the mean (the public code averages in zeros, pytorch-metric-learning excludes
    them); a batch without any positive gives ``0`` that keeps the graph.

    The loss is a custom autograd function that saves only per-anchor statistics and computes
    the analytic gradient (``softmax - target`` on the logits) in backward, recomputing the
    logits: about half the time and a fraction of the memory of autograd through the masked
    formula. Only first-order gradients are supported (double backward raises). ``chunk_size``
    processes the anchors in blocks of that many rows, forward and backward, so that peak memory
    is :math:`O(\text{chunk\_size} \cdot BV)` instead of :math:`O((BV)^2)`; the value and gradient
    are the same for every block size up to floating-point rounding. ``chunk_size=None`` picks
    blocks of about :math:`2^{22}` logits (``2**22 // (B V)`` anchors; a single block for
    ``B V <= 2048``), which is also faster than one huge block.

    ``distributed=True`` / ``"auto"`` (see :mod:`rankwise.distributed`): the views (with gradient)
    and labels of all ranks are gathered; the anchors are this rank's views and :math:`A(i)`,
    :math:`P(i)` range over the **global** batch (without labels, the positives are the other
    views of the same sample, as in a single process). With :math:`V_g` the number of anchors
    with a positive over all ranks (an ``all_reduce``, no host sync), each rank returns
    ``world_size * (tau / tau_b) * (sum of its anchors' losses) / V_g``: the mean over ranks of
    the returned values is the single-process loss on the concatenated batch, and DDP's gradient
    averaging gives the single-process gradient. ``mask`` is not supported then (pass labels).

    Args:
        features: (B, V, D) views, or (B, D) for a single view.
        labels: (B,) or (B, 1) class labels (any dtype comparable with ``==``). Not with ``mask``.
        mask: (B, B) positives between samples (non-zero = positive). Not with ``labels``.
        temperature: :math:`\tau > 0` (0.1 for SupCon, 0.5 for SimCLR in the public recipes).
        base_temperature: :math:`\tau_b > 0` or ``None``.
        contrast_mode: ``"all"`` or ``"one"``.
        variant: ``"out"`` (recommended) or ``"in"``.
        normalize: L2-normalize the features along the last dim first.
        chunk_size: anchors per block, or ``None`` for automatic blocks of about ``2**22`` logits.
        distributed: ``False`` (local batch), ``True`` or ``"auto"`` (global batch under DDP).

    Shape:
        - features: :math:`(B, V, D)` or :math:`(B, D)`.
        - output: scalar; float32 for float16/bfloat16 input, otherwise the dtype of ``features``.

    Example:
        >>> import torch, rankwise
        >>> g = torch.Generator().manual_seed(0)
        >>> feats = torch.randn(4, 2, 8, generator=g, requires_grad=True)
        >>> loss = rankwise.losses.supcon_loss(feats, torch.tensor([0, 1, 0, 1]))
        >>> loss.backward()
        >>> bool(loss > 0), feats.grad.shape
        (True, torch.Size([4, 2, 8]))
        >>> simclr = rankwise.losses.supcon_loss(feats, temperature=0.5)  # no labels: NT-Xent
    """
    tau = check_positive(temperature, "temperature")
    tau_b = tau if base_temperature is None else check_positive(base_temperature, "base_temperature")
    check_choice(contrast_mode, "contrast_mode", ("all", "one"))
    check_choice(variant, "variant", ("out", "in"))
    chunk = _check_chunk(chunk_size)
    if labels is not None and mask is not None:
        raise ValueError("`labels` and `mask` cannot both be given; pass one of them (or neither for SimCLR)")
    x = as_views(features, normalize=normalize)
    b, v, d = x.shape
    if _global_batch_on(distributed):
        if mask is not None:
            raise ValueError("`mask` is not supported with `distributed` on; pass `labels` (or neither for SimCLR)")
        y = None if labels is None else as_labels(labels, b).detach()
        return _supcon_global(x, y, tau, tau_b, contrast_mode, variant, chunk)
    if mask is not None:
        keys, use_mask = sample_mask(mask, b), True
    elif labels is not None:
        keys, use_mask = as_labels(labels, b).detach(), False
    else:
        keys, use_mask = torch.arange(b, device=x.device), False
    n = b * v
    if n == 0:
        return zero_with_graph(features)
    contrast = x.transpose(0, 1).reshape(n, d)  # view-major: column k is view k // B of sample k % B
    n_anchor = n if contrast_mode == "all" else b
    anchors = contrast[:n_anchor]
    # default: blocks of about 4M logits (one block for smaller problems) -- cache/memory friendly
    block = max(1, _AUTO_BLOCK_ELEMENTS // n) if chunk is None else chunk
    block = min(block, n_anchor)
    loss, valid = _ChunkedSupCon.apply(anchors, contrast, keys, b, use_mask, tau, variant, block)
    total = loss.sum() / valid.sum().clamp(min=1).to(loss.dtype)
    return total * (tau / tau_b)


def _supcon_global(
    x: torch.Tensor,
    labels: torch.Tensor | None,
    tau: float,
    tau_b: float,
    contrast_mode: str,
    variant: str,
    chunk: int | None,
) -> torch.Tensor:
    """Distributed SupCon: this rank's anchors against the gathered views of all ranks."""
    world = get_world_size()
    b, v, d = x.shape
    layout = batch_layout(b, device=x.device)
    xg = all_gather_with_grad(x, sizes=layout)
    bg = layout.total
    keys = torch.arange(bg, device=x.device) if labels is None else all_gather_no_grad(labels, sizes=layout)
    n = bg * v
    if n == 0:
        return zero_with_graph(xg)
    contrast = xg.transpose(0, 1).reshape(n, d)
    rows = local_view_rows(layout, v if contrast_mode == "all" else 1, x.device)
    n_anchor = rows.numel()
    if n_anchor == 0:
        all_reduce_sum(torch.zeros((), dtype=contrast.dtype, device=x.device))  # keep the collectives aligned
        return zero_with_graph(xg)
    block = max(1, _AUTO_BLOCK_ELEMENTS // n) if chunk is None else chunk
    block = min(block, n_anchor)
    loss, valid = _ChunkedSupCon.apply(contrast[rows], contrast, keys, bg, False, tau, variant, block, rows)
    n_valid = all_reduce_sum(valid.sum().to(loss.dtype))
    return loss.sum() / n_valid.clamp(min=1) * (world * tau / tau_b)


class SupConLoss(nn.Module):
    """Module twin of :func:`supcon_loss` holding its hyperparameters."""

    def __init__(
        self,
        *,
        temperature: float = 0.1,
        base_temperature: float | None = None,
        contrast_mode: ContrastMode = "all",
        variant: Variant = "out",
        normalize: bool = True,
        chunk_size: int | None = None,
        distributed: DistributedFlag = False,
    ) -> None:
        super().__init__()
        self.temperature = check_positive(temperature, "temperature")
        if base_temperature is not None:
            check_positive(base_temperature, "base_temperature")
        self.base_temperature = base_temperature
        self.contrast_mode = check_choice(contrast_mode, "contrast_mode", ("all", "one"))
        self.variant = check_choice(variant, "variant", ("out", "in"))
        self.normalize = normalize
        self.chunk_size = _check_chunk(chunk_size)
        self.distributed = distributed

    def forward(
        self, features: torch.Tensor, labels: torch.Tensor | None = None, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        return supcon_loss(
            features,
            labels,
            mask,
            temperature=self.temperature,
            base_temperature=self.base_temperature,
            contrast_mode=self.contrast_mode,
            variant=self.variant,
            normalize=self.normalize,
            chunk_size=self.chunk_size,
            distributed=self.distributed,
        )

    def extra_repr(self) -> str:
        return (
            f"temperature={self.temperature}, base_temperature={self.base_temperature}, "
            f"contrast_mode={self.contrast_mode!r}, variant={self.variant!r}, normalize={self.normalize}, "
            f"chunk_size={self.chunk_size}"
        )


def _example(dtype: torch.dtype, device: torch.device) -> Example:
    feats = random_features(dtype, device, 5, 2, 6)
    labels = torch.tensor([0, 1, 0, 2, 1], device=device)
    return Example((feats, labels), {"temperature": 0.5, "variant": "out", "chunk_size": 3})


def _degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
    def f(*shape: int) -> torch.Tensor:
        return random_features(dtype, device, *shape, seed=1)

    return [
        Example((f(0, 2, 4),)),  # empty batch
        Example((f(1, 1, 4),)),  # one view of one sample: no positive
        Example((f(3, 4),)),  # single view, no labels: no positive
        Example((f(3, 4), torch.tensor([0, 1, 2], device=device))),  # all labels distinct, one view
        Example((f(3, 2, 4), torch.zeros(3, dtype=torch.long, device=device))),  # a single label
        Example((f(1, 2, 4),), {"variant": "in"}),  # n = 1 sample, SimCLR
        Example((torch.ones(3, 2, 4, dtype=dtype, device=device).requires_grad_(),)),  # all equal features
    ]


register_loss("supcon", module=SupConLoss, example=_example, degenerate=_degenerate)(supcon_loss)
