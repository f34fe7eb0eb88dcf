"""Order-aware regularizers and losses of regression: Ordinal Entropy and Dist Loss.

* :func:`ordinal_entropy_loss` — Ordinal Entropy (Zhang et al., ICLR 2023), a regularizer of the
  features of a regression network: class centres spread apart in proportion to their label
  distance (diversity), features pulled to their class centre (tightness).
* :func:`dist_loss` — Dist Loss (Nie et al., 2024): the soft-sorted batch predictions matched to
  pseudo-labels drawn from the kernel density of the training labels, plus the plain per-sample loss.

Every loss is a function plus an ``nn.Module`` twin, registered with ``register_loss``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from rankwise._random import randperm_from
from rankwise._twin import FunctionModule
from rankwise._validation import (
    MissingTrainLabelsError,
    autocast_off,
    batch_loss,
    check_bool,
    check_choice,
    check_floating,
    check_positive,
    check_positive_int,
    check_real,
    common_compute_dtype,
    nan_if_nonfinite,
    to_compute,
)
from rankwise.distributed import (
    DistributedFlag,
    all_gather_no_grad,
    all_gather_with_grad,
    batch_layout,
    broadcast,
    global_batch_on,
)
from rankwise.imbalanced.losses import REGRESSION_KINDS, regression_loss
from rankwise.losses._registry import register_loss
from rankwise.ops.isotonic import soft_sort_isotonic

__all__ = ["DistLoss", "OrdinalEntropyLoss", "dist_loss", "ordinal_entropy_loss"]

Reduction = Literal["mean", "sum", "none"]
_REDUCTIONS = ("mean", "sum", "none")
#: squared distances below this are clamped (the authors' ``clamp(min=1e-12).sqrt()``): zero gradient there
_SQ_EPS = 1e-12


# --------------------------------------------------------------------------------------------------
# Ordinal Entropy
# --------------------------------------------------------------------------------------------------


def _targets_2d(targets: Any, batch: int) -> torch.Tensor:
    """``targets`` (B,), (B, 1) or (B, T) -> (B, T)."""
    check_real(targets, "targets")
    if targets.dim() not in (1, 2) or targets.shape[0] != batch:
        raise ValueError(
            f"`targets` must have shape ({batch},) or ({batch}, T) to match `features` (batch size {batch}), "
            f"got shape {tuple(targets.shape)}"
        )
    return targets.unsqueeze(1) if targets.dim() == 1 else targets


def _rows(
    indices: Any, num_samples: int | None, generator: torch.Generator | None, batch: int, device: torch.device
) -> torch.Tensor | None:
    """The rows the loss uses (``None``: all of them)."""
    if indices is not None and num_samples is not None:
        raise ValueError("`indices` and `num_samples` are exclusive: give the rows or their number, not both")
    if indices is not None:
        if isinstance(indices, torch.Tensor):
            idx = indices
        else:
            try:
                idx = torch.as_tensor(indices, dtype=torch.long)
            except (TypeError, ValueError, RuntimeError):
                raise TypeError(f"`indices` must be a 1-d integer tensor or sequence, got {indices!r}") from None
            if idx.dim() == 1 and not all(-batch <= int(i) < batch for i in idx):  # on the host: a sequence
                raise ValueError(f"`indices` must be in [0, {batch}) (batch size {batch}), got {list(indices)}")
            idx = idx.to(device)
        if idx.dtype not in (torch.int64, torch.int32) or idx.dim() != 1:
            raise ValueError(f"`indices` must be a 1-d integer tensor or sequence, got {idx.dtype} {tuple(idx.shape)}")
        if idx.device != device:
            raise ValueError(f"`indices` must be on the device of `features` ({device}), got {idx.device}")
        return idx.long()
    if num_samples is None:
        return None
    gen_device = generator.device if generator is not None else device
    return randperm_from(batch, generator, device=gen_device).to(device)[: min(num_samples, batch)]


def _pairwise_distance(q: torch.Tensor) -> torch.Tensor:
    """``sqrt(clamp(|q_i|^2 + |q_j|^2 - 2 q_i.q_j, 1e-12))`` (the authors' ``euclidean_dist``)."""
    sq = (q * q).sum(1)
    with autocast_off(q.device):
        gram = q @ q.transpose(0, 1)
    return (sq.unsqueeze(1) + sq.unsqueeze(0) - 2 * gram).clamp(min=_SQ_EPS).sqrt()


def _ordinal_entropy(z: torch.Tensor, y: torch.Tensor, tightness: bool, centers: bool) -> torch.Tensor:
    """The loss on the rows ``z`` (n, D) with targets ``y`` (n, T), all rows used."""
    n = z.shape[0]
    dt = z.dtype
    same = (y.unsqueeze(1) == y.unsqueeze(0)).all(-1)  # (n, n): same target
    idx = torch.arange(n, device=z.device)
    upper = idx.unsqueeze(1) < idx.unsqueeze(0)
    zn = F.normalize(z, dim=1)
    centre = zn
    if centers or tightness:
        count = same.sum(1, keepdim=True)
        with autocast_off(z.device):
            mean = (same.to(dt) @ z) / count.to(dt)
        # a class of one is its own centre exactly (tightness 0 there, whatever the matmul rounds)
        centre = F.normalize(torch.where(count == 1, z, mean), dim=1)
    if centers:
        first = ~(same & (idx.unsqueeze(0) < idx.unsqueeze(1))).any(1)  # the first row of each class
        pairs = upper & first.unsqueeze(1) & first.unsqueeze(0)
        dist = _pairwise_distance(centre)
    else:
        pairs = upper
        dist = _pairwise_distance(zn)
    w = torch.linalg.vector_norm(y.unsqueeze(1) - y.unsqueeze(0), dim=-1).to(dt)
    inf = torch.full((), math.inf, dtype=dt, device=z.device)
    w_max = torch.where(pairs, w, -inf).amax() if n > 1 else inf
    w_min = torch.where(pairs, w, inf).amin() if n > 1 else inf
    ok = pairs & (w_max > 0)
    weight = torch.where(ok, (w - w_min) / torch.where(w_max > 0, w_max, 1), 0)
    m = pairs.sum().to(dt).clamp(min=1)
    loss = -(weight * dist).sum() / m
    if tightness:
        t2 = ((zn - centre) ** 2).sum(1)
        moved = t2 > 0
        t = torch.where(moved, t2, 1).sqrt() * moved
        loss = loss + t.sum() / moved.sum().to(dt).clamp(min=1)
    return loss


@batch_loss("features", "targets")
def ordinal_entropy_loss(
    features: torch.Tensor,
    targets: torch.Tensor,
    *,
    tightness: bool = True,
    centers: bool = True,
    indices: torch.Tensor | Sequence[int] | None = None,
    num_samples: int | None = None,
    generator: torch.Generator | None = None,
    distributed: DistributedFlag = False,
) -> torch.Tensor:
    r"""Ordinal Entropy regularizer (Zhang et al., ICLR 2023, "Improving Deep Regression with Ordinal Entropy").

    The rows are grouped by target value into classes :math:`c` with centres
    :math:`\bar z_c = \mathrm{normalize}(\mathrm{mean}_{i \in c} z_i)`. With the label distances
    :math:`w_{cd} = \lVert y_c - y_d \rVert` over the pairs of distinct classes :math:`c < d`, scaled as
    :math:`\tilde w_{cd} = (w_{cd} - \min w) / \max w`, and :math:`\hat z_i = \mathrm{normalize}(z_i)`:

    .. math::
        L = \underbrace{\operatorname{mean}_{i:\, t_i > 0} t_i}_{\text{tightness}}
            \;-\; \underbrace{\operatorname{mean}_{c<d}\, \tilde w_{cd}\,
            \lVert \bar z_c - \bar z_d \rVert}_{\text{diversity}},
        \qquad t_i = \lVert \hat z_i - \bar z_{c(i)} \rVert .

    Distances are :math:`\sqrt{\max(d^2, 10^{-12})}` (zero gradient below), as in the authors' code.
    ``centers=False`` computes the diversity over the pairs of rows :math:`i < j` (each row its own
    centre :math:`\hat z_i`; pairs with equal targets have weight 0) instead of the classes;
    ``tightness=False`` drops the tightness. The defaults are the paper's loss on the whole batch (the
    authors' AgeEstimation ``ordinalentropy``); ``tightness=False, centers=False`` with ``indices`` is
    the authors' root ``OrdinalEntropy.py``, which draws 10 of the first :math:`B-1` rows with Python's
    ``random`` (pass those rows as ``indices``, or ``num_samples=10`` with a ``generator`` to draw them
    from all :math:`B` rows with torch's RNG). The dense depth version averages this loss over images.

    Use it as ``task_loss + lambda * ordinal_entropy_loss(features, targets)`` (a recipe's
    ``loss.regularizers``). The label distances are exact (not floored at :math:`10^{-6}` like the
    authors' clamped ones); targets are compared with ``==``.

    Args:
        features: :math:`(B, *)` floating features (flattened per row), e.g. the encoder output.
        targets: :math:`(B,)` or :math:`(B, T)` real targets (no gradient).
        tightness: add the tightness term.
        centers: diversity over class centres (``True``) or over rows (``False``).
        indices: rows to use (a 1-d integer tensor or sequence); exclusive with ``num_samples``.
        num_samples: use that many rows drawn without replacement (all rows when ``>= B``).
        generator: ``torch.Generator`` for the ``num_samples`` draw (global RNG when ``None``).
        distributed: ``True`` / ``"auto"`` (on when a process group with world size > 1 exists):
            the loss of the **global** batch, see :mod:`rankwise.distributed`. Features are gathered
            with gradient, targets without, every rank returns the same value; each rank's features
            receive ``world_size`` times the single-process gradient, which DDP's gradient averaging
            cancels. ``indices`` index the global batch; a ``num_samples`` draw is made by rank 0 and
            broadcast. Default ``False``: local batch only.

    Shape:
        - features: :math:`(B, *)`; targets: :math:`(B,)`, :math:`(B, 1)` or :math:`(B, T)`.
        - output: scalar, in the compute dtype (float32 for fp16/bf16 features, else the features' dtype).

    Degenerate inputs: no pair of classes (an empty batch, one row, all targets equal) gives a
    diversity of 0, no row away from its centre (every target distinct) a tightness of 0; the loss
    keeps the graph, with zero gradient where nothing constrains.

    Example:
        >>> import torch, rankwise
        >>> z = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [-1.0, 0.0]], requires_grad=True)
        >>> y = torch.tensor([20.0, 20.0, 30.0, 50.0])
        >>> rankwise.losses.ordinal_entropy_loss(z, y)
        tensor(-0.2755, grad_fn=<AddBackward0>)
        >>> rankwise.losses.ordinal_entropy_loss(z, y, tightness=False, centers=False)
        tensor(-0.9350, grad_fn=<AddBackward0>)
    """
    check_floating(features, "features")
    check_bool(tightness, "tightness")
    check_bool(centers, "centers")
    if num_samples is not None:
        num_samples = check_positive_int(num_samples, "num_samples")
    if features.dim() < 1:
        raise ValueError("`features` must have shape (B, *), got a 0-d tensor")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"`generator` must be a torch.Generator or None, got {type(generator).__name__}")
    batch = features.shape[0]
    y = _targets_2d(targets, batch).detach()
    y = to_compute(y) if y.is_floating_point() else y.to(torch.float64)
    x = to_compute(features).reshape(batch, math.prod(features.shape[1:]))
    if global_batch_on(distributed):
        layout = batch_layout(batch, device=x.device)
        x = all_gather_with_grad(x, sizes=layout)
        y = all_gather_no_grad(y, sizes=layout)
        batch = layout.total
        rows = _rows(indices, num_samples, generator, batch, x.device)
        if rows is not None and num_samples is not None:
            rows = broadcast(rows, 0)
    else:
        rows = _rows(indices, num_samples, generator, batch, x.device)
    if rows is not None:
        x, y = x[rows], y[rows]
    return _ordinal_entropy(x, y, tightness, centers)


class OrdinalEntropyLoss(FunctionModule):
    """Module twin of :func:`ordinal_entropy_loss`."""

    _function = staticmethod(ordinal_entropy_loss)
    _options = ("tightness", "centers", "indices", "num_samples", "generator", "distributed")
    _shown = ("tightness", "centers", "num_samples")

    def __init__(
        self,
        *,
        tightness: bool = True,
        centers: bool = True,
        indices: torch.Tensor | Sequence[int] | None = None,
        num_samples: int | None = None,
        generator: torch.Generator | None = None,
        distributed: DistributedFlag = False,
    ) -> None:
        super().__init__()
        self.tightness = check_bool(tightness, "tightness")
        self.centers = check_bool(centers, "centers")
        if indices is not None and num_samples is not None:
            raise ValueError("`indices` and `num_samples` are exclusive: give the rows or their number, not both")
        self.indices = indices
        self.num_samples = None if num_samples is None else check_positive_int(num_samples, "num_samples")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"`generator` must be a torch.Generator or None, got {type(generator).__name__}")
        self.generator = generator
        self.distributed = distributed


# --------------------------------------------------------------------------------------------------
# Dist Loss
# --------------------------------------------------------------------------------------------------

_BANDWIDTHS = ("scott", "silverman")
#: with labels of zero spread the kernel width is this many grid steps (the density's limit: the nearest grid point)
_MIN_WIDTH = 1e-8


def _check_range(label_range: Any) -> tuple[float, float] | None:
    if label_range is None:
        return None
    if not isinstance(label_range, (tuple, list)) or len(label_range) != 2:
        raise TypeError(f"`label_range` must be a (min_label, max_label) pair or None, got {label_range!r}")
    lo, hi = label_range
    for v in (lo, hi):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not abs(float(v)) < math.inf:
            raise ValueError(f"`label_range` must hold two finite numbers, got {label_range!r}")
    if not float(lo) <= float(hi):
        raise ValueError(
            f"`label_range` must be (min_label, max_label) with min_label <= max_label, got {label_range!r}"
        )
    return float(lo), float(hi)


def _check_bandwidth(bandwidth: Any) -> str | float:
    if isinstance(bandwidth, str):
        return str(check_choice(bandwidth, "bandwidth", _BANDWIDTHS))
    if isinstance(bandwidth, bool) or not isinstance(bandwidth, float):
        raise TypeError(f"`bandwidth` must be 'scott', 'silverman' or a float factor, got {bandwidth!r}")
    return check_positive(bandwidth, "bandwidth")


def _check_dist_options(
    step: Any, kind: Any, loss_weight: Any, regularization_strength: Any, reduction: Any, **regression: Any
) -> tuple[float, float, float]:
    check_choice(kind, "kind", REGRESSION_KINDS)
    check_choice(reduction, "reduction", _REDUCTIONS)
    check_choice(regression["activate"], "activate", ("sigmoid", "tanh"))
    check_positive(regression["beta"], "beta")
    check_positive(regression["gamma"], "gamma", allow_zero=True)
    check_positive(regression["huber_beta"], "huber_beta")
    return (
        check_positive(step, "step"),
        check_positive(loss_weight, "loss_weight", allow_zero=True),
        check_positive(regularization_strength, "regularization_strength"),
    )


def _label_grid(lo: float, hi: float, step: float, device: torch.device) -> torch.Tensor:
    """``numpy.arange(lo, hi + step, step)`` in float64 (the authors' grid)."""
    size = max(math.ceil((hi + step - lo) / step), 1)
    return torch.arange(size, dtype=torch.float64, device=device) * step + lo


def _grid_density(
    values: torch.Tensor, counts: torch.Tensor, grid: torch.Tensor, bandwidth: str | float, step: float
) -> torch.Tensor:
    """Gaussian KDE of the labels ``values`` (multiplicities ``counts``, 0 for labels left out) on
    ``grid``, normalised to sum 1; float64, no host sync.

    scipy's ``gaussian_kde`` of the expanded labels: bandwidth ``factor * std`` with the unbiased
    standard deviation, ``factor`` Scott's :math:`n^{-1/5}`, Silverman's :math:`(3n/4)^{-1/5}` or the
    given float. Zero spread gives the limit (all mass on the nearest grid point), no label a uniform density.
    """
    n = counts.sum()
    y = torch.where(counts > 0, values, 0)
    mean = (counts * y).sum() / n.clamp(min=1)
    var = (counts * (y - mean) ** 2).sum() / (n - 1).clamp(min=1)
    if bandwidth == "scott":
        factor = n.clamp(min=1) ** -0.2
    elif bandwidth == "silverman":
        factor = (n.clamp(min=1) * 0.75) ** -0.2
    else:
        factor = torch.full((), float(bandwidth), dtype=torch.float64, device=grid.device)
    h2 = (factor * factor * var).clamp(min=(_MIN_WIDTH * step) ** 2)
    log_k = -((grid.unsqueeze(1) - y.unsqueeze(0)) ** 2) / (2 * h2)
    neg_inf = torch.full((), -math.inf, dtype=torch.float64, device=grid.device)
    log_c = torch.where(counts > 0, counts.clamp(min=1e-300).log(), neg_inf)
    logits = torch.logsumexp(log_k + log_c.unsqueeze(0), dim=1)
    density = torch.softmax(torch.where(n > 0, logits, 0), dim=0)
    return density


def _pseudo_labels(density: torch.Tensor, grid: torch.Tensor, batch: int) -> torch.Tensor:
    """The ``batch`` ascending pseudo-labels of Dist Loss from the grid density (float64, no host sync).

    The authors' ``get_batch_label_distribution``: counts ``round(B p)`` per label, the mass below the
    first label whose cumulative count reaches 1 (and above the last one) lumped into it, and the
    rounding residual spread over a window of width ``|residual|`` (at most half the grid, else
    ``residual // half`` per label plus the remainder at the mode) centred on the mode; then labels
    repeated by their counts. Defined where theirs is not: the window is shifted inside the grid
    (theirs wraps around or is cut short), a negative residual beyond half the grid is subtracted
    (theirs adds it), and the pseudo-labels follow the cumulative counts made non-decreasing and
    capped at ``B`` (theirs leave zeros or drop labels when counts go negative), so there are always
    ``B`` of them, ascending, on the grid.
    """
    size = density.shape[0]
    dev = density.device
    nd = density * batch
    fc = torch.cumsum(nd, 0)
    bc = torch.flip(torch.cumsum(torch.flip(nd, (0,)), 0), (0,))
    one = torch.ones(1, dtype=torch.float64, device=dev)
    fi = torch.searchsorted(fc, one)[0].clamp(max=size - 1)
    bi = (size - 1 - torch.searchsorted(torch.flip(bc, (0,)), one)[0]).clamp(min=0)
    idx = torch.arange(size, device=dev)
    counts = torch.where((idx > fi) & (idx < bi), torch.round(nd), 0)
    counts = torch.where(idx == fi, torch.round(fc.gather(0, fi.reshape(1))), counts)
    counts = torch.where(idx == bi, torch.round(bc.gather(0, bi.reshape(1))), counts)
    res = batch - counts.sum()
    mode = torch.argmax(counts)
    half = max(int(0.5 * size), 1)
    a, s = res.abs(), torch.sign(res)
    small = a <= half
    width = torch.where(small, a, half)
    per = torch.where(small, s, s * torch.div(a, half, rounding_mode="floor"))
    extra = torch.where(small, 0, s * torch.remainder(a, half))
    left = torch.minimum((mode - torch.div(width, 2, rounding_mode="floor")).clamp(min=0), size - width)
    window = (idx >= left) & (idx < left + width)
    counts = counts + window * per + (idx == mode) * extra
    cum = torch.cummax(torch.cumsum(counts, 0), 0).values.clamp(0, batch)
    pos = torch.arange(batch, dtype=torch.float64, device=dev)
    k = torch.searchsorted(cum, pos, right=True).clamp(max=size - 1)
    return grid[k]


def _dist_terms(
    predictions: torch.Tensor,
    targets: torch.Tensor,
    weights: torch.Tensor | None,
    pseudo: torch.Tensor,
    *,
    kind: str,
    loss_weight: float,
    regularization_strength: float,
    reduction: str,
    **regression: Any,
) -> torch.Tensor:
    """``w * (loss_weight * l(soft_sort(pred), pseudo) + l(pred, target))`` reduced."""
    dt = common_compute_dtype(predictions, targets, weights)
    p = predictions.to(dt)
    flat = p.reshape(-1)
    batch = flat.shape[0]
    if batch == 0:
        out = p.sum() * 0
        return out if reduction != "none" else p * 0
    with autocast_off(p.device):
        s = soft_sort_isotonic(flat, regularization="l2", regularization_strength=regularization_strength)
    pseudo = pseudo.to(dt)
    dist = regression_loss(s, pseudo, kind=kind, reduction="none", **regression)  # type: ignore[arg-type]
    plain = regression_loss(flat, targets.to(dt).reshape(-1), kind=kind, reduction="none", **regression)  # type: ignore[arg-type]
    total = loss_weight * dist + plain
    if weights is not None:
        total = total * weights.to(dt).reshape(-1)
    if reduction == "none":
        return total.reshape(p.shape)
    return total.sum() if reduction == "sum" else total.mean()


def _check_pred_target(predictions: Any, targets: Any, weights: Any) -> None:
    check_floating(predictions, "predictions")
    check_real(targets, "targets")
    if predictions.dim() not in (1, 2) or (predictions.dim() == 2 and predictions.shape[1] != 1):
        raise ValueError(f"`predictions` must have shape (B,) or (B, 1), got {tuple(predictions.shape)}")
    if targets.shape != predictions.shape:
        raise ValueError(
            f"`targets` must have the shape of `predictions` {tuple(predictions.shape)}, got {tuple(targets.shape)}; "
            "reshape one of them (e.g. `targets.view_as(predictions)`)"
        )
    if weights is not None:
        check_real(weights, "weights")
        b = predictions.shape[0]
        if weights.numel() != b or weights.dim() > 2:
            raise ValueError(f"`weights` must have shape ({b},) or ({b}, 1), got {tuple(weights.shape)}")


def _as_labels(train_labels: Any, device: torch.device | None = None) -> torch.Tensor:
    if isinstance(train_labels, torch.Tensor):
        check_real(train_labels, "train_labels")
        t = train_labels.detach()
    else:
        try:
            t = torch.as_tensor(train_labels, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(
                f"`train_labels` must be a real tensor or a sequence of numbers, got {type(train_labels).__name__}"
            ) from None
    if t.device.type == "meta":
        raise ValueError(f"`train_labels` must hold values (a CPU or the predictions' device tensor), got {t.device}")
    return t.reshape(-1).to(dtype=torch.float64, device=device)


@batch_loss("predictions", "targets", "weights")
def dist_loss(
    predictions: torch.Tensor,
    targets: torch.Tensor,
    *,
    train_labels: torch.Tensor | Sequence[float],
    weights: torch.Tensor | None = None,
    label_range: tuple[float, float] | None = None,
    step: float = 1.0,
    bandwidth: str | float = "scott",
    kind: str = "l1",
    loss_weight: float = 1.0,
    regularization_strength: float = 0.1,
    beta: float = 0.2,
    gamma: float = 1.0,
    activate: str = "sigmoid",
    huber_beta: float = 1.0,
    reduction: Reduction = "mean",
) -> torch.Tensor:
    r"""Dist Loss (Nie et al., 2024, "Dist Loss: Enhancing Regression in Few-Shot Region through
    Distribution Distance Constraint").

    The training labels in ``label_range`` give a Gaussian kernel density (scipy's ``gaussian_kde``:
    bandwidth ``factor * std``, ``factor`` Scott's :math:`n^{-1/5}` by default) on the grid
    ``arange(min_label, max_label + step, step)``, normalised to sum 1. It becomes :math:`B` ascending
    pseudo-labels :math:`\tilde y_{(1)} \le \dots \le \tilde y_{(B)}` (each grid label repeated by its
    rounded share of the batch, the authors' ``get_batch_theoretical_labels``). With the l2 soft sort
    :math:`s = \mathrm{soft\_sort}(\hat y)` (ascending, ``regularization_strength``; fast-soft-sort's,
    which the authors use) and the per-sample loss :math:`\ell` (``kind``, see
    :func:`rankwise.imbalanced.regression_loss`):

    .. math::
        L = \operatorname{mean}_i\, w_i \bigl(\lambda\, \ell(s_i, \tilde y_{(i)}) + \ell(\hat y_i, y_i)\bigr)

    with :math:`\lambda` = ``loss_weight`` and :math:`w_i` = ``weights`` (1 when ``None``). As in the
    authors' code, :math:`w_i` multiplies the distribution term at sorted position :math:`i`.

    This function computes the density on every call (a :math:`N \times L` kernel matrix for
    :math:`N` training labels); :class:`DistLoss` computes it once. ``label_range=None`` takes the
    training labels' min and max, read on the host (give the range to keep the call free of host
    syncs and compilable). Differences from the authors' code: the pseudo-labels are always :math:`B`
    ascending grid labels (see the degenerate cases below); grid labels are ``min_label + i * step``
    (theirs add ``step`` repeatedly).

    Args:
        predictions: :math:`(B,)` or :math:`(B, 1)` floating predictions.
        targets: real targets, the shape of ``predictions``.
        train_labels: all training labels (a tensor or a sequence; those outside ``label_range`` are
            left out, as the authors do; a NaN/inf among them makes the loss NaN).
        weights: per-sample weights :math:`(B,)` or :math:`(B, 1)`, or ``None``.
        label_range: ``(min_label, max_label)`` of the grid (the authors' theoretical range), or
            ``None`` for the training labels' range.
        step: grid spacing (> 0).
        bandwidth: ``"scott"``, ``"silverman"`` or a float factor (the authors' training scripts use 0.5).
        kind: ``"l1"`` (the authors' default), ``"mse"``, ``"huber"``, ``"focal_l1"``, ``"focal_mse"``;
            ``beta``, ``gamma``, ``activate``, ``huber_beta`` as in :func:`rankwise.imbalanced.regression_loss`.
        loss_weight: :math:`\lambda` (>= 0).
        regularization_strength: the soft sort's strength (> 0; the authors' 0.1).
        reduction: ``"mean"`` (the authors' ``size_average``), ``"sum"`` or ``"none"``.

    Shape:
        - predictions, targets: :math:`(B,)` or :math:`(B, 1)`; train_labels: any shape (flattened).
        - output: scalar, or the shape of ``predictions`` for ``reduction="none"``, in the common compute
          dtype of ``predictions``, ``targets`` and ``weights`` (float32 for fp16/bf16).

    Degenerate inputs: an empty batch gives 0 keeping the graph; :math:`B = 1` has one pseudo-label;
    no training label in range gives a uniform density, labels of zero spread all mass on the nearest
    grid label. Where the authors' rounding leaves counts that do not sum to :math:`B` (their residual
    window wraps around the grid's start or is cut at its end, or a large negative residual is added),
    rankwise shifts the window inside the grid, subtracts the residual and repeats each label by its
    non-negative count, capped at :math:`B`.

    Example:
        >>> import torch, rankwise
        >>> pred = torch.tensor([31.0, 24.0, 40.0, 52.0], requires_grad=True)
        >>> target = torch.tensor([30.0, 25.0, 38.0, 60.0])
        >>> labels = torch.tensor([20.0, 22.0, 25.0, 25.0, 30.0, 31.0, 35.0, 40.0, 48.0, 60.0])
        >>> rankwise.losses.dist_loss(pred, target, train_labels=labels, label_range=(20, 60))
        tensor(10.2500, grad_fn=<AddBackward0>)
    """
    _check_pred_target(predictions, targets, weights)
    regression = {"beta": beta, "gamma": gamma, "activate": activate, "huber_beta": huber_beta}
    step_, lw, rs = _check_dist_options(step, kind, loss_weight, regularization_strength, reduction, **regression)
    bw = _check_bandwidth(bandwidth)
    rng = _check_range(label_range)
    labels = _as_labels(train_labels)
    if labels.device != predictions.device and labels.device.type != "cpu":
        raise ValueError(
            f"`train_labels` must be on the device of `predictions` ({predictions.device}) or on the CPU, "
            f"got {labels.device}"
        )
    if rng is None:  # read on the host
        lo, hi = (float(labels.min()), float(labels.max())) if labels.numel() else (math.nan, math.nan)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ValueError("`train_labels` must hold finite values to give the grid's range (or give `label_range`)")
        rng = (lo, hi)
    labels = labels.to(predictions.device)
    grid = _label_grid(rng[0], rng[1], step_, predictions.device)
    inside = (labels >= rng[0]) & (labels <= rng[1])
    density = _grid_density(labels, inside.to(torch.float64), grid, bw, step_)
    pseudo = _pseudo_labels(density, grid, predictions.shape[0])
    out = _dist_terms(
        predictions,
        targets,
        weights,
        pseudo,
        kind=kind,
        loss_weight=lw,
        regularization_strength=rs,
        reduction=reduction,
        **regression,
    )
    return nan_if_nonfinite(out, labels)


class DistLoss(nn.Module):
    r"""Module twin of :func:`dist_loss` holding the density of the training labels.

    ``train_labels`` (the full training labels; the recipes pass them) are read once, on the host,
    here: their Gaussian kernel density on the grid is stored as the buffer ``density`` (with the
    grid as ``grid``; both follow ``.to(device)`` and the state dict). ``forward(predictions, targets,
    weights=None)`` builds the batch's pseudo-labels from it (:meth:`pseudo_labels`, on the device,
    without host syncs) and returns :func:`dist_loss`'s value. Unlike the function, the module
    refuses training labels that are not finite or that leave ``label_range`` empty (``ValueError``).

    Example:
        >>> import torch
        >>> from rankwise.losses import DistLoss
        >>> labels = torch.tensor([20.0, 22.0, 25.0, 25.0, 30.0, 31.0, 35.0, 40.0, 48.0, 60.0])
        >>> crit = DistLoss(train_labels=labels, label_range=(20, 60))
        >>> crit.pseudo_labels(4)
        tensor([26., 27., 27., 42.], dtype=torch.float64)
        >>> crit(torch.tensor([31.0, 24.0, 40.0, 52.0]), torch.tensor([30.0, 25.0, 38.0, 60.0]))
        tensor(10.2500)
    """

    grid: torch.Tensor
    density: torch.Tensor

    def __init__(
        self,
        *,
        train_labels: torch.Tensor | Sequence[float] | None = None,
        label_range: tuple[float, float] | None = None,
        step: float = 1.0,
        bandwidth: str | float = "scott",
        kind: str = "l1",
        loss_weight: float = 1.0,
        regularization_strength: float = 0.1,
        beta: float = 0.2,
        gamma: float = 1.0,
        activate: str = "sigmoid",
        huber_beta: float = 1.0,
        reduction: Reduction = "mean",
    ) -> None:
        super().__init__()
        self.regression = {"beta": beta, "gamma": gamma, "activate": activate, "huber_beta": huber_beta}
        self.step, self.loss_weight, self.regularization_strength = _check_dist_options(
            step, kind, loss_weight, regularization_strength, reduction, **self.regression
        )
        self.bandwidth = _check_bandwidth(bandwidth)
        self.kind, self.reduction = kind, reduction
        rng = _check_range(label_range)
        if train_labels is None:
            raise MissingTrainLabelsError(
                "`train_labels` is required: Dist Loss draws its pseudo-labels from the training labels' density"
            )
        labels = _as_labels(train_labels, torch.device("cpu"))
        if not bool(torch.isfinite(labels).all()):
            raise ValueError("`train_labels` must be finite, got NaN or inf values")
        if rng is None:
            if labels.numel() == 0:
                raise ValueError("`train_labels` is empty: give at least one label")
            rng = (float(labels.min()), float(labels.max()))
        labels = labels[(labels >= rng[0]) & (labels <= rng[1])]
        if labels.numel() == 0:
            raise ValueError(f"`train_labels` has no label in `label_range` {rng}")
        self.label_range = rng
        values, counts = torch.unique(labels, return_counts=True)
        grid = _label_grid(rng[0], rng[1], self.step, torch.device("cpu"))
        self.register_buffer("grid", grid)
        self.register_buffer(
            "density", _grid_density(values, counts.to(torch.float64), grid, self.bandwidth, self.step)
        )

    def pseudo_labels(self, batch_size: int) -> torch.Tensor:
        """The ``batch_size`` ascending pseudo-labels (float64, on the buffers' device)."""
        return _pseudo_labels(self.density, self.grid, int(batch_size))

    def forward(
        self, predictions: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        return _dist_loss_module(self, predictions, targets, weights)

    def extra_repr(self) -> str:
        return (
            f"label_range={self.label_range}, step={self.step}, bandwidth={self.bandwidth!r}, kind={self.kind!r}, "
            f"loss_weight={self.loss_weight}, regularization_strength={self.regularization_strength}"
        )


@batch_loss("predictions", "targets", "weights")
def _dist_loss_module(
    module: DistLoss, predictions: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None = None
) -> torch.Tensor:
    _check_pred_target(predictions, targets, weights)
    pseudo = _pseudo_labels(
        module.density.to(predictions.device), module.grid.to(predictions.device), predictions.shape[0]
    )
    return _dist_terms(
        predictions,
        targets,
        weights,
        pseudo,
        kind=module.kind,
        loss_weight=module.loss_weight,
        regularization_strength=module.regularization_strength,
        reduction=module.reduction,
        **module.regression,
    )


# --------------------------------------------------------------------------------------------------
# registration
# --------------------------------------------------------------------------------------------------

register_loss(
    "ordinal_entropy",
    module=OrdinalEntropyLoss,
    inputs={"features": "features", "targets": "targets"},
    takes="features",
)(ordinal_entropy_loss)
register_loss(
    "dist_loss",
    module=DistLoss,
    inputs={"predictions": "predictions", "targets": "targets"},
    takes="predictions",
)(dist_loss)
