r"""Metrics of ordinal predictions: label MAE / RMSE / GM, accuracy within a tolerance (exact, off by one),
weighted kappa, Spearman and Kendall correlation, shot-group MAEs.

``predictions`` and ``targets`` are ``(N,)`` tensors in label units: the targets are integer-valued
classes, the predictions integer classes or continuous values (an expected class, a regressed age).
Every metric is accumulated in float64 on the inputs' device and returned as a 0-dim tensor of their
compute dtype (:func:`rankwise._validation.common_compute_dtype`: float64 if either input is float64,
float32 for half, integer or float32 inputs).

Conventions shared by all of them:

* **Rounding.** The metrics of classes (accuracies, kappa) first round each prediction to the nearest
  class with ``torch.round`` (halves to even, as ``numpy.round``): a continuous prediction of an
  integer label is read as the class it is closest to. Targets are never rounded. MAE, RMSE, GM and
  the correlations use the predictions as they are.
* **No data.** ``N = 0`` gives NaN for every metric (nothing to average).
* **NaN.** A NaN in either input makes every metric NaN (``nan_policy="propagate"`` of SciPy);
  ``-inf`` / ``+inf`` are the smallest / largest values.

The streaming (torchmetrics) versions, correct under DDP, are in :mod:`rankwise.metrics.streaming`.
"""

from __future__ import annotations

from typing import Any

import torch

from rankwise._validation import (
    check_choice,
    check_positive,
    check_positive_int,
    check_real,
    check_same_device,
    common_compute_dtype,
)
from rankwise.imbalanced.metrics import shot_groups
from rankwise.metrics._ordinal_core import (
    F64,
    NAN,
    SHOT_GROUPS,
    KappaWeights,
    any_nan,
    kappa_from_confusion,
    kendall_tau_b,
    nan_where,
    spearman_rho,
)

__all__ = [
    "accuracy_within",
    "exact_accuracy",
    "geometric_mean_absolute_error",
    "kendall_tau",
    "mean_absolute_error",
    "off_by_one_accuracy",
    "ordinal_metrics",
    "quadratic_weighted_kappa",
    "root_mean_squared_error",
    "shot_group_mae",
    "spearman_correlation",
]


def _pair(predictions: Any, targets: Any) -> tuple[torch.Tensor, torch.Tensor, torch.dtype]:
    """Both inputs as float64 ``(N,)`` tensors (detached) and the dtype of the result."""
    check_real(predictions, "predictions")
    check_real(targets, "targets")
    check_same_device("predictions", predictions, ("targets", targets))
    if predictions.dim() != 1 or predictions.shape != targets.shape:
        raise ValueError(
            "`predictions` and `targets` must have the same shape (N,), "
            f"got {tuple(predictions.shape)} and {tuple(targets.shape)}"
        )
    dt = common_compute_dtype(predictions, targets)
    return predictions.detach().to(F64), targets.detach().to(F64), dt


def mean_absolute_error(predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    r"""Mean absolute error :math:`\frac{1}{N}\sum_i |p_i - t_i|` (``sklearn.metrics.mean_absolute_error``).

    Shape:
        - predictions, targets: :math:`(N,)`, any real dtypes.
        - output: :math:`()`, the inputs' compute dtype; NaN for :math:`N = 0`.

    Example:
        >>> import torch
        >>> from rankwise.metrics import mean_absolute_error
        >>> mean_absolute_error(torch.tensor([1.0, 2.5, 4.0]), torch.tensor([1, 2, 3]))
        tensor(0.5000)
    """
    p, t, dt = _pair(predictions, targets)
    return (p - t).abs().mean().to(dt)


def root_mean_squared_error(predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    r"""Root mean squared error :math:`\sqrt{\frac{1}{N}\sum_i (p_i - t_i)^2}`.

    Shape:
        - predictions, targets: :math:`(N,)`, any real dtypes.
        - output: :math:`()`, the inputs' compute dtype; NaN for :math:`N = 0`.

    Example:
        >>> import torch
        >>> from rankwise.metrics import root_mean_squared_error
        >>> root_mean_squared_error(torch.tensor([1.0, 3.0, 5.0]), torch.tensor([1, 2, 3]))
        tensor(1.2910)
    """
    p, t, dt = _pair(predictions, targets)
    return (p - t).square().mean().sqrt().to(dt)


def geometric_mean_absolute_error(predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    r"""Geometric mean of the absolute errors, :math:`\exp(\frac{1}{N}\sum_i \log|p_i - t_i|)`.

    The GM of the deep-imbalanced-regression benchmarks (Yang et al., ICML 2021, "Delving into Deep
    Imbalanced Regression"): ``scipy.stats.gmean`` of the errors and
    ``rankwise.imbalanced.regression_metrics(...)["all"]["gmean"]`` (its default ``gmean_eps=0``). One
    exact-zero error makes it exactly 0 (the log of 0 is :math:`-\infty`), as both of those.

    Shape:
        - predictions, targets: :math:`(N,)`, any real dtypes.
        - output: :math:`()`, the inputs' compute dtype; NaN for :math:`N = 0`.

    Example:
        >>> import torch
        >>> from rankwise.metrics import geometric_mean_absolute_error
        >>> geometric_mean_absolute_error(torch.tensor([2.0, 6.0]), torch.tensor([1, 2]))
        tensor(2.)
    """
    p, t, dt = _pair(predictions, targets)
    return (p - t).abs().log().mean().exp().to(dt)


def _within(p: torch.Tensor, t: torch.Tensor, tolerance: float) -> torch.Tensor:
    """Per-sample hits ``|round(p) - t| <= tolerance`` (bool)."""
    return (p.round() - t).abs() <= tolerance


def accuracy_within(predictions: torch.Tensor, targets: torch.Tensor, *, tolerance: float) -> torch.Tensor:
    r"""Fraction of predictions within ``tolerance`` classes of the target once rounded to a class:

    .. math:: \frac{1}{N}\sum_i \big[\,|\mathrm{round}(p_i) - t_i| \le \text{tolerance}\,\big]

    ``round`` is ``torch.round`` (the nearest integer, halves to even). ``tolerance=0`` is
    :func:`exact_accuracy` (``sklearn.metrics.accuracy_score(targets, round(predictions))``), ``tolerance=1``
    :func:`off_by_one_accuracy` (the "1-off" accuracy of the age-estimation and grading literature).

    Shape:
        - predictions, targets: :math:`(N,)`, any real dtypes; ``tolerance`` a number >= 0.
        - output: :math:`()`, the inputs' compute dtype; NaN for :math:`N = 0` or a NaN input.

    Example:
        >>> import torch
        >>> from rankwise.metrics import accuracy_within
        >>> accuracy_within(torch.tensor([0.2, 1.6, 4.0, 3.0]), torch.tensor([0, 1, 2, 3]), tolerance=1)
        tensor(0.7500)
    """
    tol = check_positive(tolerance, "tolerance", allow_zero=True)
    p, t, dt = _pair(predictions, targets)
    acc = _within(p, t, tol).to(F64).mean()
    return nan_where(any_nan(p, t), acc).to(dt)


def exact_accuracy(predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    r"""Fraction of predictions that round to their target class: :func:`accuracy_within` with ``tolerance=0``.

    Shape:
        - predictions, targets: :math:`(N,)`, any real dtypes.
        - output: :math:`()`, the inputs' compute dtype; NaN for :math:`N = 0` or a NaN input.

    Example:
        >>> import torch
        >>> from rankwise.metrics import exact_accuracy
        >>> exact_accuracy(torch.tensor([0.2, 1.6, 2.0, 3.0]), torch.tensor([0, 1, 2, 3]))
        tensor(0.7500)
    """
    return accuracy_within(predictions, targets, tolerance=0)


def off_by_one_accuracy(predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    r"""Fraction of predictions that round to at most one class from the target (:math:`|\mathrm{round}(p) - t|
    \le 1`): :func:`accuracy_within` with ``tolerance=1``.

    Shape:
        - predictions, targets: :math:`(N,)`, any real dtypes.
        - output: :math:`()`, the inputs' compute dtype; NaN for :math:`N = 0` or a NaN input.

    Example:
        >>> import torch
        >>> from rankwise.metrics import off_by_one_accuracy
        >>> off_by_one_accuracy(torch.tensor([0.2, 2.6, 4.0, 3.0]), torch.tensor([0, 1, 2, 3]))
        tensor(0.5000)
    """
    return accuracy_within(predictions, targets, tolerance=1)


def quadratic_weighted_kappa(
    predictions: torch.Tensor,
    targets: torch.Tensor,
    *,
    num_classes: int | None = None,
    weights: KappaWeights = "quadratic",
) -> torch.Tensor:
    r"""Cohen's weighted kappa of the rounded predictions against the targets (QWK by default).

    With :math:`O` the confusion matrix of counts (targets :math:`\times` rounded predictions),
    :math:`E_{ij} = r_i c_j / N` its expectation under independent marginals (:math:`r_i` the row sums,
    :math:`c_j` the column sums) and
    :math:`w_{ij} = (i - j)^2` (``"quadratic"``), :math:`|i - j|` (``"linear"``) or :math:`[i \ne j]`
    (``None``, plain kappa):

    .. math:: \kappa = 1 - \frac{\sum_{ij} w_{ij} O_{ij}}{\sum_{ij} w_{ij} E_{ij}}

    The classes :math:`i, j` are

    * ``num_classes=None``: the distinct values of ``targets`` and of the rounded predictions, sorted, and
      :math:`i, j` their positions in that list: exactly
      ``sklearn.metrics.cohen_kappa_score(targets, round(predictions), weights=weights)`` (whose weights use
      the positions, so labels 0, 2, 5 are 1 apart as 0, 1, 2 are);
    * ``num_classes=K``: the classes :math:`0 .. K-1` themselves (a class nobody predicts still counts in
      the distances): ``cohen_kappa_score(..., labels=range(K))`` when every rounded prediction is in
      :math:`[0, K-1]`. Rounded predictions outside it are clipped to the nearest end class; ``targets``
      must be integers in :math:`[0, K-1]` (``ValueError`` otherwise). This is the value of
      :class:`rankwise.metrics.streaming.OrdinalMetrics`.

    **Defined values.** When every target and every rounded prediction is the same single class, the
    expected disagreement is 0 and scikit-learn returns NaN (``replace_undefined_by``, with an
    ``UndefinedMetricWarning``); here the predictions then agree with the targets perfectly and the
    kappa is **1.0**. ``N = 0`` gives NaN (scikit-learn raises), as does a NaN input.

    Shape:
        - predictions, targets: :math:`(N,)`, any real dtypes.
        - output: :math:`()`, the inputs' compute dtype.

    Example:
        >>> import torch
        >>> from rankwise.metrics import quadratic_weighted_kappa
        >>> quadratic_weighted_kappa(torch.tensor([0.0, 1.2, 2.0, 2.0]), torch.tensor([0, 1, 1, 2]))
        tensor(0.8000)
    """
    p, t, dt = _pair(predictions, targets)
    check_choice(weights, "weights", ("quadratic", "linear", None))
    pr = p.round()
    if bool(any_nan(p, t)) or p.numel() == 0:
        return torch.full((), NAN, dtype=dt, device=p.device)
    if num_classes is None:
        classes = torch.unique(torch.cat([t, pr]))  # sorted
        k = classes.numel()
        ti = torch.searchsorted(classes, t)
        pi = torch.searchsorted(classes, pr)
    else:
        k = check_positive_int(num_classes, "num_classes")
        bad = (t != t.round()) | (t < 0) | (t > k - 1)
        if bool(bad.any()):
            value = t[bad][0].item()
            raise ValueError(f"`targets` must be integer classes in [0, {k - 1}] (num_classes={k}), got {value!r}")
        ti = t.to(torch.long)
        pi = pr.clamp(0, k - 1).to(torch.long)
    confusion = torch.zeros(k * k, dtype=F64, device=p.device)
    confusion.index_add_(0, ti * k + pi, torch.ones_like(p))
    return kappa_from_confusion(confusion.reshape(k, k), weights).to(dt)


def spearman_correlation(predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    r"""Spearman's rank correlation: the Pearson correlation of the average ranks (``scipy.stats.spearmanr``).

    .. math:: \rho = \frac{\sum_i (r_i - \bar r)(s_i - \bar s)}{\sqrt{\sum_i (r_i - \bar r)^2 \sum_i (s_i - \bar s)^2}}

    with :math:`r = \mathrm{rank}(p)`, :math:`s = \mathrm{rank}(t)`, tied values sharing the mean of their
    positions (:func:`rankwise.rank` with ``ties="average"``). :math:`O(N \log N)` time, :math:`O(N)` memory.

    **Defined values.** NaN when :math:`N < 2` or an input is constant, as SciPy (which warns there).

    Shape:
        - predictions, targets: :math:`(N,)`, any real dtypes.
        - output: :math:`()`, the inputs' compute dtype.

    Example:
        >>> import torch
        >>> from rankwise.metrics import spearman_correlation
        >>> spearman_correlation(torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([1, 3, 2, 4]))
        tensor(0.8000)
    """
    p, t, dt = _pair(predictions, targets)
    return spearman_rho(p, t).to(dt)


def kendall_tau(predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    r"""Kendall's :math:`\tau_b` (ties handled), as ``scipy.stats.kendalltau`` (``variant="b"``).

    .. math:: \tau_b = \frac{C - D}{\sqrt{(n_0 - n_1)(n_0 - n_2)}}

    with :math:`C` / :math:`D` the concordant / discordant pairs, :math:`n_0 = N(N-1)/2`, :math:`n_1`,
    :math:`n_2` the pairs tied in the predictions, in the targets. :math:`D` is counted without
    materializing pairs (Knight, JASA 1966: a lexicographic sort, then the inversions of the targets'
    ranks, counted bit by bit with radix steps): :math:`O(N \log N)` time and :math:`O(N)` memory,
    vectorized tensor operations on the inputs' device (:math:`N = 10^5` takes about 0.2 s on one
    CPU core). Clipped to :math:`[-1, 1]` as SciPy.

    **Defined values.** NaN when :math:`N < 2` or an input is constant, as SciPy (which warns there).

    Shape:
        - predictions, targets: :math:`(N,)`, any real dtypes.
        - output: :math:`()`, the inputs' compute dtype.

    Example:
        >>> import torch
        >>> from rankwise.metrics import kendall_tau
        >>> kendall_tau(torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([1, 3, 2, 4]))
        tensor(0.6667)
    """
    p, t, dt = _pair(predictions, targets)
    return kendall_tau_b(p, t).to(dt)


def shot_group_mae(
    predictions: torch.Tensor,
    targets: torch.Tensor,
    train_labels: Any,
    *,
    many_shot: float = 100,
    few_shot: float = 20,
    bin_width: float | None = None,
) -> dict[str, torch.Tensor]:
    r"""MAE over the test samples of each shot group: ``{"many", "medium", "few"}``.

    The groups are those of :func:`rankwise.imbalanced.shot_groups` (a target is many-shot if its
    label, or its bin of ``bin_width``, occurs more than ``many_shot`` times in ``train_labels``,
    few-shot if fewer than ``few_shot`` times, medium otherwise), and each MAE averages over the
    group's samples: the ``"mae"`` of ``rankwise.imbalanced.regression_metrics`` per group, as tensors.
    An empty group gives NaN (``regression_metrics`` gives ``None``).

    Shape:
        - predictions, targets: :math:`(N,)`; train_labels: any number of labels (tensor, array, sequence).
        - output: a dict of :math:`()` tensors of the inputs' compute dtype.

    Example:
        >>> import torch
        >>> from rankwise.metrics import shot_group_mae
        >>> m = shot_group_mae(torch.tensor([1.0, 2.5, 5.0]), torch.tensor([1, 2, 3]), [1] * 150 + [2] * 50)
        >>> {k: v.item() for k, v in m.items()}
        {'many': 0.0, 'medium': 0.5, 'few': 2.0}
    """
    p, t, dt = _pair(predictions, targets)
    out = _shot_group_mae(p, t, targets, train_labels, many_shot=many_shot, few_shot=few_shot, bin_width=bin_width)
    return {k: v.to(dt) for k, v in out.items()}


def _shot_group_mae(
    p: torch.Tensor, t: torch.Tensor, targets: torch.Tensor, train_labels: Any, **kwargs: Any
) -> dict[str, torch.Tensor]:
    """Float64 group MAEs of ``p``, ``t``; the groups from the given ``targets`` (their dtype decides the
    exact label matching of :func:`rankwise.imbalanced.shot_groups`)."""
    groups = shot_groups(targets, train_labels, **kwargs)
    err = (p - t).abs()
    return {name: err[torch.as_tensor(groups[name], device=p.device)].mean() for name in SHOT_GROUPS}


def ordinal_metrics(
    predictions: torch.Tensor,
    targets: torch.Tensor,
    *,
    num_classes: int | None = None,
    weights: KappaWeights = "quadratic",
    train_labels: Any = None,
    many_shot: float = 100,
    few_shot: float = 20,
    bin_width: float | None = None,
) -> dict[str, float]:
    r"""Every ordinal metric at once, as plain floats (a regression run writes some under ``ordinal`` in its metrics).

    Keys: ``mae``, ``rmse``, ``gm`` (:func:`geometric_mean_absolute_error`), ``exact_acc``,
    ``off_by_one_acc``, ``qwk`` (:func:`quadratic_weighted_kappa` with ``num_classes`` and ``weights``),
    ``spearman``, ``kendall``; with ``train_labels`` also ``mae_many``, ``mae_medium``, ``mae_few``
    (:func:`shot_group_mae`). Undefined values are ``nan`` (see each function).

    Shape:
        - predictions, targets: :math:`(N,)`, any real dtypes.

    Example:
        >>> import torch
        >>> from rankwise.metrics import ordinal_metrics
        >>> m = ordinal_metrics(torch.tensor([0.0, 1.25, 2.0, 2.0]), torch.tensor([0, 1, 1, 2]))
        >>> m["mae"], m["exact_acc"], m["off_by_one_acc"], round(m["qwk"], 4)
        (0.3125, 0.75, 1.0, 0.8)
    """
    p, t, _ = _pair(predictions, targets)
    out = {
        "mae": mean_absolute_error(p, t),
        "rmse": root_mean_squared_error(p, t),
        "gm": geometric_mean_absolute_error(p, t),
        "exact_acc": exact_accuracy(p, t),
        "off_by_one_acc": off_by_one_accuracy(p, t),
        "qwk": quadratic_weighted_kappa(p, t, num_classes=num_classes, weights=weights),
        "spearman": spearman_rho(p, t),
        "kendall": kendall_tau_b(p, t),
    }
    if train_labels is not None:
        groups = _shot_group_mae(
            p, t, targets, train_labels, many_shot=many_shot, few_shot=few_shot, bin_width=bin_width
        )
        out.update({f"mae_{k}": v for k, v in groups.items()})
    return {k: float(v) for k, v in out.items()}
