r"""Streaming ordinal metrics (torchmetrics), exact under DDP: :class:`OrdinalMetrics` and :func:`real_sample_mask`.

torchmetrics is a training dependency (it comes with Lightning), not one of rankwise's core ones: this
module is imported only when used, as ``rankwise.metrics.streaming`` or through the names
``rankwise.metrics.OrdinalMetrics`` / ``rankwise.metrics.real_sample_mask`` (resolved lazily).

**Padded duplicates.** ``torch.utils.data.DistributedSampler`` (``drop_last=False``, Lightning's
default sampler) pads the dataset's index list to a multiple of the world size by repeating its first
indices, so a few samples are evaluated twice and a plain all-reduce counts them twice. Pass
``mask=False`` for them to :meth:`OrdinalMetrics.update`: masked samples take part in no state, and the
metrics computed over all ranks are those of the dataset seen once, equal to the single-process values.
:func:`real_sample_mask` gives that mask from the sampler's layout (the position of each sample in the
rank's shard).
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from rankwise._validation import (
    check_choice,
    check_int,
    check_positive_int,
    check_real,
    check_same_device,
    check_tensor,
)
from rankwise.distributed import get_rank, get_world_size
from rankwise.imbalanced.metrics import shot_groups
from rankwise.metrics._ordinal_core import SHOT_GROUPS, KappaWeights, kappa_from_confusion, kendall_tau_b, spearman_rho

__all__ = ["OrdinalMetrics", "real_sample_mask"]

_F64 = torch.float64
_SUMS = ("abs_sum", "sq_sum", "log_abs_sum", "count", "exact", "off_by_one", "nans", "invalid")


def real_sample_mask(
    positions: torch.Tensor, *, dataset_size: int, rank: int | None = None, world_size: int | None = None
) -> torch.Tensor:
    r"""``True`` for the real samples of a rank's ``DistributedSampler`` shard, ``False`` for its padding.

    ``DistributedSampler(drop_last=False)`` pads the (shuffled or not) index list to
    :math:`W \lceil D / W \rceil` entries by repeating its first ones and gives rank :math:`r` the entries
    :math:`r, r + W, r + 2W, \dots`; the :math:`i`-th sample of the shard is padding exactly when
    :math:`r + iW \ge D` (:math:`D` = ``dataset_size``, :math:`W` = ``world_size``). For a ``DataLoader``
    reading the shard in order, batch :math:`b` holds ``positions = b * batch_size + torch.arange(len(batch))``.

    Args:
        positions: integer tensor, the samples' positions in this rank's shard (0-based).
        dataset_size: the length of the dataset the sampler draws from.
        rank, world_size: this process's; ``None``: those of the default process group (0 and 1 without one).

    Shape:
        - positions: any shape; output: the same shape, bool, on the device of ``positions``.

    Example:
        >>> import torch
        >>> from rankwise.metrics.streaming import real_sample_mask
        >>> real_sample_mask(torch.arange(4), dataset_size=7, rank=1, world_size=2)
        tensor([ True,  True,  True, False])
    """
    check_tensor(positions, "positions")
    if positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
        raise TypeError(f"`positions` must be an integer tensor, got dtype {positions.dtype}")
    d = check_int(dataset_size, "dataset_size", low=0)
    w = get_world_size() if world_size is None else check_positive_int(world_size, "world_size")
    r = get_rank() if rank is None else check_int(rank, "rank", low=0)
    if r >= w:
        raise ValueError(f"`rank` must be < world_size ({w}), got {r}")
    return r + positions * w < d


class OrdinalMetrics(Metric):
    r"""Every metric of :func:`rankwise.metrics.ordinal_metrics`, accumulated over batches and processes.

    ``compute()`` returns the values of ``ordinal_metrics(all_predictions, all_targets,
    num_classes=num_classes, weights=weights, ...)`` on the samples of every ``update`` of every process
    (those with ``mask=True``), as 0-dim float64 tensors: keys ``mae``, ``rmse``, ``gm``, ``exact_acc``,
    ``off_by_one_acc``, ``qwk``, and ``spearman`` / ``kendall`` unless ``rank_correlations=False``;
    ``mae_many`` / ``mae_medium`` / ``mae_few`` with ``train_labels``.

    States (all reduced with ``"sum"``, float64): the sums of :math:`|e|`, :math:`e^2`, :math:`\log|e|`, the
    count, the two accuracies' hits, the :math:`K \times K` confusion matrix of targets against rounded
    predictions (clipped to :math:`[0, K-1]`) and the per-shot-group sums of :math:`|e|` and counts. Spearman and
    Kendall need every pair: their states are the predictions, targets and mask themselves (``"cat"``,
    float64, 24 bytes a sample); ``rank_correlations=False`` drops them for evaluation sets too large to
    keep. The metric's dtype is float64 (a rank without any ``update`` contributes an empty float64 state).

    ``update`` never synchronizes with the host. Targets must be integer classes in :math:`[0, K-1]`; a
    kept sample with another target makes ``compute()`` raise ``ValueError`` (counted in ``update``,
    checked in ``compute``). A NaN prediction or target of a kept sample makes every metric NaN. Masked samples
    (``mask=False``, e.g. the padding of a ``DistributedSampler``: :func:`real_sample_mask`) count
    nowhere, so the value over all ranks equals the single-process one on the dataset.

    Args:
        num_classes: :math:`K`, the classes :math:`0 .. K-1` of the targets (and of the QWK).
        weights: the kappa's weights, ``"quadratic"``, ``"linear"`` or ``None``.
        train_labels: the training labels: adds the shot-group MAEs (:func:`rankwise.metrics.shot_group_mae`,
            the groups of :func:`rankwise.imbalanced.shot_groups` with ``many_shot``, ``few_shot``,
            ``bin_width``).
        rank_correlations: keep the samples for ``spearman`` and ``kendall``.
        kwargs: torchmetrics ``Metric`` options (``dist_sync_on_step``, ``process_group``, ...).

    Example:
        >>> import torch
        >>> from rankwise.metrics.streaming import OrdinalMetrics
        >>> m = OrdinalMetrics(num_classes=3)
        >>> m.update(torch.tensor([0.0, 1.25]), torch.tensor([0, 1]))
        >>> m.update(torch.tensor([2.0, 2.0, 0.0]), torch.tensor([1, 2, 2]), mask=torch.tensor([True, True, False]))
        >>> out = m.compute()
        >>> out["mae"].item(), out["exact_acc"].item(), round(out["qwk"].item(), 4)
        (0.3125, 0.75, 0.8)
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    # the states (add_state), declared for the type checker
    abs_sum: torch.Tensor
    sq_sum: torch.Tensor
    log_abs_sum: torch.Tensor
    count: torch.Tensor
    exact: torch.Tensor
    off_by_one: torch.Tensor
    nans: torch.Tensor
    invalid: torch.Tensor
    confusion: torch.Tensor
    group_abs_sum: torch.Tensor
    group_count: torch.Tensor
    preds: list[torch.Tensor] | torch.Tensor
    target: list[torch.Tensor] | torch.Tensor
    keep: list[torch.Tensor] | torch.Tensor
    class_group: torch.Tensor

    def __init__(
        self,
        num_classes: int,
        *,
        weights: KappaWeights = "quadratic",
        train_labels: Any = None,
        many_shot: float = 100,
        few_shot: float = 20,
        bin_width: float | None = None,
        rank_correlations: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.num_classes = check_positive_int(num_classes, "num_classes")
        self.weights: KappaWeights = check_choice(weights, "weights", ("quadratic", "linear", None))
        if not isinstance(rank_correlations, bool):
            raise TypeError(f"`rank_correlations` must be a bool, got {type(rank_correlations).__name__}")
        self.rank_correlations = rank_correlations
        self.shot_groups = train_labels is not None
        k = self.num_classes
        for name in _SUMS:
            self.add_state(name, torch.zeros((), dtype=_F64), dist_reduce_fx="sum")
        self.add_state("confusion", torch.zeros(k, k, dtype=_F64), dist_reduce_fx="sum")
        if self.shot_groups:
            g = shot_groups(
                torch.arange(k, dtype=_F64), train_labels, many_shot=many_shot, few_shot=few_shot, bin_width=bin_width
            )
            group = torch.zeros(k, dtype=_F64)  # float: follows the metric's dtype casts harmlessly
            for i, name in enumerate(SHOT_GROUPS):
                group[torch.from_numpy(g[name])] = float(i)
            self.register_buffer("class_group", group, persistent=False)
            self.add_state("group_abs_sum", torch.zeros(len(SHOT_GROUPS), dtype=_F64), dist_reduce_fx="sum")
            self.add_state("group_count", torch.zeros(len(SHOT_GROUPS), dtype=_F64), dist_reduce_fx="sum")
        if self.rank_correlations:
            self.add_state("preds", [], dist_reduce_fx="cat")
            self.add_state("target", [], dist_reduce_fx="cat")
            self.add_state("keep", [], dist_reduce_fx="cat")
        # float64 states everywhere: the empty state torchmetrics gathers for a rank without data has this dtype
        self.set_dtype(_F64)

    def update(self, predictions: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Add a batch: ``predictions`` and ``targets`` of shape ``(N,)``; ``mask`` (bool, ``(N,)``): the samples
        to count (default all)."""
        check_real(predictions, "predictions")
        check_real(targets, "targets")
        check_same_device("predictions", predictions, ("targets", targets), ("mask", mask))
        if predictions.dim() != 1 or predictions.shape != targets.shape:
            raise ValueError(
                "`predictions` and `targets` must have the same shape (N,), "
                f"got {tuple(predictions.shape)} and {tuple(targets.shape)}"
            )
        p = predictions.detach().to(device=self.confusion.device, dtype=_F64)
        t = targets.detach().to(device=self.confusion.device, dtype=_F64)
        if mask is None:
            keep = torch.ones(p.shape, dtype=torch.bool, device=p.device)
        else:
            check_tensor(mask, "mask")
            if mask.dtype != torch.bool or mask.shape != p.shape:
                raise TypeError(
                    f"`mask` must be a bool tensor of shape {tuple(p.shape)}, "
                    f"got dtype {mask.dtype} and shape {tuple(mask.shape)}"
                )
            keep = mask.to(p.device)
        zero = torch.zeros((), dtype=_F64, device=p.device)

        def total(x: torch.Tensor) -> torch.Tensor:  # sum over the kept samples (a masked NaN stays out)
            return torch.where(keep, x.to(_F64), zero).sum()

        k = self.num_classes
        err = p - t
        ae = err.abs()
        pr = p.round()
        nan = torch.isnan(p) | torch.isnan(t)
        valid = (t == t.round()) & (t >= 0) & (t <= k - 1)
        self.abs_sum += total(ae)
        self.sq_sum += total(err * err)
        self.log_abs_sum += total(ae.log())
        self.count += total(torch.ones_like(p))
        self.exact += total((pr - t).abs() <= 0)
        self.off_by_one += total((pr - t).abs() <= 1)
        self.nans += total(nan)
        self.invalid += total(~valid & ~nan)
        use = keep & valid & ~torch.isnan(pr)
        ti = torch.where(valid, t, zero).to(torch.long)
        pi = torch.where(torch.isnan(pr), zero, pr.clamp(0, k - 1)).to(torch.long)
        self.confusion.view(-1).index_add_(0, ti * k + pi, use.to(_F64))
        if self.shot_groups:
            g = self.class_group[ti].to(torch.long)
            self.group_abs_sum.index_add_(0, g, torch.where(keep & valid, ae, zero))
            self.group_count.index_add_(0, g, (keep & valid).to(_F64))
        if self.rank_correlations:
            # lists between syncs (torchmetrics restores them after compute)
            cast(list, self.preds).append(p)
            cast(list, self.target).append(t)
            cast(list, self.keep).append(keep.to(_F64))

    def compute(self) -> dict[str, torch.Tensor]:
        """The metrics of every kept sample of every ``update`` (of every process under DDP)."""
        if self.invalid > 0:
            raise ValueError(
                f"`targets` must be integer classes in [0, {self.num_classes - 1}] (num_classes={self.num_classes}), "
                f"got {int(self.invalid)} other value(s)"
            )
        n = self.count
        nan = torch.full((), float("nan"), dtype=_F64, device=n.device)
        poisoned = self.nans > 0

        def mean(s: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
            return s / c  # 0 / 0 = NaN for no sample

        out = {
            "mae": mean(self.abs_sum, n),
            "rmse": mean(self.sq_sum, n).sqrt(),
            "gm": mean(self.log_abs_sum, n).exp(),
            "exact_acc": torch.where(poisoned, nan, mean(self.exact, n)),
            "off_by_one_acc": torch.where(poisoned, nan, mean(self.off_by_one, n)),
            "qwk": torch.where(poisoned, nan, kappa_from_confusion(self.confusion, self.weights)),
        }
        if self.rank_correlations:
            if isinstance(self.preds, list) and not self.preds:
                out["spearman"] = out["kendall"] = nan
            else:
                keep = dim_zero_cat(self.keep) > 0
                p, t = dim_zero_cat(self.preds).to(_F64)[keep], dim_zero_cat(self.target).to(_F64)[keep]
                out["spearman"], out["kendall"] = spearman_rho(p, t), kendall_tau_b(p, t)
        if self.shot_groups:
            per_group = mean(self.group_abs_sum, self.group_count)
            out.update({f"mae_{name}": per_group[i] for i, name in enumerate(SHOT_GROUPS)})
        return out
