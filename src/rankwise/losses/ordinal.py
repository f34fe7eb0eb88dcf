r"""Threshold (cumulative-link) ordinal losses: CORAL, CORN and CONDOR, their label encoding and decoding.

An ordinal label :math:`y \in \{0, \dots, K-1\}` is written as :math:`K - 1` binary answers to
"is :math:`y > k`?" (:func:`levels_from_labels`, the *extended binary* encoding of Li & Lin, 2007),
and the network has one logit per rank threshold, :math:`(B, K-1)`:

* **CORAL** (Cao, Mirjalili & Raschka, Pattern Recognit. Lett. 2020): the :math:`K - 1` binary tasks
  share one weight vector and differ only by their biases (:class:`rankwise.models.CoralLayer`), which
  keeps the predicted probabilities :math:`P(y > k)` ordered; :func:`coral_loss` is the (optionally
  weighted) sum of the tasks' binary cross-entropies.
* **CORN** (Shi, Cao & Raschka, 2023): task :math:`k` estimates the *conditional* probability
  :math:`P(y > k \mid y > k - 1)` and is trained only on the examples with :math:`y \ge k`;
  :func:`corn_loss`. Any head (a plain ``nn.Linear(d, K - 1)``) is rank consistent, since
  :math:`P(y > k)` is a running product.
* **CONDOR** (Dennis et al., 2021): the same conditional factorisation, trained as the negative
  log-likelihood of the levels where each task counts only if the previous level is 1;
  :func:`condor_loss`.

Each function equals its reference package (``coral_pytorch`` 1.4.0, ``condor_pytorch`` 1.1.0) on its
domain, values and gradients; the differences (defined results where the references divide by zero or
average an empty batch to NaN, checks instead of silent misreadings) are listed in each docstring and
in ``docs/ordinal.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral
from typing import Literal

import torch
import torch.nn.functional as F

from rankwise._registry import OrdinalHead
from rankwise._twin import FunctionModule
from rankwise._validation import (
    check_choice,
    check_floating,
    check_real,
    check_same_device,
    check_tensor,
    common_compute_dtype,
    compute_dtype,
)
from rankwise.losses._registry import register_loss

__all__ = [
    "CondorLoss",
    "CoralLoss",
    "CornLoss",
    "condor_loss",
    "condor_predict",
    "coral_loss",
    "coral_predict",
    "corn_loss",
    "corn_predict",
    "levels_from_labels",
]

Reduction = Literal["mean", "sum", "none"] | None
_REDUCTIONS = ("mean", "sum", "none", None)


# --------------------------------------------------------------------------------------------------
# argument checks
# --------------------------------------------------------------------------------------------------
def _check_num_classes(num_classes: object) -> int:
    """``num_classes`` as an int >= 2 (an ``int`` or NumPy integer; ``bool`` refused)."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, Integral):
        raise TypeError(
            f"`num_classes` must be an int (the number of ordinal classes K), got {type(num_classes).__name__} "
            f"{num_classes!r}"
        )
    if num_classes < 2:
        raise ValueError(f"`num_classes` must be >= 2 (an ordinal problem has at least two classes), got {num_classes}")
    return int(num_classes)


def _check_thresholds(logits: object, name: str = "logits") -> torch.Tensor:
    """``logits``: a floating ``(B, K-1)`` tensor with ``K - 1 >= 1``."""
    check_floating(logits, name)
    assert isinstance(logits, torch.Tensor)
    if logits.dim() != 2:
        raise ValueError(
            f"`{name}` must have shape (B, K-1) (one logit per rank threshold of K classes), "
            f"got shape {tuple(logits.shape)}"
        )
    if logits.shape[1] < 1:
        raise ValueError(f"`{name}` must have K-1 >= 1 columns (at least two classes), got shape {tuple(logits.shape)}")
    return logits


def _check_labels_dtype(labels: torch.Tensor, name: str) -> None:
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise TypeError(
            f"`{name}` must be an integer tensor of class labels 0..K-1, got dtype {labels.dtype}; "
            f"convert it with `{name}.long()`"
        )


def _check_range(labels: torch.Tensor, num_classes: int, name: str) -> None:
    """Every label in ``[0, num_classes)``: a ``ValueError`` on CPU (one host read), a device-side
    assertion (``torch._assert_async``, no host sync) on other devices and under ``torch.compile``."""
    if labels.numel() == 0:
        return
    bad = (labels < 0) | (labels >= num_classes)
    if labels.device.type != "cpu" or torch.compiler.is_compiling():
        torch._assert_async(~bad.any(), f"`{name}` must hold class labels in [0, {num_classes - 1}]")
        return
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"`{name}` must hold class labels in [0, {num_classes - 1}] (num_classes={num_classes}), "
            f"got {labels[i].item()} at index {i}"
        )


def _check_levels(logits: torch.Tensor, levels: object) -> torch.Tensor:
    check_real(levels, "levels")
    assert isinstance(levels, torch.Tensor)
    check_same_device("logits", logits, ("levels", levels))
    if levels.shape != logits.shape:
        raise ValueError(
            f"`logits` and `levels` must have the same shape (B, K-1), one logit per rank threshold of K "
            f"classes; got `logits` {tuple(logits.shape)} and `levels` {tuple(levels.shape)} (for K classes the "
            "head has K-1 outputs and `levels_from_labels(labels, K)` K-1 columns)"
        )
    return levels


def _reduce(val: torch.Tensor, reduction: Reduction) -> torch.Tensor:
    if reduction is None or reduction == "none":
        return val
    if reduction == "sum" or val.numel() == 0:  # an empty batch: 0 that keeps the graph (torch's mean: NaN)
        return val.sum()
    return val.mean()


# --------------------------------------------------------------------------------------------------
# label encoding and decoding
# --------------------------------------------------------------------------------------------------
def levels_from_labels(
    labels: torch.Tensor | Sequence[int], num_classes: int, *, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    r"""Extended binary levels of integer labels: ``levels[i, j] = 1`` iff ``labels[i] > j``.

    Equal to ``coral_pytorch.dataset.levels_from_labelbatch(labels, num_classes)`` (and condor-pytorch's
    function of the same name): label 0 is all zeros, label :math:`K-1` all ones, in ``dtype``
    (default float32, the reference's default). Unlike the reference, which loops over the labels in
    Python and builds every row on the CPU, it is one vectorized comparison on the device of
    ``labels``; an empty batch gives a ``(0, K-1)`` tensor (the reference fails in ``torch.stack``), and
    a label outside ``[0, K-1]`` is an error on every device (the reference refuses only labels above
    :math:`K-1`; a negative one gives a row of the wrong length). The range check reads the labels on
    the host on CPU; on other devices it is a device-side assertion (no host synchronization).

    Args:
        labels: integer class labels ``0..K-1``: a tensor of shape ``(B,)`` (or ``(B, 1)``) or a
            sequence of ints. Floating labels are refused (convert with ``.long()``).
        num_classes: the number of classes :math:`K \ge 2`.
        dtype: the dtype of the levels.

    Shape:
        - labels: :math:`(B,)` or :math:`(B, 1)`.
        - output: :math:`(B, K-1)`, on the device of ``labels``.

    Example:
        >>> import torch
        >>> from rankwise.losses import levels_from_labels
        >>> levels_from_labels(torch.tensor([2, 1, 4]), num_classes=5)
        tensor([[1., 1., 0., 0.],
                [1., 0., 0., 0.],
                [1., 1., 1., 1.]])
    """
    k = _check_num_classes(num_classes)
    if not isinstance(dtype, torch.dtype) or dtype.is_complex:
        raise TypeError(f"`dtype` must be a real torch.dtype, got {dtype!r}")
    if not isinstance(labels, torch.Tensor):
        try:
            labels = torch.as_tensor(labels)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"`labels` must be a tensor or a sequence of ints, got {type(labels).__name__}") from None
        if labels.numel() == 0 and labels.dim() == 1:
            labels = labels.long()  # torch.as_tensor([]) is float32
    _check_labels_dtype(labels, "labels")
    if labels.dim() == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if labels.dim() != 1:
        raise ValueError(f"`labels` must have shape (B,) or (B, 1), got {tuple(labels.shape)}")
    _check_range(labels, k, "labels")
    thresholds = torch.arange(k - 1, device=labels.device)
    return (labels.unsqueeze(1) > thresholds).to(dtype)


def coral_predict(logits: torch.Tensor) -> torch.Tensor:
    r"""The class of CORAL threshold logits: the number of thresholds with :math:`\sigma(z_k) > 0.5`.

    Equal to ``coral_pytorch.dataset.proba_to_label(torch.sigmoid(logits))`` (computed the same way,
    so a logit so small and positive that its sigmoid rounds to 0.5 counts as "not above", as there).

    Shape:
        - logits: :math:`(B, K-1)`, floating.
        - output: :math:`(B,)`, int64 classes in ``0..K-1``.

    Example:
        >>> import torch
        >>> from rankwise.losses import coral_predict
        >>> coral_predict(torch.tensor([[2.0, 0.5, -1.0], [-0.3, -1.0, -2.0]]))
        tensor([2, 0])
    """
    _check_thresholds(logits)
    return (torch.sigmoid(logits) > 0.5).sum(dim=1)


def corn_predict(logits: torch.Tensor) -> torch.Tensor:
    r"""The class of CORN conditional logits: the number of :math:`k` with
    :math:`P(y > k) = \prod_{j \le k} \sigma(z_j) > 0.5`.

    Equal to ``coral_pytorch.dataset.corn_label_from_logits(logits)`` (the same cumulative product, in
    the dtype of ``logits``).

    Shape:
        - logits: :math:`(B, K-1)`, floating.
        - output: :math:`(B,)`, int64 classes in ``0..K-1``.

    Example:
        >>> import torch
        >>> from rankwise.losses import corn_predict
        >>> corn_predict(torch.tensor([[14.152, -6.1942, 0.47710, 0.96850], [65.667, 0.303, 11.500, -4.524]]))
        tensor([1, 3])
    """
    _check_thresholds(logits)
    return (torch.cumprod(torch.sigmoid(logits), dim=1) > 0.5).sum(dim=1)


def condor_predict(logits: torch.Tensor) -> torch.Tensor:
    r"""The class of CONDOR conditional logits: the number of :math:`k` with
    :math:`\prod_{j \le k} \sigma(z_j) > 0.5` (the same decoding as :func:`corn_predict`).

    Equal to ``condor_pytorch.dataset.logits_to_label(logits)``.

    Shape:
        - logits: :math:`(B, K-1)`, floating.
        - output: :math:`(B,)`, int64 classes in ``0..K-1``.

    Example:
        >>> import torch
        >>> from rankwise.losses import condor_predict
        >>> condor_predict(torch.tensor([[0.934, -0.861, 0.323], [-0.496, 0.485, 0.267], [0.985, 0.967, -0.92]]))
        tensor([1, 0, 2])
    """
    _check_thresholds(logits)
    return (torch.cumprod(torch.sigmoid(logits), dim=1) > 0.5).sum(dim=1)


# --------------------------------------------------------------------------------------------------
# losses
# --------------------------------------------------------------------------------------------------
def coral_loss(
    logits: torch.Tensor,
    levels: torch.Tensor,
    *,
    importance_weights: torch.Tensor | None = None,
    reduction: Reduction = "mean",
) -> torch.Tensor:
    r"""CORAL loss (Cao, Mirjalili & Raschka, Pattern Recognit. Lett. 2020): the :math:`K - 1` binary
    cross-entropies of the rank thresholds, summed per example.

    With logits :math:`z_{ik}` and levels :math:`l_{ik} = [y_i > k]` (:func:`levels_from_labels`),

    .. math:: \ell_i = -\sum_{k=0}^{K-2} \lambda_k \bigl[l_{ik} \log\sigma(z_{ik})
              + (1 - l_{ik}) \log(1 - \sigma(z_{ik}))\bigr],

    with :math:`\log(1 - \sigma(z)) = \log\sigma(z) - z` (stable for any :math:`z`) and the
    ``importance_weights`` :math:`\lambda_k` (default 1). ``reduction``: ``"mean"`` (the mean over the
    batch of the per-example sums, the reference's default), ``"sum"``, or ``"none"`` / ``None``
    (shape ``(B,)``). Train it with the rank-consistent head :class:`rankwise.models.CoralLayer`
    (shared weights, :math:`K - 1` biases) and decode with :func:`coral_predict`.

    Values and gradients equal ``coral_pytorch.losses.coral_loss`` 1.4.0 (the same expression).
    Differences: an empty batch gives 0 that keeps the graph for ``"mean"`` (the reference: NaN, the
    mean of nothing); the inputs are computed in their promoted dtype (float16/bfloat16 in float32,
    returned in float32; float64 weights with float32 logits give a float64 loss, where the reference
    multiplies them in place in the logits' dtype); a mismatched width, a wrong dtype or a tensor on another device is a
    ``ValueError`` / ``TypeError`` naming the argument. A NaN/inf logit, level or weight makes the
    losses of the examples that use it NaN (or inf), as in the reference. No host synchronization.

    Args:
        logits: threshold logits ``(B, K-1)``, floating.
        levels: extended binary levels ``(B, K-1)`` (any real dtype; usually float 0/1).
        importance_weights: per-threshold weights ``(K-1,)``, or any shape that broadcasts to
            ``(B, K-1)`` without changing it (e.g. per-example-and-threshold weights).
        reduction: ``"mean"``, ``"sum"``, ``"none"`` or ``None``.

    Shape:
        - logits, levels: :math:`(B, K-1)`.
        - importance_weights: :math:`(K-1,)` (or broadcastable to :math:`(B, K-1)`).
        - output: scalar, or :math:`(B,)` for ``reduction="none"`` / ``None``.

    Example:
        >>> import torch
        >>> from rankwise.losses import coral_loss
        >>> levels = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
        >>> logits = torch.tensor([[2.1, 1.8, -2.1, -1.8], [1.9, -1.0, -1.5, -1.3], [1.9, 1.8, 1.7, 1.6]])
        >>> coral_loss(logits, levels)
        tensor(0.6920)
    """
    _check_thresholds(logits)
    levels = _check_levels(logits, levels)
    check_choice(reduction, "reduction", _REDUCTIONS)
    if importance_weights is not None:
        check_real(importance_weights, "importance_weights")
        check_same_device("logits", logits, ("importance_weights", importance_weights))
        try:
            ok = torch.broadcast_shapes(importance_weights.shape, logits.shape) == logits.shape
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(
                f"`importance_weights` must have shape (K-1,) = ({logits.shape[1]},) (one weight per rank "
                f"threshold) or broadcast to the logits' shape {tuple(logits.shape)}, got "
                f"{tuple(importance_weights.shape)}"
            )
    dt = common_compute_dtype(logits, levels, importance_weights)
    x, z = logits.to(dt), levels.to(dt)
    ls = F.logsigmoid(x)
    term = ls * z + (ls - x) * (1 - z)
    if importance_weights is not None:
        term = term * importance_weights.to(dt)
    return _reduce(-term.sum(dim=1), reduction)


def corn_loss(logits: torch.Tensor, targets: torch.Tensor, num_classes: int) -> torch.Tensor:
    r"""CORN loss (Shi, Cao & Raschka, 2023): binary cross-entropies of the conditional tasks, each on
    its own training subset, averaged over all (example, task) pairs.

    Task :math:`k \in \{0, \dots, K-2\}` estimates :math:`P(y > k \mid y > k - 1)` and trains on
    :math:`S_k = \{i : y_i \ge k\}` with binary label :math:`[y_i > k]`:

    .. math:: \mathcal L = -\frac{1}{\sum_k |S_k|} \sum_{k=0}^{K-2} \sum_{i \in S_k}
              \bigl[[y_i > k] \log\sigma(z_{ik}) + [y_i \le k] \log(1 - \sigma(z_{ik}))\bigr].

    The normalisation is the reference's: the total number of (example, task) pairs
    :math:`\sum_k |S_k| = \sum_i \min(y_i + 1, K - 1)`, not the batch size and not a mean of per-task
    means, so a task with many examples weighs more. All tasks are computed at once, masked (no loop
    over the tasks, no host synchronization but the CPU range check of ``targets``).

    Values and gradients equal ``coral_pytorch.losses.corn_loss`` 1.4.0 wherever the reference is
    defined. A task whose subset is empty (no example with :math:`y \ge k`, e.g. when every target is 0)
    contributes nothing, as in the reference. An **empty batch gives 0** (keeping the graph), where the
    reference divides by zero (``0. / 0`` in Python: ``ZeroDivisionError``). Targets outside
    ``[0, K-1]`` are an error (the reference silently drops negative ones and treats those above
    :math:`K - 1` as :math:`K - 1`): a ``ValueError`` on CPU, a device-side assertion elsewhere. A
    NaN/inf logit makes the loss NaN even when its task's subset leaves it out (the reference ignores
    those). float16/bfloat16 logits are computed and returned in float32.

    Decode with :func:`corn_predict`; any head with :math:`K - 1` outputs is rank consistent.

    Args:
        logits: conditional logits ``(B, K-1)``, floating.
        targets: integer class labels ``(B,)`` in ``0..K-1`` (floating targets are refused).
        num_classes: :math:`K \ge 2`; ``logits`` must have :math:`K - 1` columns.

    Shape:
        - logits: :math:`(B, K-1)`; targets: :math:`(B,)`.
        - output: scalar.

    Example:
        >>> import torch
        >>> from rankwise.losses import corn_loss
        >>> logits = torch.tensor([[2.0, 0.5, -1.0], [-0.3, -1.0, -2.0], [1.5, 1.0, 0.2]], requires_grad=True)
        >>> corn_loss(logits, torch.tensor([2, 0, 3]), num_classes=4)
        tensor(0.3688, grad_fn=<DivBackward0>)
    """
    _check_thresholds(logits)
    check_tensor(targets, "targets")
    _check_labels_dtype(targets, "targets")
    k = _check_num_classes(num_classes)
    check_same_device("logits", logits, ("targets", targets))
    if logits.shape[1] != k - 1:
        raise ValueError(
            f"`logits` must have K-1 = {k - 1} columns for num_classes={k} (one conditional logit per rank "
            f"threshold), got shape {tuple(logits.shape)}"
        )
    if targets.shape != (logits.shape[0],):
        raise ValueError(
            f"`targets` must have shape (B,) = ({logits.shape[0]},) to match `logits`, got {tuple(targets.shape)}"
        )
    _check_range(targets, k, "targets")
    dt = compute_dtype(logits.dtype)
    x = logits.to(dt)
    thresholds = torch.arange(k - 1, device=x.device)
    y = targets.unsqueeze(1)
    in_subset = (y >= thresholds).to(dt)  # task k trains on y >= k (the reference's y > k - 1)
    z = (y > thresholds).to(dt)
    ls = F.logsigmoid(x)
    # masked by a product, not a selection: a NaN/inf logit outside every subset still makes the loss NaN
    term = (ls * z + (ls - x) * (1 - z)) * in_subset
    return -term.sum() / in_subset.sum().clamp_min(1)


def condor_loss(logits: torch.Tensor, levels: torch.Tensor, *, reduction: Reduction = "mean") -> torch.Tensor:
    r"""CONDOR negative log-likelihood (Dennis et al., 2021, "Deep Neural Networks for Rank-Consistent
    Ordinal Regression Based On Conditional Probabilities"; package condor-pytorch).

    The logits are conditional: :math:`\sigma(z_k) = P(y > k \mid y > k - 1)`, so
    :math:`P(y > k) = \prod_{j \le k} \sigma(z_j)`. The likelihood of levels :math:`l_{i\cdot}` counts
    task :math:`k` only where the previous level is 1 (:math:`k = 0` always):

    .. math:: \ell_i = \sum_{k=0}^{K-2} [k = 0 \lor l_{i,k-1} > 0]\;
              \mathrm{BCE}(z_{ik}, l_{ik}),\qquad
              \mathrm{BCE}(z, l) = \max(z, 0) - z l + \log(1 + e^{-|z|}).

    ``reduction``: ``"mean"`` over the batch of the per-example sums (the reference's default),
    ``"sum"``, or ``"none"`` / ``None`` (shape ``(B,)``). Decode with :func:`condor_predict`.

    Values and gradients equal ``condor_pytorch.losses.condor_negloglikeloss`` 1.1.0 (the same stable
    expression, gradient :math:`\sigma(z) - l` also at :math:`z = 0`). Differences: the leading
    "previous level" column is made on the device of the inputs (the reference builds it on the CPU,
    so it fails on CUDA); an empty batch gives 0 that keeps the graph for ``"mean"`` (the reference:
    NaN); float16/bfloat16 are computed and returned in float32; a NaN/inf logit or level makes its
    example's loss NaN even in a task that the mask leaves out (the reference drops it); shape, dtype
    and device errors name the argument.

    Args:
        logits: conditional logits ``(B, K-1)``, floating.
        levels: extended binary levels ``(B, K-1)`` (:func:`levels_from_labels`).
        reduction: ``"mean"``, ``"sum"``, ``"none"`` or ``None``.

    Shape:
        - logits, levels: :math:`(B, K-1)`.
        - output: scalar, or :math:`(B,)` for ``reduction="none"`` / ``None``.

    Example:
        >>> import torch
        >>> from rankwise.losses import condor_loss
        >>> levels = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
        >>> logits = torch.tensor([[2.1, 1.8, -2.1, -1.8], [1.9, -1.0, -1.5, -1.3], [1.9, 1.8, 1.7, 1.6]])
        >>> condor_loss(logits, levels)
        tensor(0.4936)
    """
    _check_thresholds(logits)
    levels = _check_levels(logits, levels)
    check_choice(reduction, "reduction", _REDUCTIONS)
    dt = common_compute_dtype(logits, levels)
    x, z = logits.to(dt), levels.to(dt)
    zeros = torch.zeros_like(x)
    nonneg = x >= zeros
    relu = torch.where(nonneg, x, zeros)  # (the reference's where-forms: its gradient at z = 0)
    neg_abs = torch.where(nonneg, -x, x)
    bce = relu - x * z + torch.log1p(torch.exp(neg_abs))
    counted = torch.cat([torch.ones_like(z[:, :1]), (z[:, :-1] > 0).to(dt)], dim=1)
    # masked by a product, not a selection: a NaN/inf in a task the mask leaves out still makes the row NaN
    return _reduce((bce * counted).sum(dim=1), reduction)


# --------------------------------------------------------------------------------------------------
# module twins
# --------------------------------------------------------------------------------------------------
class CoralLoss(FunctionModule):
    """Module twin of :func:`coral_loss` (``forward(logits, levels, importance_weights=None)``, as
    coral-pytorch's ``CoralLoss``).

    Example:
        >>> import torch
        >>> from rankwise.losses import CoralLoss
        >>> levels = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
        >>> logits = torch.tensor([[2.1, 1.8, -2.1, -1.8], [1.9, -1.0, -1.5, -1.3], [1.9, 1.8, 1.7, 1.6]])
        >>> CoralLoss()(logits, levels)
        tensor(0.6920)
    """

    _function = staticmethod(coral_loss)
    _options = ("reduction",)
    _shown = ("reduction!r",)

    def __init__(self, *, reduction: Reduction = "mean") -> None:
        super().__init__()
        self.reduction = check_choice(reduction, "reduction", _REDUCTIONS)


class CornLoss(FunctionModule):
    """Module twin of :func:`corn_loss` holding ``num_classes`` (``forward(logits, targets)``, as
    coral-pytorch's ``CornLoss``).

    Example:
        >>> import torch
        >>> from rankwise.losses import CornLoss
        >>> logits = torch.tensor([[2.0, 0.5, -1.0], [-0.3, -1.0, -2.0], [1.5, 1.0, 0.2]])
        >>> CornLoss(num_classes=4)(logits, torch.tensor([2, 0, 3]))
        tensor(0.3688)
    """

    _function = staticmethod(corn_loss)
    _positional = ("num_classes",)

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.num_classes = _check_num_classes(num_classes)


class CondorLoss(FunctionModule):
    """Module twin of :func:`condor_loss` (``forward(logits, levels)``).

    Example:
        >>> import torch
        >>> from rankwise.losses import CondorLoss
        >>> levels = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
        >>> logits = torch.tensor([[2.1, 1.8, -2.1, -1.8], [1.9, -1.0, -1.5, -1.3], [1.9, 1.8, 1.7, 1.6]])
        >>> CondorLoss(reduction="sum")(logits, levels)
        tensor(1.4807)
    """

    _function = staticmethod(condor_loss)
    _options = ("reduction",)
    _shown = ("reduction!r",)

    def __init__(self, *, reduction: Reduction = "mean") -> None:
        super().__init__()
        self.reduction = check_choice(reduction, "reduction", _REDUCTIONS)


# --------------------------------------------------------------------------------------------------
# registration
# --------------------------------------------------------------------------------------------------
register_loss(
    "coral",
    module=CoralLoss,
    description="CORAL (Cao et al., Pattern Recognit. Lett. 2020): rank-threshold BCE on a shared-weight head",
    inputs={"logits": "logits", "levels": "levels"},
    takes="logits",
    ordinal=OrdinalHead("thresholds", coral_predict, layer="coral"),
)(coral_loss)
register_loss(
    "corn",
    module=CornLoss,
    description="CORN (Shi et al., 2023): conditional rank-threshold BCE on conditional training subsets",
    inputs={"logits": "logits", "targets": "classes"},
    takes="logits",
    ordinal=OrdinalHead("thresholds", corn_predict, num_classes=True),
)(corn_loss)
register_loss(
    "condor",
    module=CondorLoss,
    description="CONDOR (Dennis et al., 2021): negative log-likelihood of conditional rank-threshold logits",
    inputs={"logits": "logits", "levels": "levels"},
    takes="logits",
    ordinal=OrdinalHead("thresholds", condor_predict),
)(condor_loss)
