"""Rank-based losses: RankSim, the SoDeep-style Spearman loss, and the age-difference loss.

* :func:`ranksim_loss` — RankSim (Gong et al., ICML'22), a regulariser that makes the ranking of
  feature similarities follow the ranking of label similarities.
* :func:`spearman_loss` / :func:`spearman_correlation` — Spearman's rho through a differentiable
  ranker (SoDeep, Engilberge et al., CVPR'19, with any rankwise ranker in place of the learned sorter).
* :func:`pairwise_difference_loss` — the age-difference loss :math:`L_d` of Cheng et al. (IEEE TMI 2021).

Every loss is a function plus an ``nn.Module`` twin, registered with ``register_loss``.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch

from rankwise._kernels import ranksim as kernels
from rankwise._random import randperm_from
from rankwise._twin import FunctionModule
from rankwise._validation import (
    autocast_off,
    batch_loss,
    check_bool,
    check_floating,
    check_positive,
    check_real,
    check_same_device,
    common_compute_dtype,
    nan_slices,
    to_compute,
)
from rankwise.distributed import (
    DistributedFlag,
    all_gather_no_grad,
    all_gather_with_grad,
    batch_layout,
    broadcast,
    get_world_size,
    global_batch_on,
    scale_grad,
)
from rankwise.losses._contrastive_common import safe_normalize
from rankwise.losses._registry import register_loss
from rankwise.ops.ranking import BlackboxRankFunction, blackbox_rank, rank
from rankwise.ops.soft import list_soft_methods, soft_rank

__all__ = [
    "PairwiseDifferenceLoss",
    "RankSimLoss",
    "SpearmanCorrelation",
    "SpearmanLoss",
    "list_spearman_rankers",
    "pairwise_difference_loss",
    "ranksim_loss",
    "sample_unique_labels",
    "spearman_correlation",
    "spearman_loss",
]


# --------------------------------------------------------------------------------------------------
# RankSim
# --------------------------------------------------------------------------------------------------


def _targets_1d(targets: Any, batch: int, name: str = "targets") -> torch.Tensor:
    check_real(targets, name)
    y = targets[:, 0] if targets.dim() == 2 and targets.shape[1] == 1 else targets
    if y.dim() != 1 or y.shape[0] != batch:
        raise ValueError(
            f"`{name}` must have shape ({batch},) or ({batch}, 1) to match `features` (batch size {batch}), "
            f"got shape {tuple(targets.shape)}"
        )
    return y


def sample_unique_labels(targets: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
    r"""Boolean mask keeping one uniformly random example per distinct label (vectorized).

    Every example gets a random priority from ``torch.randperm(B, generator=generator)``; an example
    is kept when no other example with the same label has a higher priority. Within each label the
    kept example is therefore uniform, independently across labels, and the draw is reproducible
    through ``generator`` (or the global torch RNG of the generator's / targets' device). The mask
    has the full batch shape, so nothing depends on the number of distinct labels and nothing
    synchronizes with the host; the cost is one :math:`B \times B` boolean comparison.

    Shape:
        - targets: :math:`(B,)` or :math:`(B, 1)`, any dtype (labels compared with ``==``).
        - output: :math:`(B,)` bool, ``True`` for kept examples.

    Example:
        >>> import torch, rankwise
        >>> y = torch.tensor([3.0, 1.0, 3.0, 2.0, 1.0])
        >>> keep = rankwise.losses.sample_unique_labels(y, generator=torch.Generator().manual_seed(0))
        >>> sorted(y[keep].tolist())
        [1.0, 2.0, 3.0]
    """
    check_real(targets, "targets")
    if targets.dim() == 0:
        raise ValueError("`targets` must have shape (B,) or (B, 1), got a 0-d tensor")
    y = _targets_1d(targets, targets.shape[0])
    gen_device = generator.device if generator is not None else y.device
    prio = randperm_from(y.shape[0], generator, device=gen_device).to(y.device)
    return _unique_by_priority(y, prio)


def _unique_by_priority(y: torch.Tensor, prio: torch.Tensor) -> torch.Tensor:
    """Keep, per distinct label, the example of highest priority ``prio`` (a permutation)."""
    same = y.unsqueeze(1) == y.unsqueeze(0)
    beaten = same & (prio.unsqueeze(0) > prio.unsqueeze(1))  # [i, j]: j has i's label and a higher priority
    return ~beaten.any(dim=1)


class _Gram(torch.autograd.Function):
    """``x @ x.T`` with the symmetric backward ``(G + G.T) @ x`` (one matmul instead of two)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x)
        with autocast_off(x.device):  # in x's (compute) dtype: float32 under autocast too
            return x @ x.transpose(0, 1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        (x,) = ctx.saved_tensors
        with autocast_off(x.device):
            return (grad + grad.transpose(0, 1)).to(x.dtype) @ x


@batch_loss("features", "targets")
def ranksim_loss(
    features: torch.Tensor,
    targets: torch.Tensor,
    *,
    interpolation_lambda: float = 2.0,
    unique_labels: bool = True,
    generator: torch.Generator | None = None,
    distributed: DistributedFlag = False,
) -> torch.Tensor:
    r"""RankSim regulariser (Gong et al., ICML'22, eq. 4).

    On the subset :math:`M` of the batch (one random example per distinct label when
    ``unique_labels``, see :func:`sample_unique_labels`; the whole batch otherwise), with
    :math:`S^z_{ij} = \cos(z_i, z_j)` on the flattened features and :math:`S^y_{ij} = -|y_i - y_j|`:

    .. math::
        L_{\mathrm{RankSim}} = \sum_{i \in M} \frac{1}{|M|} \sum_{j \in M}
        \Bigl(\mathrm{rk}(S^z_{i,:})_j - \mathrm{rk}(S^y_{i,:})_j\Bigr)^2

    where :math:`\mathrm{rk}` are descending ranks divided by :math:`|M|` (largest similarity ->
    :math:`1/|M|`), i.e. ``rankwise.rank(..., descending=True, normalize=True)`` on the subset. The
    feature ranks use :func:`rankwise.blackbox_rank` (exact forward, blackbox-differentiation
    backward with ``interpolation_lambda``), the label ranks are constants. Rows are **summed** and
    each row's squared error is **averaged** (MSE), exactly as the reference sums ``F.mse_loss``
    over rows: this is the scale the paper's balancing weight (gamma = 100 on AgeDB / IMDB-WIKI,
    3e-4 on STS-B) was tuned for, so use ``task_loss + gamma * ranksim_loss(...)``. Each row
    includes the anchor itself (similarity 1, label distance 0), as in the paper.

    Implementation: all rows are ranked at once with one ``blackbox_rank`` call on the
    :math:`B \times B` similarity matrix. Examples left out of :math:`M` are masked (their columns
    set to ``-inf`` so they rank last, their rows and columns excluded from the error) instead of
    indexed out, which keeps every shape static and avoids a host synchronization; the masked
    input is scaled by :math:`B/|M|` so that ranks, normalisation and the blackbox perturbation are
    exactly those of ``blackbox_rank(S_sub, interpolation_lambda, normalize=True)`` on the subset
    (when no label repeats or ``unique_labels=False`` the scale is exactly 1 and the computation is
    bit-identical to the unmasked one; otherwise the values are the same and the gradient agrees up
    to rounding of the scaled similarities).

    Differences from the reference code: the subset is drawn with the torch RNG (reproducible
    through ``generator``) instead of Python's ``random``; ties are broken stably (lower index
    first) instead of in ``argsort`` order; ``interpolation_lambda`` must be > 0 instead of having
    ``1e-8`` added.

    Args:
        features: :math:`(B, *)` floating features (flattened per example), e.g. the encoder output.
        targets: :math:`(B,)` or :math:`(B, 1)` labels.
        interpolation_lambda: blackbox interpolation strength :math:`\lambda` (> 0; paper: 2).
        unique_labels: keep one random example per distinct label before computing the loss.
        generator: ``torch.Generator`` for the subset draw (global RNG when ``None``).
        distributed: ``True`` / ``"auto"`` (on when a process group with world size > 1 exists):
            compute RankSim on the **global** batch of all ranks, see :mod:`rankwise.distributed`.
            Features are gathered with gradient, targets without; the unique-label subset
            :math:`M` is drawn on the global batch by rank 0 (with ``generator`` or its global RNG)
            and broadcast, so all ranks use the same subset; each rank computes the rows
            :math:`i \in M` of its own examples against all of :math:`M` and returns
            ``world_size * (sum of its rows) / |M|``. The mean of the returned values over ranks is
            the single-process loss on the concatenated batch, and after DDP's gradient averaging
            the parameters get the single-process gradient. Default ``False``: local batch only.

    Shape:
        - features: :math:`(B, *)`; targets: :math:`(B,)` or :math:`(B, 1)`.
        - output: scalar, in the compute dtype (float32 for fp16/bf16 features, else the features' dtype).

    Degenerate inputs: an empty batch, ``B = 1`` or a single distinct label give ``0`` that keeps
    the graph (zero gradient).

    Example:
        >>> import torch, rankwise
        >>> z = torch.randn(8, 16, requires_grad=True)
        >>> y = torch.tensor([20.0, 25.0, 31.0, 20.0, 47.0, 52.0, 25.0, 60.0])
        >>> loss = rankwise.losses.ranksim_loss(z, y, generator=torch.Generator().manual_seed(0))
        >>> loss.backward()
        >>> loss.shape, z.grad.shape
        (torch.Size([]), torch.Size([8, 16]))
    """
    check_floating(features, "features")
    lam = check_positive(interpolation_lambda, "interpolation_lambda")
    check_bool(unique_labels, "unique_labels")
    if features.dim() < 1:
        raise ValueError("`features` must have shape (B, *), got a 0-d tensor")
    batch = features.shape[0]
    y = _targets_1d(targets, batch).detach()
    # label distances in the labels' own precision: float64 for integer labels (exact up to 2**53)
    y = to_compute(y) if y.is_floating_point() else y.to(torch.float64)
    x = to_compute(features)
    if global_batch_on(distributed):
        return _ranksim_global(x, y, lam, unique_labels, generator)
    if batch == 0:
        return x.sum() * 0
    sim = _Gram.apply(safe_normalize(x.reshape(batch, -1), dim=1))
    if unique_labels:
        keep = sample_unique_labels(y, generator=generator)
    else:
        keep = torch.ones(batch, dtype=torch.bool, device=x.device)
    return _ranksim_rows(sim, y, keep, keep, lam)


def _ranksim_rows(
    sim: torch.Tensor,
    y: torch.Tensor,
    keep: torch.Tensor,
    row_keep: torch.Tensor,
    lam: float,
    rows: slice = slice(None),
) -> torch.Tensor:
    """Sum of RankSim rows ``rows`` (``sim``: those rows against all B columns) divided by |M|."""
    x = sim
    batch = keep.shape[0]
    m = keep.sum().to(x.dtype).clamp_min(1)  # |M| as a tensor: no host sync
    scale = batch / m  # exactly 1 when nothing is masked
    col = keep.unsqueeze(0)
    neg_inf = torch.full((), -math.inf, dtype=x.dtype, device=x.device)  # a fill: no host copy
    # blackbox_rank(c * s, lam, normalize=True) * c with c = B / m equals ranks / m with the
    # backward of blackbox_rank(s_sub, lam, normalize=True) on the subset (perturbation x + lam * g).
    # (the internal node skips blackbox_rank's NaN-slice passes: a non-finite feature makes the
    # whole loss NaN anyway, see batch_loss)
    masked = torch.where(col, sim, neg_inf) * scale
    feat_rank = BlackboxRankFunction.apply(masked, lam, True, True, False) * scale
    label_rank = _label_ranks(y[rows], y, keep).to(x.dtype) / m
    pair = row_keep.unsqueeze(1) & col
    diff = (feat_rank - label_rank).masked_fill_(~pair, 0).reshape(-1)
    with autocast_off(diff.device):
        return (diff @ diff) / m


def _label_ranks(y_rows: torch.Tensor, y: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``rank(where(keep, -|y_rows[:, None] - y|, -inf), descending=True)`` (ordinal, stable ties).

    On CPU a kernel (:mod:`rankwise._kernels.ranksim`) merges, per row, the two label-sorted runs
    left and right of the row's label (O(B) per row after one O(B log B) sort of the labels)
    instead of sorting every row;
    elsewhere, or without numba, the rows are sorted.
    """
    if y.device.type == "cpu" and kernels.ready():
        out: torch.Tensor = kernels.label_distance_ranks(y_rows, y, keep)
        return out
    label_sim = -(y_rows.unsqueeze(1) - y.unsqueeze(0)).abs()
    neg_inf = torch.full((), -math.inf, dtype=label_sim.dtype, device=label_sim.device)
    return rank(torch.where(keep.unsqueeze(0), label_sim, neg_inf), descending=True)


def _ranksim_global(
    x: torch.Tensor, y: torch.Tensor, lam: float, unique_labels: bool, generator: torch.Generator | None
) -> torch.Tensor:
    """Distributed RankSim: local rows against the gathered batch, scaled by the world size."""
    world = get_world_size()
    layout = batch_layout(x.shape[0], device=x.device)
    # the world-size factor goes on the gradient of the gathered features (not on the loss
    # value upstream of blackbox_rank, whose surrogate gradient is not linear in its input gradient)
    flat = x.reshape(x.shape[0], math.prod(x.shape[1:]))
    zg = scale_grad(all_gather_with_grad(flat, sizes=layout), world)
    yg = all_gather_no_grad(y, sizes=layout)
    total = layout.total
    if total == 0:
        return zg.sum() * 0
    if unique_labels:  # a collective: before any rank-dependent early return
        gen_device = generator.device if generator is not None else yg.device
        prio = broadcast(randperm_from(total, generator, device=gen_device).to(yg.device), 0)
        keep = _unique_by_priority(yg, prio)
    else:
        keep = torch.ones(total, dtype=torch.bool, device=yg.device)
    rows = layout.local
    if layout.sizes[layout.rank] == 0:
        return zg.sum() * 0
    zn = safe_normalize(zg, dim=1)
    with autocast_off(zn.device):  # float32 under autocast, as the local path
        sim = zn[rows] @ zn.transpose(0, 1)
    share = _ranksim_rows(sim, yg, keep, keep[rows], lam, rows)
    return share + (world - 1) * share.detach()  # value: world * share; gradient: see scale_grad above


class RankSimLoss(FunctionModule):
    """Module twin of :func:`ranksim_loss` holding ``interpolation_lambda``, ``unique_labels`` and ``generator``."""

    _function = staticmethod(ranksim_loss)
    _options = ("interpolation_lambda", "unique_labels", "generator", "distributed")
    _shown = ("interpolation_lambda", "unique_labels")

    def __init__(
        self,
        *,
        interpolation_lambda: float = 2.0,
        unique_labels: bool = True,
        generator: torch.Generator | None = None,
        distributed: DistributedFlag = False,
    ) -> None:
        super().__init__()
        self.interpolation_lambda = check_positive(interpolation_lambda, "interpolation_lambda")
        self.unique_labels = unique_labels
        self.generator = generator
        self.distributed = distributed


# --------------------------------------------------------------------------------------------------
# Spearman
# --------------------------------------------------------------------------------------------------


def list_spearman_rankers() -> list[str]:
    """Rankers accepted by :func:`spearman_loss`: every soft method of ``rankwise.soft_rank`` and ``"blackbox"``."""
    return sorted({*list_soft_methods(), "blackbox"})


def _check_ranker(ranker: Any, ranker_kwargs: dict[str, Any]) -> None:
    valid = list_spearman_rankers()
    if ranker not in valid:
        raise ValueError(f"`ranker` must be one of {', '.join(repr(v) for v in valid)}; got {ranker!r}")
    if ranker == "blackbox":
        unknown = sorted(set(ranker_kwargs) - {"lambda_val"})
        if unknown:
            raise TypeError(f"ranker 'blackbox' accepts only the option `lambda_val`, got {', '.join(unknown)}")
        check_positive(ranker_kwargs.get("lambda_val", 2.0), "lambda_val")


def _pred_target(pred: Any, target: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate and align ``pred`` / ``target``: a trailing singleton dim is dropped ((B, 1) -> (B,)).

    Both are brought to their common compute dtype (:func:`rankwise._validation.common_compute_dtype`:
    a float64 target is never rounded to a float32 prediction's dtype); integer targets stay integer
    (ranked exactly, promoted in arithmetic).
    """
    check_floating(pred, "pred")
    check_real(target, "target")
    check_same_device("pred", pred, ("target", target))
    p = pred[..., 0] if pred.dim() >= 2 and pred.shape[-1] == 1 else pred
    t = target[..., 0] if target.dim() >= 2 and target.shape[-1] == 1 else target
    if p.dim() == 0:
        raise ValueError("`pred` must have shape (B,), (B, 1) or (*, B), got a 0-d tensor")
    if p.shape != t.shape:
        raise ValueError(
            f"`pred` and `target` must have the same shape (a trailing singleton dim is ignored), "
            f"got {tuple(pred.shape)} and {tuple(target.shape)}"
        )
    dt = common_compute_dtype(p, t)
    return _as_dtype(p, dt), (_as_dtype(t, dt) if t.is_floating_point() else t)


def _as_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t if t.dtype == dtype else t.to(dtype)


def _ranks_length(ranker: str, n: int, ranker_kwargs: dict[str, Any]) -> bool:
    """Whether ``ranker`` with ``ranker_kwargs`` ranks sequences of length ``n``: every ranker does,
    except ``"sodeep"`` without a ``sorter``, which needs a bundled sorter of length ``n``."""
    if ranker != "sodeep" or ranker_kwargs.get("sorter") is not None or n <= 1:
        return True
    from rankwise.sodeep.hub import available_sorters

    return (ranker_kwargs.get("model", "gru"), n) in available_sorters() or ranker_kwargs.get("model") == "exact"


def _check_fallback(fallback: Any, ranker: str) -> None:
    if fallback is None:
        return
    valid = [r for r in list_spearman_rankers() if r != "sodeep"]
    if fallback not in valid:
        raise ValueError(
            f"`fallback` must be None or a ranker of every length ({', '.join(repr(v) for v in valid)}); "
            f"got {fallback!r}"
        )


def _soft_ranks(
    p: torch.Tensor, ranker: str, ranker_kwargs: dict[str, Any], fallback: str | None = None
) -> torch.Tensor:
    """Descending soft ranks of ``p`` along the last dim divided by n (largest -> about 1/n); a length
    ``ranker`` cannot rank goes to ``fallback`` (with its default options) when it is given."""
    n = p.shape[-1]
    if fallback is not None and not _ranks_length(ranker, n, ranker_kwargs):
        ranker, ranker_kwargs = fallback, {}
    if ranker == "blackbox":
        return blackbox_rank(p, ranker_kwargs.get("lambda_val", 2.0), descending=True, normalize=True)
    return soft_rank(p, method=ranker, descending=True, **ranker_kwargs) / n


@batch_loss("pred", "target")
def spearman_loss(
    pred: torch.Tensor,
    target: torch.Tensor,
    *,
    ranker: str = "isotonic",
    l1_weight: float = 0.0,
    distributed: DistributedFlag = False,
    fallback: str | None = None,
    **ranker_kwargs: Any,
) -> torch.Tensor:
    r"""Spearman loss of SoDeep (Engilberge et al., CVPR'19): MSE between soft and true ranks, plus L1.

    .. math::
        L = \frac{1}{n} \sum_j \Bigl(\widetilde{\mathrm{rk}}(\hat y)_j - \mathrm{rk}(y)_j\Bigr)^2
            + w_{\ell_1} \frac{1}{n} \sum_j |\hat y_j - y_j|

    Both ranks are **descending and divided by n** as SoDeep's ``get_rank`` (largest -> ``1/n``);
    the target ranks average ties (``get_tiedrank``: ``rank(target, descending=True,
    ties="average", normalize=True)``) and carry no gradient. For distinct values the first term
    equals :math:`(1 - \rho)\,(n^2 - 1) / (6 n^2)` with :math:`\rho` the Spearman correlation, so
    minimising it maximises :math:`\rho`.

    The soft ranks come from ``ranker``, which replaces SoDeep's learned sorter:

    * any soft method of ``rankwise.soft_rank`` (``"isotonic"``, ``"neuralsort"``, ``"softsort"``,
      ``"sodeep"`` once registered; see :func:`list_spearman_rankers`) —
      ``soft_rank(pred, method=ranker, descending=True, **ranker_kwargs) / n``;
    * ``"blackbox"`` — ``blackbox_rank(pred, lambda_val, descending=True, normalize=True)``
      (``ranker_kwargs``: ``lambda_val``, default 2.0).

    ``fallback``: the ranker (e.g. ``"isotonic"``), with its default options, of a sequence whose
    length ``ranker`` cannot rank -- ``"sodeep"`` without a ``sorter`` ranks only the lengths of its
    bundled sorters (32, 64, 128), so a batch of 25 or a short last batch would raise ``ValueError``;
    ``None`` (default): it does. The isotonic ranks (Blondel et al., ICML'20) equal the exact ranks
    for predictions further apart than its ``regularization_strength`` (default 1).

    ``l1_weight`` is SoDeep's ``lbd``: set it to 1 for a few epochs to initialise the regressor
    (ranks alone do not fix the scale of the predictions), then to 0.

    ``distributed=True`` / ``"auto"`` (see :mod:`rankwise.distributed`) ranks over the **global**
    batch: ``pred`` (with gradient) and ``target`` are gathered from all ranks along the last dim
    and every rank returns the loss of the whole gathered batch (the same value on every rank;
    ranking is :math:`O(n \log n)`, cheap next to the model). Every rank backpropagates it through
    the differentiable gather, so each rank's ``pred`` receives ``world_size`` times the
    single-process gradient, which DDP's gradient averaging cancels; the soft ranker sees exactly
    the single-process upstream gradient (this matters for ``"blackbox"``, whose surrogate
    gradient is not linear in it).

    Shape:
        - pred: :math:`(B,)`, :math:`(B, 1)` or :math:`(*, B)` floating (ranked along the last dim;
          a trailing singleton dim is dropped first).
        - target: same shape as ``pred`` (up to a trailing singleton dim), any real dtype.
        - output: scalar (mean over all elements), in the common compute dtype of ``pred`` and a
          floating ``target`` (float32 for fp16/bf16; a float64 target is not rounded to float32).

    Degenerate inputs: ``B <= 1`` or empty inputs give an MSE term of ``0`` that keeps the graph.
    A NaN/inf in ``pred`` or ``target`` gives a NaN loss (docs/conventions.md).

    Example:
        >>> import torch, rankwise
        >>> pred = torch.tensor([0.1, 0.4, 0.3, 0.9], requires_grad=True)
        >>> target = torch.tensor([1.0, 2.0, 3.0, 4.0])
        >>> rankwise.losses.spearman_loss(pred, target, ranker="blackbox", lambda_val=2.0)
        tensor(0.0312, grad_fn=<...>)
    """
    _check_ranker(ranker, ranker_kwargs)
    _check_fallback(fallback, ranker)
    w = check_positive(l1_weight, "l1_weight", allow_zero=True)
    p, t = _pred_target(pred, target)
    if global_batch_on(distributed):
        return _spearman_global(p, t, ranker, w, ranker_kwargs, fallback)
    if p.numel() == 0 or p.shape[-1] <= 1:
        mse = _soft_ranks(p, ranker, ranker_kwargs).sum() * 0  # the ranker still checks its options
    else:
        t_rank = rank(t, descending=True, ties="average", normalize=True).to(p.dtype)
        mse = ((_soft_ranks(p, ranker, ranker_kwargs, fallback) - t_rank) ** 2).mean()
    if w == 0:
        return mse
    l1 = (p - t).abs().mean() if p.numel() else p.sum() * 0
    return mse + w * l1


def _gather_last(p: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, slice]:
    """Gather ``p`` (with grad) and ``t`` along the last dim; return them and this rank's columns."""
    layout = batch_layout(p.shape[-1], device=p.device)
    pg = all_gather_with_grad(p, dim=-1, sizes=layout)
    tg = all_gather_no_grad(t, dim=-1, sizes=layout)
    return pg, tg, layout.local


def _spearman_global(
    p: torch.Tensor, t: torch.Tensor, ranker: str, w: float, ranker_kwargs: dict[str, Any], fallback: str | None
) -> torch.Tensor:
    pg, tg, _ = _gather_last(p, t)
    return spearman_loss(pg, tg, ranker=ranker, l1_weight=w, fallback=fallback, **ranker_kwargs)


class SpearmanLoss(FunctionModule):
    """Module twin of :func:`spearman_loss` holding ``ranker``, ``l1_weight`` and the ranker's options."""

    _function = staticmethod(spearman_loss)
    _options = ("ranker", "l1_weight", "distributed", "fallback")
    _kwargs = "ranker_kwargs"
    _shown = ("ranker!r", "l1_weight", "**")

    def __init__(
        self,
        *,
        ranker: str = "isotonic",
        l1_weight: float = 0.0,
        distributed: DistributedFlag = False,
        fallback: str | None = None,
        **ranker_kwargs: Any,
    ) -> None:
        super().__init__()
        _check_ranker(ranker, ranker_kwargs)
        _check_fallback(fallback, ranker)
        self.ranker, self.fallback = ranker, fallback
        self.l1_weight = check_positive(l1_weight, "l1_weight", allow_zero=True)
        self.distributed = distributed
        self.ranker_kwargs = dict(ranker_kwargs)


def spearman_correlation(
    pred: torch.Tensor,
    target: torch.Tensor,
    *,
    ranker: str = "isotonic",
    distributed: DistributedFlag = False,
    **ranker_kwargs: Any,
) -> torch.Tensor:
    r"""Differentiable Spearman correlation: Pearson correlation of soft ranks of ``pred`` with ranks of ``target``.

    .. math::
        \rho = \frac{\mathrm{cov}(\widetilde{\mathrm{rk}}(\hat y), \mathrm{rk}(y))}
                    {\sigma_{\widetilde{\mathrm{rk}}(\hat y)}\,\sigma_{\mathrm{rk}(y)}}

    Soft ranks as in :func:`spearman_loss` (``ranker`` and ``ranker_kwargs``); target ranks average
    ties and carry no gradient. For a small regularisation strength / temperature it equals
    ``scipy.stats.spearmanr(pred, target)``. Use ``1 - spearman_correlation(...)`` as a loss.
    Unlike scipy (``nan``), a constant ``pred``/``target`` row or ``n <= 1`` gives ``0`` (with a
    finite, zero gradient).

    ``distributed=True`` / ``"auto"`` (see :mod:`rankwise.distributed`): ``pred`` and ``target``
    are gathered from all ranks along the last dim and every rank returns the correlation of the
    **global** batch (the same value on every rank; it is not a sum over examples). Because every
    rank backpropagates it through the differentiable gather, each rank's ``pred`` receives
    ``world_size`` times the single-process gradient, which DDP's gradient averaging cancels.

    Shape:
        - pred: :math:`(B,)`, :math:`(B, 1)` or :math:`(*, B)` floating, correlated along the last dim
          (a trailing singleton dim is dropped first); target: the same shape.
        - output: :math:`(*)` — a scalar for 1-d input; the common compute dtype of ``pred`` and a
          floating ``target`` (float32 for fp16/bf16). A row of ``pred`` or ``target`` holding a NaN or
          inf gives NaN for that row (scipy: NaN).

    Example:
        >>> import torch, rankwise
        >>> pred = torch.tensor([0.1, 0.4, 0.3, 0.9], requires_grad=True)
        >>> rankwise.losses.spearman_correlation(pred, torch.tensor([1.0, 2.0, 3.0, 4.0]), ranker="blackbox")
        tensor(0.8000, grad_fn=<...>)
    """
    _check_ranker(ranker, ranker_kwargs)
    p, t = _pred_target(pred, target)
    if global_batch_on(distributed):
        p, t, _ = _gather_last(p, t)
    if p.numel() == 0 or p.shape[-1] <= 1:
        out = _soft_ranks(p, ranker, ranker_kwargs).sum(-1) * 0  # the ranker still checks its options
    else:
        a = _soft_ranks(p, ranker, ranker_kwargs)
        b = rank(t, descending=True, ties="average", normalize=True).to(p.dtype)
        a = a - a.mean(-1, keepdim=True)
        b = b - b.mean(-1, keepdim=True)
        cov = (a * b).sum(-1)
        den2 = (a * a).sum(-1) * (b * b).sum(-1)
        ok = den2 > 0
        safe = torch.where(ok, den2, torch.ones_like(den2))
        out = torch.where(ok, cov / safe.sqrt(), torch.zeros_like(cov))
    # NaN/inf policy: a row of pred or target holding a NaN/inf gives NaN for that row
    return nan_slices(nan_slices(out, p, out_dims=0), t, out_dims=0)


class SpearmanCorrelation(FunctionModule):
    """Module twin of :func:`spearman_correlation` holding ``ranker`` and its options."""

    _function = staticmethod(spearman_correlation)
    _options = ("ranker", "distributed")
    _kwargs = "ranker_kwargs"
    _shown = ("ranker!r", "**")

    def __init__(self, *, ranker: str = "isotonic", distributed: DistributedFlag = False, **ranker_kwargs: Any) -> None:
        super().__init__()
        _check_ranker(ranker, ranker_kwargs)
        self.ranker = ranker
        self.distributed = distributed
        self.ranker_kwargs = dict(ranker_kwargs)


# --------------------------------------------------------------------------------------------------
# Pairwise (age-)difference loss
# --------------------------------------------------------------------------------------------------


@batch_loss("pred", "target")
def pairwise_difference_loss(
    pred: torch.Tensor,
    target: torch.Tensor,
    *,
    pairs: Literal["all", "random"] | int = "all",
    distributed: DistributedFlag = False,
) -> torch.Tensor:
    r"""Age-difference loss :math:`L_d` of Cheng et al. (IEEE TMI 2021), computed in O(B).

    .. math::
        L_d = \frac{1}{B(B-1)} \sum_{i \ne j} \bigl((\hat y_i - \hat y_j) - (y_i - y_j)\bigr)^2

    With residuals :math:`r = \hat y - y`, :math:`\sum_{i,j} (r_i - r_j)^2 = 2B \sum_i (r_i - \bar r)^2`,
    hence :math:`L_d = \frac{2}{B-1} \sum_i (r_i - \bar r)^2 = \frac{2B}{B-1}\,\mathrm{Var}_{pop}(r)`,
    twice the unbiased variance of the residuals: the loss is blind to a constant offset of the
    predictions (pair it with an L1/MSE term) and is computed from centred residuals (stable).
    The mean over ordered and over unordered pairs is the same.

    ``pairs="random"`` is the authors' sampling (TSAN's ``rank_difference_loss``): ``B`` pairs
    ``(i, j)`` drawn uniformly **with replacement** (``i = j`` allowed) from torch's global RNG, and
    :math:`L_d = \frac{1}{B} \sum_k ((\hat y_{i_k} - \hat y_{j_k}) - (y_{i_k} - y_{j_k}))^2`, an
    estimate of :math:`\frac{B-1}{B}` times the all-pairs loss; an ``int`` ``k >= 1`` draws ``k``
    pairs the same way (the same pairs for every leading index).

    ``distributed=True`` / ``"auto"`` (see :mod:`rankwise.distributed`): the pairs range over the
    **global** batch (``pred`` gathered with gradient, ``target`` without, along the last dim);
    each rank returns ``world_size * 2 / (n - 1) * (sum of its own centred squared residuals)``
    (averaged over leading dims), whose mean over ranks is the single-process loss. With random
    pairs every rank draws its own pairs (``B`` local-batch-size many, or ``k``) from the
    **global** batch, so DDP's gradient averaging optimises their union: about as many random
    pairs as the global batch has examples.

    Shape:
        - pred: :math:`(B,)`, :math:`(B, 1)` or :math:`(*, B)` floating (pairs along the last dim, a
          trailing singleton dim dropped first); target: the same shape.
        - output: scalar (mean over the leading dims), float32 for fp16/bf16 ``pred``.

    Degenerate inputs: ``B < 2`` (no pair) or empty inputs give ``0`` that keeps the graph.

    Example:
        >>> import torch, rankwise
        >>> pred = torch.tensor([21.0, 30.0, 44.0], requires_grad=True)
        >>> rankwise.losses.pairwise_difference_loss(pred, torch.tensor([20.0, 32.0, 40.0]))
        tensor(18., grad_fn=<...>)
    """
    if isinstance(pairs, bool) or not (pairs in ("all", "random") or (isinstance(pairs, int) and pairs >= 1)):
        raise ValueError(f"`pairs` must be 'all', 'random' or an int >= 1, got {pairs!r}")
    p, t = _pred_target(pred, target)
    cols: slice = slice(None)
    world = 1
    n_local = p.shape[-1]
    if global_batch_on(distributed):
        world = get_world_size()
        p, t, cols = _gather_last(p, t)
    n = p.shape[-1]
    if p.numel() == 0 or n < 2:
        return (p - t).sum() * 0
    r = p - t
    if pairs != "all":
        k = n_local if pairs == "random" else int(pairs)
        i = torch.randint(n, (k,), device=r.device)
        j = torch.randint(n, (k,), device=r.device)
        d = r[..., i] - r[..., j]
        return (d * d).mean()
    r = r - r.mean(-1, keepdim=True)
    out = (2.0 / (n - 1)) * (r * r)[..., cols].sum(-1).mean()
    return out * world if world > 1 else out


class PairwiseDifferenceLoss(FunctionModule):
    """Module twin of :func:`pairwise_difference_loss` (holds ``pairs`` and ``distributed``)."""

    _function = staticmethod(pairwise_difference_loss)
    _options = ("pairs", "distributed")
    _shown = ()

    def __init__(self, *, pairs: Literal["all", "random"] | int = "all", distributed: DistributedFlag = False) -> None:
        super().__init__()
        if isinstance(pairs, bool) or not (pairs in ("all", "random") or (isinstance(pairs, int) and pairs >= 1)):
            raise ValueError(f"`pairs` must be 'all', 'random' or an int >= 1, got {pairs!r}")
        self.pairs = pairs
        self.distributed = distributed


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------


register_loss(
    "ranksim",
    module=RankSimLoss,
    gradient="surrogate",
    stochastic=True,
    inputs={"features": "features", "targets": "targets"},
    takes="features",
)(ranksim_loss)
register_loss(
    "spearman",
    module=SpearmanLoss,
    description="Spearman loss (SoDeep), any ranker (option `ranker`, default 'isotonic')",
    inputs={"pred": "predictions", "target": "targets"},
    takes="predictions",
)(spearman_loss)
register_loss(
    "spearman_correlation",
    module=SpearmanCorrelation,
    takes="predictions",
)(spearman_correlation)
register_loss(
    "pairwise_difference",
    module=PairwiseDifferenceLoss,
    inputs={"pred": "predictions", "target": "targets"},
    takes="predictions",
)(pairwise_difference_loss)
