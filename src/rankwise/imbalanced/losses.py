"""Weighted regression losses of deep imbalanced regression (L1, MSE, focal-L1, focal-MSE, Huber)."""

from __future__ import annotations

from typing import Literal

import torch

from rankwise._twin import FunctionModule
from rankwise._validation import check_choice, check_floating, check_positive, check_real, compute_dtype

__all__ = ["RegressionLoss", "regression_loss"]

Kind = Literal["l1", "mse", "focal_l1", "focal_mse", "huber"]
Activate = Literal["sigmoid", "tanh"]
Reduction = Literal["mean", "sum", "none"]
REGRESSION_KINDS = ("l1", "mse", "focal_l1", "focal_mse", "huber")
_ACTIVATE = ("sigmoid", "tanh")
_REDUCTIONS = ("mean", "sum", "none")


def _broadcast_weights(weights: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Weights of shape ``(B,)`` for a loss of shape ``(B, 1)`` / ``(B, k)`` are aligned on the leading dim.

    Anything else must broadcast to ``shape`` without enlarging it (a ``(B,)`` weight must never turn a
    ``(B, 1)`` loss into a ``(B, B)`` one).
    """
    w = weights
    if 0 < w.dim() < len(shape) and tuple(w.shape) == tuple(shape[: w.dim()]):
        w = w.reshape(*w.shape, *([1] * (len(shape) - w.dim())))
    try:
        return torch.broadcast_to(w, shape)
    except RuntimeError:
        raise ValueError(
            f"`weights` must have the shape of `pred` {tuple(shape)}, its leading dims, or broadcast to it; "
            f"got shape {tuple(weights.shape)}"
        ) from None


def _safe_pow(f: torch.Tensor, gamma: float) -> torch.Tensor:
    """``f ** gamma`` for ``f >= 0`` with a finite gradient at ``f = 0`` (also for ``gamma < 1``)."""
    if gamma == 1.0:
        return f
    if gamma == 0.0:
        return torch.ones_like(f)
    pos = f > 0
    safe = torch.where(pos, f, torch.ones_like(f))
    return torch.where(pos, safe.pow(gamma), torch.zeros_like(f))


def regression_loss(
    pred: torch.Tensor,
    target: torch.Tensor,
    weights: torch.Tensor | None = None,
    *,
    kind: Kind = "l1",
    beta: float = 0.2,
    gamma: float = 1.0,
    activate: Activate = "sigmoid",
    huber_beta: float = 1.0,
    reduction: Reduction = "mean",
) -> torch.Tensor:
    r"""The (optionally sample-weighted) base losses of deep imbalanced regression (Yang et al., ICML'21).

    With the error :math:`e = \hat y - y` and per-sample weights :math:`w` (all ones when ``weights``
    is ``None``), the element-wise loss is :math:`w\,\ell(e)` with

    * ``"l1"``: :math:`|e|`; ``"mse"``: :math:`e^2`;
    * ``"focal_l1"``: :math:`|e|\,f(|e|)^{\gamma}`; ``"focal_mse"``: :math:`e^2\,f(|e|)^{\gamma}`, where the
      modulating factor is computed from the *absolute* error for both (as in the DIR definitions):
      :math:`f(a) = 2\,\sigma(\beta a) - 1` (``activate="sigmoid"``) or :math:`\tanh(\beta a)`
      (``activate="tanh"``); both lie in :math:`[0, 1)` and down-weight easy (small-error) samples;
    * ``"huber"``: :math:`\tfrac12 e^2/\delta` if :math:`|e| < \delta`, else :math:`|e| - \tfrac12\delta`,
      with :math:`\delta` = ``huber_beta`` (``torch.nn.functional.smooth_l1_loss``'s convention).

    ``weights`` apply to EVERY kind. (The copies of the DIR losses in the RankSim and ConR training
    scripts pass the weights positionally, so their focal losses silently ignore them and their Huber
    loss receives them as ``beta``; rankwise does not reproduce that bug.) Typical weights come from
    :func:`rankwise.imbalanced.lds_weights`.

    ``reduction="mean"`` is the plain mean of the weighted element losses (``torch.mean(w * l)``, as the
    reference does; it is *not* normalized by ``sum(w)``: LDS weights already average to 1), ``"sum"``
    their sum, ``"none"`` the element-wise tensor. An empty batch gives ``0`` (``"mean"``/``"sum"``)
    that keeps the graph. The focal factor's power has a finite gradient at :math:`e = 0` for any
    :math:`\gamma \ge 0`. NaN/inf values propagate element-wise as in ``torch.nn.functional``
    (``reduction="none"``: NaN exactly where ``pred``, ``target`` or ``weights`` is NaN; the mean and
    sum are then NaN too), so a caller can mask missing targets itself.

    Shape:
        - pred, target: :math:`(*)`, the same shape (e.g. ``(B,)`` or ``(B, 1)``), floating.
        - weights: ``None``, the shape of ``pred``, its leading dims (``(B,)`` for a ``(B, 1)`` pred) or
          anything broadcasting to it.
        - output: scalar, or the shape of ``pred`` for ``reduction="none"``; fp16/bf16 inputs are
          computed and returned in float32, other floating dtypes are kept.

    Example:
        >>> import torch
        >>> from rankwise.imbalanced import regression_loss
        >>> pred = torch.tensor([[1.0], [2.0], [4.0]], requires_grad=True)
        >>> target = torch.tensor([[1.5], [2.0], [1.0]])
        >>> regression_loss(pred, target)
        tensor(1.1667, grad_fn=<MeanBackward0>)
        >>> w = torch.tensor([2.0, 1.0, 0.0])
        >>> regression_loss(pred, target, w, kind="focal_l1", gamma=1.0)
        tensor(0.0167, grad_fn=<MeanBackward0>)
        >>> regression_loss(pred, target, w, kind="huber", reduction="sum")
        tensor(0.2500, grad_fn=<SumBackward0>)
    """
    check_floating(pred, "pred")
    check_real(target, "target")
    check_choice(kind, "kind", REGRESSION_KINDS)
    check_choice(activate, "activate", _ACTIVATE)
    check_choice(reduction, "reduction", _REDUCTIONS)
    beta = check_positive(beta, "beta")
    gamma = check_positive(gamma, "gamma", allow_zero=True)
    huber_beta = check_positive(huber_beta, "huber_beta")
    if pred.shape != target.shape:
        raise ValueError(
            f"`target` must have the shape of `pred` {tuple(pred.shape)}, got {tuple(target.shape)}; "
            "reshape one of them (e.g. `target.view_as(pred)`)"
        )
    if target.device != pred.device:
        raise ValueError(f"`target` must be on the device of `pred` ({pred.device}), got {target.device}")
    dt = compute_dtype(pred.dtype)
    if target.is_floating_point():
        dt = torch.promote_types(dt, compute_dtype(target.dtype))
    p, t = pred.to(dt), target.to(dt)
    err = p - t
    abs_err = err.abs()
    if kind == "l1":
        loss = abs_err
    elif kind == "mse":
        loss = err * err
    elif kind == "huber":
        loss = torch.where(abs_err < huber_beta, 0.5 * err * err / huber_beta, abs_err - 0.5 * huber_beta)
    else:
        base = abs_err if kind == "focal_l1" else err * err
        f = torch.tanh(beta * abs_err) if activate == "tanh" else 2 * torch.sigmoid(beta * abs_err) - 1
        loss = base * _safe_pow(f, gamma)
    if weights is not None:
        check_real(weights, "weights")
        if weights.device != pred.device:
            raise ValueError(f"`weights` must be on the device of `pred` ({pred.device}), got {weights.device}")
        loss = loss * _broadcast_weights(weights.to(dt), loss.shape)
    if reduction == "none":
        return loss
    if reduction == "sum" or loss.numel() == 0:
        return loss.sum()
    return loss.mean()


class RegressionLoss(FunctionModule):
    """Module twin of :func:`regression_loss` holding the hyperparameters.

    ``forward(pred, target, weights=None)``.
    """

    _function = staticmethod(regression_loss)
    _options = ("kind", "beta", "gamma", "activate", "huber_beta", "reduction")
    _shown = ("kind!r", "beta", "gamma", "activate!r", "huber_beta", "reduction!r")

    def __init__(
        self,
        *,
        kind: Kind = "l1",
        beta: float = 0.2,
        gamma: float = 1.0,
        activate: Activate = "sigmoid",
        huber_beta: float = 1.0,
        reduction: Reduction = "mean",
    ) -> None:
        super().__init__()
        check_choice(kind, "kind", REGRESSION_KINDS)
        check_choice(activate, "activate", _ACTIVATE)
        check_choice(reduction, "reduction", _REDUCTIONS)
        self.kind = kind
        self.beta = check_positive(beta, "beta")
        self.gamma = check_positive(gamma, "gamma", allow_zero=True)
        self.activate = activate
        self.huber_beta = check_positive(huber_beta, "huber_beta")
        self.reduction = reduction
