"""Triplet and N-pairs losses: the special cases of SupCon discussed by Khosla et al."""

from __future__ import annotations

import math
from typing import Literal

import torch

from rankwise._twin import FunctionModule
from rankwise._validation import batch_loss, check_bool, check_choice, check_positive
from rankwise.distributed import (
    BatchLayout,
    DistributedFlag,
    all_gather_no_grad,
    all_gather_with_grad,
    all_reduce_sum,
    batch_layout,
    global_batch_on,
)
from rankwise.losses._contrastive_common import (
    REDUCTIONS,
    Reduction,
    as_labels,
    as_views,
    local_view_rows,
    reduce,
    sample_mask,
    sq_dist,
    zero_with_graph,
)
from rankwise.losses._registry import register_loss

__all__ = ["NPairsLoss", "TripletLoss", "npairs_loss", "triplet_loss"]

Distance = Literal["squared", "euclidean"]
Mining = Literal["all", "hard"]


def _positive_mask(
    b: int, v: int, labels: torch.Tensor | None, mask: torch.Tensor | None, device: torch.device
) -> torch.Tensor:
    """(N, N) positives between the N = B*V views in view-major order, self excluded."""
    n = b * v
    sample = torch.arange(n, device=device) % b
    if mask is not None:
        pos = sample_mask(mask, b)[sample][:, sample]
    else:
        keys = as_labels(labels, b).detach() if labels is not None else torch.arange(b, device=device)
        keys = keys[sample]
        pos = keys[:, None] == keys[None, :]
    return pos & ~torch.eye(n, dtype=torch.bool, device=device)


def _dist_reduce(loss: torch.Tensor, valid: torch.Tensor, reduction: str, layout: BatchLayout) -> torch.Tensor:
    """Distributed reduction of this rank's anchors: ``"mean"`` over the valid anchors of ALL ranks
    (an ``all_reduce``) times the world size, ``"sum"`` times the world size, ``"none"`` unscaled."""
    if reduction == "none":
        return reduce(loss, valid, "none")
    total = reduce(loss, valid, "sum")
    if reduction == "sum":
        return total * layout.world_size
    n_valid = all_reduce_sum(valid.sum().to(total.dtype))
    return total / n_valid.clamp(min=1) * layout.world_size


@batch_loss("features", "labels", "mask")
def triplet_loss(
    features: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    mask: torch.Tensor | None = None,
    margin: float = 0.2,
    distance: Distance = "squared",
    mining: Mining = "all",
    normalize: bool = True,
    reduction: Reduction = "mean",
    distributed: DistributedFlag = False,
) -> torch.Tensor:
    r"""Triplet margin loss over all views of a batch, with batch-all or batch-hard mining.

    Views, positives and conventions are those of :func:`supcon_loss`: the ``B x V`` views are
    L2-normalized when ``normalize``; for anchor view :math:`i`, the positives :math:`P(i)` are the
    other views with the same label (``labels``), of samples marked in ``mask[i, :]``, or — with
    neither — the other views of the same sample; every other view is a negative :math:`N(i)`.
    With :math:`d` the squared Euclidean distance (``distance="squared"``; on normalized features
    :math:`d_{ij} = 2 - 2 z_i \cdot z_j`) or the Euclidean distance (``"euclidean"``):

    .. math::
        \ell^{all}_i = \frac{1}{|P(i)|\,|N(i)|} \sum_{p \in P(i)} \sum_{n \in N(i)}
            \max(0,\; d_{ip} - d_{in} + m)

        \ell^{hard}_i = \max\bigl(0,\; \max_{p \in P(i)} d_{ip} - \min_{n \in N(i)} d_{in} + m\bigr)

    (batch-all and batch-hard of Hermans et al. 2017; ``margin`` :math:`m`). With one positive and
    one negative, SupCon with temperature :math:`\tau` on normalized features behaves like this
    loss with squared distance and margin :math:`2\tau` (Khosla et al., appendix). ``reduction``:
    ``"mean"`` over anchors having at least one positive and one negative (the others are excluded;
    none gives 0 with graph), ``"sum"``, or ``"none"`` (per anchor, view-major order
    ``[view 0 of all samples, view 1, ...]``, 0 for excluded anchors). The batch-all sum is
    computed in :math:`O(N^2 \log N)` by sorting each anchor's negative distances (no
    :math:`N^3` tensor). For explicit (anchor, positive, negative) triplets use
    ``torch.nn.functional.triplet_margin_loss``.

    ``distributed=True`` / ``"auto"`` (see :mod:`rankwise.distributed`): views (with gradient) and
    labels of all ranks are gathered, the anchors are this rank's views and positives / negatives
    range over the **global** batch. ``"mean"`` returns ``world_size * (sum over this rank's valid
    anchors) / (valid anchors over all ranks)``, ``"sum"`` ``world_size *`` this rank's sum (the
    mean over ranks of the returned values is the single-process loss; DDP's gradient averaging
    gives the single-process gradient); ``"none"`` returns this rank's anchors' losses, unscaled.
    ``mask`` is not supported then (pass labels).

    Shape:
        - features: :math:`(B, V, D)` or :math:`(B, D)`; labels :math:`(B,)`; mask :math:`(B, B)`.
        - output: scalar, or :math:`(B V,)` with ``reduction="none"``; float32 for half input.

    Example:
        >>> import torch, rankwise
        >>> g = torch.Generator().manual_seed(0)
        >>> emb = torch.randn(6, 16, generator=g, requires_grad=True)
        >>> loss = rankwise.losses.triplet_loss(emb, torch.tensor([0, 0, 1, 1, 2, 2]), mining="hard")
        >>> loss.backward()
        >>> emb.grad.shape
        torch.Size([6, 16])
    """
    m = check_positive(margin, "margin", allow_zero=True)
    check_choice(distance, "distance", ("squared", "euclidean"))
    check_choice(mining, "mining", ("all", "hard"))
    check_choice(reduction, "reduction", REDUCTIONS)
    check_bool(normalize, "normalize")
    if labels is not None and mask is not None:
        raise ValueError("`labels` and `mask` cannot both be given; pass one of them (or neither)")
    x = as_views(features, normalize=normalize)
    b, v, dd = x.shape
    layout: BatchLayout | None = None
    rows: torch.Tensor | None = None
    if global_batch_on(distributed):
        if mask is not None:
            raise ValueError("`mask` is not supported with `distributed` on; pass `labels` (or neither)")
        layout = batch_layout(b, device=x.device)
        if labels is not None:
            labels = all_gather_no_grad(as_labels(labels, b).detach(), sizes=layout)
        x = all_gather_with_grad(x, sizes=layout)
        b = layout.total
        rows = local_view_rows(layout, v, x.device)
    n = b * v
    if n == 0:
        z0 = zero_with_graph(features if layout is None else x)
        return z0.expand(0) if reduction == "none" else z0
    z = x.transpose(0, 1).reshape(n, dd)
    pos = _positive_mask(b, v, labels, mask, x.device)
    neg = ~pos & ~torch.eye(n, dtype=torch.bool, device=x.device)
    if rows is not None:
        pos, neg = pos[rows], neg[rows]
    d = sq_dist(z, rows)
    if distance == "euclidean":
        d = d.clamp_min(1e-12).sqrt()
    npos, nneg = pos.sum(1), neg.sum(1)
    valid = (npos > 0) & (nneg > 0)
    zero = torch.zeros_like(d)
    if mining == "hard":
        hardest_pos = torch.where(pos, d, zero).amax(1)  # distances are >= 0
        big = d.detach().amax() + 1 if d.numel() else d.new_ones(())
        hardest_neg = torch.where(neg, d, big).amin(1)
        loss = torch.relu(hardest_pos - hardest_neg + m)
    else:
        inf = torch.full((), math.inf, dtype=d.dtype, device=d.device)  # a fill: no host copy
        neg_sorted = torch.where(neg, d, inf).sort(dim=1).values  # finite first, +inf at the end
        finite = torch.isfinite(neg_sorted)
        prefix = torch.cat([zero[:, :1], torch.where(finite, neg_sorted, zero).cumsum(1)], dim=1)
        thr = d + m
        # number of negatives with d_in < d_ip + m (those with a positive hinge)
        cnt = torch.searchsorted(neg_sorted.detach().contiguous(), thr.detach().contiguous(), right=False)
        hinge = cnt.to(d.dtype) * thr - prefix.gather(1, cnt)
        total = torch.where(pos, hinge, zero).sum(1)
        loss = total / (npos * nneg).clamp(min=1).to(d.dtype)
    if layout is not None:
        return _dist_reduce(loss, valid, reduction, layout)
    return reduce(loss, valid, reduction)


@batch_loss("features", "labels")
def npairs_loss(
    features: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    normalize: bool = False,
    reduction: Reduction = "mean",
    distributed: DistributedFlag = False,
) -> torch.Tensor:
    r"""Multi-class N-pair loss (Sohn, NeurIPS'16): one positive per anchor, softmax over the pairs.

    ``features[:, 0]`` are the anchors :math:`f_i`, ``features[:, 1]`` their positives
    :math:`f_i^+`. With :math:`s_{ij} = f_i \cdot f_j^+ / \tau`:

    .. math::
        \ell_i = -\log \frac{e^{s_{ii}}}{\sum_{j \in D(i)} e^{s_{ij}}}
               = \log\Bigl(1 + \sum_{j \in D(i),\, j \ne i} e^{s_{ij} - s_{ii}}\Bigr)

    where :math:`D(i)` is every pair (Sohn's setting: all samples from distinct classes) or, when
    ``labels`` are given, :math:`i` plus the pairs with a different label (same-label pairs are not
    used as negatives). Sohn's loss uses raw inner products (``temperature=1``,
    ``normalize=False``, the defaults); it is SupCon with a single positive and temperature 1
    (Khosla et al., appendix), except that the N-pair softmax runs over the other pairs'
    *positives* only. Sohn's L2 penalty on the embeddings is not included (add it to the loss).
    ``reduction``: ``"mean"`` over anchors, ``"sum"`` or ``"none"`` (per anchor).

    ``distributed=True`` / ``"auto"`` (see :mod:`rankwise.distributed`): pairs (with gradient) and
    labels of all ranks are gathered; this rank's anchors are contrasted with the positives of the
    **global** batch. ``"mean"`` / ``"sum"`` return ``world_size / B_global`` / ``world_size`` times
    the sum over this rank's anchors (mean over ranks = single-process loss; DDP's gradient
    averaging gives the single-process gradient); ``"none"`` this rank's anchors' losses, unscaled.

    Shape:
        - features: :math:`(B, 2, D)`; labels :math:`(B,)` or :math:`(B, 1)`.
        - output: scalar, or :math:`(B,)` with ``reduction="none"``; float32 for half input.

    Example:
        >>> import torch, rankwise
        >>> g = torch.Generator().manual_seed(0)
        >>> pairs = torch.randn(4, 2, 8, generator=g, requires_grad=True)
        >>> loss = rankwise.losses.npairs_loss(pairs)
        >>> loss.backward()
        >>> pairs.grad.shape
        torch.Size([4, 2, 8])
    """
    tau = check_positive(temperature, "temperature")
    check_choice(reduction, "reduction", REDUCTIONS)
    check_bool(normalize, "normalize")
    x = as_views(features, normalize=normalize)
    b, v, _ = x.shape
    if v != 2:
        raise ValueError(f"`features` must have shape (B, 2, D) (anchor, positive), got shape {tuple(features.shape)}")
    if global_batch_on(distributed):
        return _npairs_global(x, labels, tau, reduction)
    if b == 0:
        z0 = zero_with_graph(features)
        return z0.expand(0) if reduction == "none" else z0
    logits = (x[:, 0] @ x[:, 1].T) / tau
    if labels is not None:
        y = as_labels(labels, b).detach()
        same = (y[:, None] == y[None, :]) & ~torch.eye(b, dtype=torch.bool, device=x.device)
        logits_den = logits.masked_fill(same, -math.inf)
    else:
        logits_den = logits
    loss = torch.logsumexp(logits_den, dim=1) - logits.diagonal()
    return reduce(loss, torch.ones_like(loss, dtype=torch.bool), reduction)


def _npairs_global(x: torch.Tensor, labels: torch.Tensor | None, tau: float, reduction: str) -> torch.Tensor:
    """Distributed N-pairs: this rank's anchors against the positives of all ranks."""
    b = x.shape[0]
    layout = batch_layout(b, device=x.device)
    y = None if labels is None else all_gather_no_grad(as_labels(labels, b).detach(), sizes=layout)
    xg = all_gather_with_grad(x, sizes=layout)
    if layout.total == 0:
        z0 = zero_with_graph(xg)
        return z0.expand(0) if reduction == "none" else z0
    own = torch.arange(layout.start, layout.stop, device=x.device)
    logits = (xg[layout.local, 0] @ xg[:, 1].T) / tau
    self_col = own[:, None] == torch.arange(layout.total, device=x.device)[None, :]
    if y is not None:
        same = (y[own][:, None] == y[None, :]) & ~self_col
        logits_den = logits.masked_fill(same, -math.inf)
    else:
        logits_den = logits
    loss = torch.logsumexp(logits_den, dim=1) - logits[self_col]
    if reduction == "none":
        return loss
    total = loss.sum() * layout.world_size
    return total if reduction == "sum" else total / layout.total


class TripletLoss(FunctionModule):
    """Module twin of :func:`triplet_loss` holding its hyperparameters (``forward(features, labels=None,
    *, mask=None)``)."""

    _function = staticmethod(triplet_loss)
    _options = ("margin", "distance", "mining", "normalize", "reduction", "distributed")
    _shown = ("margin", "distance!r", "mining!r", "normalize", "reduction!r")

    def __init__(
        self,
        *,
        margin: float = 0.2,
        distance: Distance = "squared",
        mining: Mining = "all",
        normalize: bool = True,
        reduction: Reduction = "mean",
        distributed: DistributedFlag = False,
    ) -> None:
        super().__init__()
        self.margin = check_positive(margin, "margin", allow_zero=True)
        self.distance = check_choice(distance, "distance", ("squared", "euclidean"))
        self.mining = check_choice(mining, "mining", ("all", "hard"))
        self.normalize = normalize
        self.reduction = check_choice(reduction, "reduction", REDUCTIONS)
        self.distributed = distributed


class NPairsLoss(FunctionModule):
    """Module twin of :func:`npairs_loss` holding its hyperparameters (``forward(features, labels=None)``)."""

    _function = staticmethod(npairs_loss)
    _options = ("temperature", "normalize", "reduction", "distributed")
    _shown = ("temperature", "normalize", "reduction!r")

    def __init__(
        self,
        *,
        temperature: float = 1.0,
        normalize: bool = False,
        reduction: Reduction = "mean",
        distributed: DistributedFlag = False,
    ) -> None:
        super().__init__()
        self.temperature = check_positive(temperature, "temperature")
        self.normalize = normalize
        self.reduction = check_choice(reduction, "reduction", REDUCTIONS)
        self.distributed = distributed


register_loss(
    "triplet", module=TripletLoss, inputs={"features": "embeddings", "labels": "labels"}, takes="embeddings_labels"
)(triplet_loss)
register_loss(
    "npairs", module=NPairsLoss, inputs={"features": "embeddings", "labels": "labels"}, takes="embedding_pairs"
)(npairs_loss)
