"""Contrastive losses for regression: Rank-N-Contrast (RnC) and ConR."""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import nn

from rankwise._kernels import rnc as kernels
from rankwise._twin import FunctionModule
from rankwise._validation import (
    batch_loss,
    check_bool,
    check_choice,
    check_floating,
    check_positive,
    check_real,
    to_compute,
)
from rankwise.distributed import (
    BatchLayout,
    DistributedFlag,
    all_gather_no_grad,
    all_gather_with_grad,
    batch_layout,
    global_batch_on,
)
from rankwise.losses._contrastive_common import (
    as_labels,
    as_views,
    local_view_rows,
    sq_dist,
    zero_with_graph,
)
from rankwise.losses._registry import register_loss

__all__ = ["ConRLoss", "RnCLoss", "conr_loss", "rnc_loss"]

Variant = Literal["in", "out"]


def _label_values(y: torch.Tensor) -> torch.Tensor:
    """Labels as the floats their distances are computed in: float64 for integers (exact), else the compute dtype."""
    y = y.detach()
    return y.to(torch.float64) if not y.is_floating_point() else to_compute(y)


def _label_distance(y: torch.Tensor) -> torch.Tensor:
    """|y_i - y_k| (L1 over label dims for (N, K) labels), exact for integer labels."""
    y = _label_values(y)
    diff = (y[:, None] - y[None, :]).abs()
    return diff.sum(-1) if diff.dim() == 3 else diff


def _repeat_views(t: torch.Tensor, v: int) -> torch.Tensor:
    """(B, ...) per-sample values -> (B*V, ...) in view-major order."""
    return t.repeat(v, *([1] * (t.dim() - 1)))


def _l2_dist(z: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Euclidean distances of the views ``rows`` (all when ``None``) to every view."""
    # zero distances (the diagonal) get no gradient instead of 0 * inf
    d2 = sq_dist(z, rows)
    return d2.clamp_min(torch.finfo(d2.dtype).tiny).sqrt()


def _global_views(x: torch.Tensor, distributed: DistributedFlag) -> tuple[torch.Tensor, BatchLayout | None]:
    """Gather the (B, V, D) views of every rank (with gradient) when ``distributed`` resolves to on."""
    if not global_batch_on(distributed):
        return x, None
    layout = batch_layout(x.shape[0], device=x.device)
    return all_gather_with_grad(x, sizes=layout), layout


@batch_loss("features", "labels")
def rnc_loss(
    features: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = 2.0,
    distributed: DistributedFlag = False,
) -> torch.Tensor:
    r"""Rank-N-Contrast loss (Zha et al., NeurIPS'23) in :math:`O(N^2 \log N)`.

    The ``N = B V`` views :math:`v_i` (usually ``V = 2`` augmentations) carry their sample's label
    :math:`y_i`. With :math:`s_{ij} = -\lVert v_i - v_j \rVert_2 / \tau` and, for an anchor
    :math:`i` and a positive :math:`j \ne i`, the set
    :math:`S_{ij} = \{k \ne i : |y_i - y_k| \ge |y_i - y_j|\}` (ties included, so :math:`j \in S_{ij}`):

    .. math::
        \mathcal{L}_{RnC} = \frac{1}{N(N-1)} \sum_{i} \sum_{j \ne i}
            -\log \frac{e^{s_{ij}}}{\sum_{k \in S_{ij}} e^{s_{ik}}}

    The public code loops over the positives (:math:`O(N^3)`); here every anchor's other views are
    ordered once by label distance (descending, stable), a cumulative log-sum-exp gives every
    denominator, and a positive takes the value at the *last* member of its tie group so that
    all :math:`k` at the same label distance are included, exactly as the definition says. On CPU
    the order comes from merging, per anchor, the two label-sorted runs on either side of its
    label (one label sort, no per-anchor sort; multi-dimensional labels sort each row), and the
    running log-sum-exp and its analytic gradient are numba kernels (one pass per row each);
    elsewhere rows are sorted and ``torch.logcumsumexp`` is differentiated by autograd.
    Multi-dimensional labels :math:`(B, K)` use the L1 label distance (as the public code).
    Distances are computed through a matrix product (after centring the views), so they agree
    with a direct norm up to rounding; coincident distinct views get a zero gradient.

    ``distributed=True`` / ``"auto"`` (see :mod:`rankwise.distributed`): the views and labels of
    all ranks are gathered (views with gradient), the anchors :math:`i` are this rank's views and
    :math:`j, k` range over the **global** batch (``N`` = global number of views), and the rank
    returns ``world_size / (N (N - 1))`` times the sum of its anchors' terms: the mean over ranks
    of the returned values is the single-process loss on the concatenated batch, and DDP's
    gradient averaging gives the single-process gradient.

    Shape:
        - features: :math:`(B, V, D)` (typically :math:`V = 2`) or :math:`(B, D)`.
        - labels: :math:`(B,)`, :math:`(B, 1)` or :math:`(B, K)`.
        - output: scalar; float32 for half input. Fewer than two views in total give 0 with graph.

    Example:
        >>> import torch, rankwise
        >>> g = torch.Generator().manual_seed(0)
        >>> feats = torch.randn(4, 2, 8, generator=g, requires_grad=True)
        >>> loss = rankwise.losses.rnc_loss(feats, torch.tensor([1.0, 3.0, 2.0, 3.0]))
        >>> loss.backward()
        >>> feats.grad.shape
        torch.Size([4, 2, 8])
    """
    tau = check_positive(temperature, "temperature")
    x = as_views(features)
    b, v, d = x.shape
    y = as_labels(labels, b, allow_multi=True)
    x, layout = _global_views(x, distributed)
    rows: torch.Tensor | None = None
    scale = 1.0
    if layout is not None:
        y = all_gather_no_grad(y, sizes=layout)
        b, rows, scale = layout.total, local_view_rows(layout, v, x.device), float(layout.world_size)
    n = b * v
    if n < 2 or (rows is not None and rows.numel() == 0):
        return zero_with_graph(features if layout is None else x)
    z = x.transpose(0, 1).reshape(n, d)
    yv = _repeat_views(y, v)
    if z.device.type == "cpu" and kernels.ready():
        order, gend = _rnc_order(yv, rows, n)
        return _RnC.apply(z, rows, order, gend, tau, scale / (n * (n - 1)))
    ld = _label_distance(yv)
    if rows is None:
        eye = torch.eye(n, dtype=torch.bool, device=z.device)
    else:
        ld = ld[rows]
        eye = rows[:, None] == torch.arange(n, device=z.device)[None, :]
    order, last = _descending_order(ld, eye)
    s_s = (-_l2_dist(z, rows) / tau).gather(1, order)
    lcse = torch.logcumsumexp(s_s, dim=1)
    out = (lcse.gather(1, last) - s_s).sum() / (n * (n - 1))
    return out * scale if layout is not None else out


def _descending_order(ld: torch.Tensor, eye: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each anchor's other columns by decreasing label distance (stable), and for every position the
    last position of its group of equal distances."""
    m, n = ld.shape
    ld = ld.masked_fill(eye, -math.inf)  # self sorts last and is dropped
    order = torch.argsort(ld, dim=1, descending=True, stable=True)[:, : n - 1]
    ld_s = ld.gather(1, order)
    # last position of each tie group (of equal label distance): next group's start - 1, right to left
    pos = torch.arange(n - 1, device=ld.device).expand(m, n - 1)
    ends = torch.full_like(pos, n - 2)
    ends[:, :-1] = torch.where(ld_s[:, 1:] != ld_s[:, :-1], pos[:, :-1], ends[:, :-1])
    return order, ends.flip(1).cummin(1).values.flip(1)


def _rnc_order(yv: torch.Tensor, rows: torch.Tensor | None, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(m, n - 1) order of every anchor's other views by decreasing label distance and group ends."""
    if yv.dim() == 1:  # one label: merge the two label-sorted runs of every row, no per-row sort
        y = _label_values(yv)
        self_cols = torch.arange(n) if rows is None else rows
        order, gend = kernels.order(y if rows is None else y[self_cols], y, self_cols)
        return order, gend
    ld = _label_distance(yv)
    if rows is None:
        eye = torch.eye(n, dtype=torch.bool)
    else:
        ld = ld[rows]
        eye = rows[:, None] == torch.arange(n)[None, :]
    return _descending_order(ld, eye)


class _RnC(torch.autograd.Function):
    r"""RnC on CPU: the sorted-prefix log-sum-exps and their gradient in numba kernels.

    ``s = -dist / tau`` (anchors ``rows`` x all views) comes from one matrix product. Forward walks
    each anchor's views in decreasing label distance with a running log-sum-exp; backward gives
    :math:`\partial L / \partial s_{ik} = e^{s_{ik}} \sum_{j: k \in S_{ij}} e^{-\mathrm{lse}_{ij}} - 1`
    (a running log-sum-exp over the groups from the last), then
    :math:`W = G / (\tau d)` and :math:`\partial L / \partial z` from two matrix products.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        z: torch.Tensor,
        rows: torch.Tensor | None,
        order: torch.Tensor,
        gend: torch.Tensor,
        tau: float,
        scale: float,
    ) -> torch.Tensor:
        d2 = sq_dist(z, rows)
        tiny = torch.finfo(d2.dtype).tiny
        dist = d2.clamp_min(tiny).sqrt_()
        s = dist / -tau
        total, lcse = kernels.forward(s, order, gend)
        ctx.save_for_backward(z, rows, s, dist, d2 >= tiny, order, gend, lcse)  # distances at 0: no gradient
        ctx.cfg = (tau, scale)
        return (total * scale).to(z.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        z, rows, s, dist, flows, order, gend, lcse = ctx.saved_tensors
        tau, scale = ctx.cfg
        g = kernels.backward(s, order, gend, lcse)
        # W = dL/ds / (tau d); ds_ik/dz_i = -(z_i - z_k) / (tau d_ik), ds_ik/dz_k = -ds_ik/dz_i
        w = g.mul_(flows).div_(dist).mul_(grad_out * (scale / tau))
        za = z if rows is None else z[rows]
        grad_anchor = w @ z - w.sum(1, keepdim=True) * za
        grad = w.T @ za - w.sum(0)[:, None] * z
        if rows is None:
            grad += grad_anchor
        else:
            grad.index_add_(0, rows, grad_anchor)
        return grad, None, None, None, None, None


class RnCLoss(FunctionModule):
    """Module twin of :func:`rnc_loss` holding ``temperature`` and ``distributed``."""

    _function = staticmethod(rnc_loss)
    _options = ("temperature", "distributed")
    _shown = ("temperature",)

    def __init__(self, *, temperature: float = 2.0, distributed: DistributedFlag = False) -> None:
        super().__init__()
        self.temperature = check_positive(temperature, "temperature")
        self.distributed = distributed


def _per_view(t: torch.Tensor, b: int, v: int, name: str) -> torch.Tensor:
    """(B,), (B, 1) or (B, V) per-sample/per-view values -> (B*V,) view-major."""
    if t.dim() == 2 and t.shape[1] == 1:
        t = t[:, 0]
    if t.dim() == 1 and t.shape[0] == b:
        return _repeat_views(t, v)
    if t.dim() == 2 and t.shape == (b, v):
        return t.T.reshape(b * v)
    raise ValueError(f"`{name}` must have shape ({b},), ({b}, 1) or ({b}, {v}), got shape {tuple(t.shape)}")


@batch_loss("features", "labels", "preds", "weights")
def conr_loss(
    features: torch.Tensor,
    labels: torch.Tensor,
    preds: torch.Tensor,
    *,
    weights: torch.Tensor | None = None,
    window: float = 1.0,
    temperature: float = 0.2,
    eta: float = 0.01,
    variant: Variant = "in",
    normalize: bool = True,
    distributed: DistributedFlag = False,
) -> torch.Tensor:
    r"""ConR contrastive regularizer for imbalanced regression (Keramati et al., ICLR'24).

    The ``N = B V`` views :math:`z_j` (L2-normalized when ``normalize``; two augmentations in the
    paper, passed as ``(B, 2, D)`` or already concatenated as ``(2B, D)``) carry labels :math:`y`
    and predictions :math:`\hat y` (per sample, or per view as ``(B, V)``). For an anchor :math:`j`:

    * positives :math:`K^+_j = \{i \ne j : |y_i - y_j| \le \omega\}` (``window`` :math:`\omega`);
    * negatives :math:`K^-_j = \{q : |y_q - y_j| > \omega,\ |\hat y_q - \hat y_j| \le \omega\}` —
      dissimilar labels that the model currently confuses;
    * pushing weights :math:`S_{j,q} = w_j \exp(\eta\,|y_j - y_q|)` (``weights`` :math:`w`, e.g.
      inverse-frequency / LDS weights, default 1; treated as constants);

    with :math:`s_{ji} = z_j \cdot z_i / \tau` and the denominator
    :math:`D_j = \sum_{p \in K^+_j} e^{s_{jp}} + \sum_{q \in K^-_j} S_{j,q}\, e^{s_{jq}}`:

    .. math::
        \ell^{in}_j = -\log \frac{1}{|K^+_j|} \sum_{i \in K^+_j} \frac{e^{s_{ji}}}{D_j}
        \qquad
        \ell^{out}_j = -\frac{1}{|K^+_j|} \sum_{i \in K^+_j} \log \frac{e^{s_{ji}}}{D_j}

    ``variant="in"`` is the paper's equation (default); ``"out"`` is the per-positive form the
    public code computes. Only anchors with at least one negative (and one positive) are selected;
    the others contribute 0 and the loss is the mean over all :math:`N` anchors,
    :math:`\frac{1}{N}\sum_j \ell_j` (0 with graph when no anchor is selected). Labels and
    predictions only select pairs: no gradient flows into them.

    Differences from the public ConR code: it ignores its temperature argument (hard-coded 0.07;
    here ``temperature`` is used), its denominator also adds :math:`e^0 = 1` for every masked-out
    entry (here only positives and weighted negatives are summed), it gives NaN for an anchor
    without positives (here 0), and it multiplies each anchor's loss by its weight once more
    (here the weight enters through :math:`S_{j,q}` only, as in the paper's formula).

    ``distributed=True`` / ``"auto"`` (see :mod:`rankwise.distributed`): features (with gradient),
    labels, predictions and weights of all ranks are gathered; the anchors :math:`j` are this
    rank's views, positives and negatives range over the **global** batch (``N`` = global number
    of views), and the rank returns ``world_size / N`` times the sum of its anchors' losses: the
    mean over ranks of the returned values is the single-process loss on the concatenated batch,
    and DDP's gradient averaging gives the single-process gradient.

    Shape:
        - features: :math:`(B, V, D)` or :math:`(B, D)`.
        - labels: :math:`(B,)` or :math:`(B, 1)`; preds: :math:`(B,)`, :math:`(B, 1)` or :math:`(B, V)`;
          weights: :math:`(B,)` or :math:`(B, 1)`, non-negative.
        - output: scalar; float32 for half input.

    Example:
        >>> import torch, rankwise
        >>> g = torch.Generator().manual_seed(0)
        >>> feats = torch.randn(6, 2, 8, generator=g, requires_grad=True)
        >>> y = torch.tensor([1.0, 1.5, 4.0, 4.2, 9.0, 2.0])
        >>> y_hat = torch.tensor([1.2, 3.5, 3.9, 4.0, 8.0, 2.5])
        >>> loss = rankwise.losses.conr_loss(feats, y, y_hat)
        >>> loss.backward()
        >>> feats.grad.shape
        torch.Size([6, 2, 8])
    """
    win = check_positive(window, "window", allow_zero=True)
    tau = check_positive(temperature, "temperature")
    e = check_positive(eta, "eta", allow_zero=True)
    check_choice(variant, "variant", ("in", "out"))
    check_bool(normalize, "normalize")
    x = as_views(features, normalize=normalize)
    b, v, d = x.shape
    y = as_labels(labels, b)
    check_real(preds, "preds")
    yp = _per_view(preds.detach(), b, v, "preds")
    if weights is not None:
        check_floating(weights, "weights")
        w = to_compute(_per_view(weights.detach(), b, v, "weights"))
    x, layout = _global_views(x, distributed)
    rows: torch.Tensor | None = None
    if layout is not None:
        y = all_gather_no_grad(y, sizes=layout)
        p_loc = preds.detach()
        yp = _per_view(all_gather_no_grad(p_loc, sizes=layout), layout.total, v, "preds")
        if weights is not None:
            w = to_compute(_per_view(all_gather_no_grad(weights.detach(), sizes=layout), layout.total, v, "weights"))
        b, rows = layout.total, local_view_rows(layout, v, x.device)
    n = b * v
    if n < 2 or (rows is not None and rows.numel() == 0):
        return zero_with_graph(features if layout is None else x)
    z = x.transpose(0, 1).reshape(n, d)
    ld = _label_distance(_repeat_views(y, v))
    pd = _label_distance(yp)
    if rows is None:
        eye = torch.eye(n, dtype=torch.bool, device=z.device)
        za = z
    else:
        ld, pd, za = ld[rows], pd[rows], z[rows]
        eye = rows[:, None] == torch.arange(n, device=z.device)[None, :]
    pos = (ld <= win) & ~eye
    neg = (ld > win) & (pd <= win)
    npos = pos.sum(1)
    valid = (npos > 0) & neg.any(1)
    logits = (za @ z.T) / tau
    log_push = (e * ld).to(logits.dtype)
    if weights is not None:
        wa = w if rows is None else w[rows]
        log_push = log_push + torch.log(wa.to(logits.dtype))[:, None]
    neg_inf = torch.full((), -math.inf, dtype=logits.dtype, device=logits.device)  # a fill: no host copy
    keep = valid[:, None]
    # invalid rows are computed on finite dummies and zeroed afterwards (no NaN in backward)
    den = torch.where(pos, logits, torch.where(neg, logits + log_push, neg_inf))
    lse_den = torch.logsumexp(torch.where(keep, den, torch.zeros_like(den)), dim=1)
    npos_f = npos.clamp(min=1).to(logits.dtype)
    if variant == "in":
        num = torch.logsumexp(torch.where(pos | ~keep, logits, neg_inf), dim=1) - torch.log(npos_f)
    else:
        num = torch.where(pos, logits, torch.zeros_like(logits)).sum(1) / npos_f
    loss = torch.where(valid, lse_den - num, torch.zeros_like(lse_den))
    out = loss.sum() / n
    return out * layout.world_size if layout is not None else out


class ConRLoss(nn.Module):
    """Module twin of :func:`conr_loss` holding its hyperparameters."""

    def __init__(
        self,
        *,
        window: float = 1.0,
        temperature: float = 0.2,
        eta: float = 0.01,
        variant: Variant = "in",
        normalize: bool = True,
        distributed: DistributedFlag = False,
    ) -> None:
        super().__init__()
        self.window = check_positive(window, "window", allow_zero=True)
        self.temperature = check_positive(temperature, "temperature")
        self.eta = check_positive(eta, "eta", allow_zero=True)
        self.variant = check_choice(variant, "variant", ("in", "out"))
        self.normalize = normalize
        self.distributed = distributed

    def forward(
        self,
        features: torch.Tensor,
        labels: torch.Tensor,
        preds: torch.Tensor,
        weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return conr_loss(
            features,
            labels,
            preds,
            weights=weights,
            window=self.window,
            temperature=self.temperature,
            eta=self.eta,
            variant=self.variant,
            normalize=self.normalize,
            distributed=self.distributed,
        )

    def extra_repr(self) -> str:
        return (
            f"window={self.window}, temperature={self.temperature}, eta={self.eta}, "
            f"variant={self.variant!r}, normalize={self.normalize}"
        )


register_loss(
    "rnc",
    module=RnCLoss,
    inputs={"features": "features", "labels": "targets"},
    takes="features",
)(rnc_loss)
register_loss(
    "conr",
    module=ConRLoss,
    inputs={"features": "features", "labels": "targets", "preds": "predictions", "weights": "weights"},
    takes="features",
)(conr_loss)
