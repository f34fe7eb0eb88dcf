"""Validation metrics of the recipes as ``torchmetrics.Metric`` states: the same value in one process and under DDP.

Every metric keeps sums and counts (``dist_reduce_fx="sum"``), so its value after the ranks' states
are summed is the value of one process on the union of the ranks' samples -- not a mean of the
ranks' means. The samples a ``DistributedSampler`` repeats to give every rank the same number
(the padding of unequal shards) are left out with :func:`shard_keep_mask`, so each sample of the
split counts once.

- ``val/mae``: ``torchmetrics.MeanAbsoluteError`` (float64 states).
- ``val/gm``: :class:`GeometricMeanAbsoluteError`, the geometric mean of the absolute errors (each
  clamped at ``1e-12``) from the sum of their logs and a count.
- ``val/ndcg@k``, ``val/mrr`` of the LTR recipe: :class:`MeanValue` of the per-query values of
  :func:`rankwise.recipes.learning_to_rank.ltr_metrics`, from their sum and the query count.
- ``val/top<k>``, ``test/top<k>`` of the top-k classification recipe: :class:`TopKAccuracy`, the
  count of examples whose class is among the ``k`` highest logits (:func:`rankwise.metrics.topk_accuracy`)
  and the example count.

A module logs the ``Metric`` object itself (``self.log(name, metric)``): Lightning computes it at the
end of the epoch (the states summed over the ranks) and resets it.
"""

from __future__ import annotations

from typing import Any

import torch
from torchmetrics import Metric

__all__ = ["GeometricMeanAbsoluteError", "MeanValue", "TopKAccuracy", "shard_keep_mask", "val_sampler"]


def val_sampler(trainer: Any) -> Any:
    """The sampler of ``trainer``'s (first) validation loader; None when it has none."""
    dl = getattr(trainer, "val_dataloaders", None)
    if isinstance(dl, (list, tuple)):
        dl = dl[0] if dl else None
    return getattr(dl, "sampler", None)


def shard_keep_mask(sampler: Any, start: int, count: int, device: torch.device | None = None) -> torch.Tensor:
    """Which of the ``count`` samples at positions ``start ..`` of this rank's shard are not padding.

    A ``torch.utils.data.DistributedSampler`` (also Lightning's wrapper of another sampler) with
    ``drop_last=False`` pads the index list of ``n`` samples to ``num_samples * num_replicas`` by
    repeating its first entries, and gives rank ``r`` the entries ``r, r + W, r + 2W, ...``: the
    ``j``-th sample of the shard is a repeat exactly when ``r + j W >= n``
    (:func:`rankwise.metrics.streaming.real_sample_mask`, with the sampler's rank and world size). Any
    other sampler (one process): every sample is kept.

    Example:
        >>> from torch.utils.data import DistributedSampler
        >>> s = DistributedSampler(range(5), num_replicas=2, rank=1, shuffle=False)
        >>> list(s), shard_keep_mask(s, 0, 3).tolist()
        ([1, 3, 0], [True, True, False])
    """
    from torch.utils.data import DistributedSampler

    keep = torch.ones(count, dtype=torch.bool, device=device)
    if not isinstance(sampler, DistributedSampler) or sampler.drop_last:
        return keep
    from rankwise.metrics.streaming import real_sample_mask

    positions = torch.arange(start, start + count, device=device)
    n = len(sampler.dataset)  # type: ignore[arg-type]
    return real_sample_mask(positions, dataset_size=n, rank=sampler.rank, world_size=sampler.num_replicas)


class GeometricMeanAbsoluteError(Metric):
    r"""Geometric mean of the absolute errors of all samples passed to :meth:`update` (over every rank).

    :math:`\exp\big(\frac1n \sum_i \log \max(|\hat y_i - y_i|, 10^{-12})\big)`, from the sum of the logs
    (float64) and the count ``n``; ``0`` samples give ``1``.

    Shape:
        ``update(preds, target)``: two tensors of one shape -> ``compute()``: a float64 scalar.

    Example:
        >>> m = GeometricMeanAbsoluteError()
        >>> m.update(torch.tensor([1.0, 2.0]), torch.tensor([2.0, 6.0]))
        >>> round(float(m.compute()), 4)
        2.0
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = False
    log_sum: torch.Tensor
    count: torch.Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("log_sum", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        err = (preds.float() - target.float()).abs()
        self.log_sum += torch.log(err.clamp_min(1e-12)).double().sum()
        self.count += err.numel()

    def compute(self) -> torch.Tensor:
        return torch.exp(self.log_sum / self.count.clamp_min(1).double())


class MeanValue(Metric):
    """Mean of all values passed to :meth:`update` (over every rank), times ``scale``: e.g. a per-query
    ``ndcg@k`` (:func:`rankwise.recipes.learning_to_rank.ltr_metrics`) averaged over the queries.

    From the float64 sum of the values and their count; ``0`` values give ``0``.

    Shape:
        ``update(values)``: any shape -> ``compute()``: a float64 scalar.

    Example:
        >>> m = MeanValue(scale=100.0)
        >>> m.update(torch.tensor([1.0, 0.5]))
        >>> m.update(torch.tensor([0.0]))
        >>> round(float(m.compute()), 4)
        50.0
    """

    full_state_update = False
    is_differentiable = False
    total: torch.Tensor
    count: torch.Tensor

    def __init__(self, *, scale: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scale = float(scale)
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, values: torch.Tensor) -> None:
        self.total += values.double().sum()
        self.count += values.numel()

    def compute(self) -> torch.Tensor:
        return self.total / self.count.clamp_min(1).double() * self.scale


class TopKAccuracy(Metric):
    r"""Top-``k`` accuracy, in percent, of all examples passed to :meth:`update` (over every rank).

    :math:`100 \cdot \frac1n \#\{i : t_i \text{ is among the } k \text{ highest logits of row } i\}`, ties
    broken as :func:`rankwise.metrics.topk_accuracy` breaks them (the lower class first; a ``k`` of at
    least the number of classes counts every example); from the int64 count of hits and the example
    count, so the value under DDP is that of one process on all examples. ``0`` examples give ``0``.

    Shape:
        ``update(logits, targets)``: ``(N, C)`` and ``(N,)`` -> ``compute()``: a float64 scalar.

    Example:
        >>> m = TopKAccuracy(k=2)
        >>> m.update(torch.tensor([[0.1, 0.5, 0.4], [0.3, 0.3, 0.4]]), torch.tensor([2, 1]))
        >>> m.update(torch.tensor([[0.9, 0.05, 0.05]]), torch.tensor([0]))
        >>> round(float(m.compute()), 2)
        66.67
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = True
    hits: torch.Tensor
    count: torch.Tensor

    def __init__(self, *, k: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"`k` must be a positive int, got {k!r}")
        self.k = int(k)
        self.add_state("hits", torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        from rankwise.metrics import topk_accuracy

        n = targets.numel()
        if n == 0:
            return
        # the fraction of n examples (float64: exact far beyond any split size), back to a count
        frac = topk_accuracy(logits.detach().double(), targets, ks=min(self.k, int(logits.shape[-1])))
        self.hits += torch.round(frac * n).long()
        self.count += n

    def compute(self) -> torch.Tensor:
        return self.hits.double() / self.count.clamp_min(1).double() * 100.0
