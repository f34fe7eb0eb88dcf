r"""The top-k classification loss (Petersen et al., ICML 2022, "Differentiable Top-k Classification Learning").

A classifier is rewarded for placing the true class among its ``k`` highest scores, with ``k`` drawn
from a distribution :math:`P_K` (``p_k``): the loss is the negative log of the relaxed probability
:math:`\sum_k p_k \Pr[\text{target in the top } k]`, where the top-k membership comes from a
differentiable sorting or ranking relaxation (a sorting network, a selection network, NeuralSort or
SoftSort).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real
from typing import Any, Literal

import torch

from rankwise._twin import FunctionModule
from rankwise._validation import (
    batch_loss,
    check_choice,
    check_class_logits,
    check_positive,
    compute_dtype,
    did_you_mean,
)
from rankwise.losses._registry import register_loss
from rankwise.ops.permutation import neural_sort_rows, softsort_rows
from rankwise.ops.sorting_network import DISTRIBUTIONS, Distribution, network_topk_route

__all__ = ["TopKCrossEntropyLoss", "topk_cross_entropy_loss"]

TopKMethod = Literal["odd_even", "bitonic", "splitter_selection", "neuralsort", "softsort"]
Top1Mode = Literal["sm", "smce", "sort"]
Reduction = Literal["mean", "sum", "none"]
METHODS: tuple[str, ...] = ("odd_even", "bitonic", "splitter_selection", "neuralsort", "softsort")
TOP1_MODES: tuple[str, ...] = ("sm", "smce", "sort")
_NETWORKS = ("odd_even", "bitonic", "splitter_selection")
_REDUCTIONS = ("mean", "sum", "none")
_EPS = 1e-7  # log(p (1 - 2 eps) + eps): the authors' guard against log(0)
_P_K_TOL = 1e-4  # p_k must sum to 1 within this


def _check_method(method: Any) -> str:
    if not isinstance(method, str):
        raise TypeError(f"`method` must be a string, one of {', '.join(METHODS)}; got {type(method).__name__}")
    if method not in METHODS:
        raise ValueError(
            f"`method` must be a known top-k method, got {method!r}: {did_you_mean(method, METHODS, 'methods')}"
        )
    return method


def _check_p_k(p_k: Any) -> tuple[float, ...]:
    if isinstance(p_k, torch.Tensor):
        p_k = p_k.detach().cpu().tolist()  # an option, not an input: converted once
    if isinstance(p_k, (str, bytes)) or not isinstance(p_k, Sequence) or len(p_k) == 0:
        raise TypeError(f"`p_k` must be a non-empty sequence of probabilities (P_K over k = 1, 2, ...), got {p_k!r}")
    out = []
    for v in p_k:
        if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(float(v)) or float(v) < 0:
            raise ValueError(f"`p_k` must hold finite probabilities >= 0, got {list(p_k)!r}")
        out.append(float(v))
    total = math.fsum(out)
    if abs(total - 1.0) > _P_K_TOL:
        raise ValueError(f"`p_k` must sum to 1 (a distribution over k), got {list(p_k)!r} summing to {total:g}")
    return tuple(out)


def _check_m(m: Any, k: int, n_classes: int) -> int | None:
    if m is None:
        return None
    if isinstance(m, bool) or not isinstance(m, int):
        raise TypeError(f"`m` must be None or an int, got {type(m).__name__} {m!r}")
    if not k <= m <= n_classes:
        raise ValueError(
            f"`m` (the number of largest logits that enter the sorting) must be in [len(p_k), n_classes] = "
            f"[{k}, {n_classes}], got {m}"
        )
    return m


def _check_options(
    p_k: Any,
    method: Any,
    inverse_temperature: Any,
    m: Any,
    distribution: Any,
    art_lambda: Any,
    top1_mode: Any,
    reduction: Any,
) -> tuple[tuple[float, ...], float, float]:
    probs = _check_p_k(p_k)
    _check_method(method)
    beta = check_positive(inverse_temperature, "inverse_temperature")
    if m is not None and (isinstance(m, bool) or not isinstance(m, int)):
        raise TypeError(f"`m` must be None or an int, got {type(m).__name__} {m!r}")
    if m is not None and m < len(probs):
        raise ValueError(f"`m` must be >= len(p_k) = {len(probs)} (the largest k of P_K), got {m}")
    check_choice(distribution, "distribution", DISTRIBUTIONS)
    lam = check_positive(art_lambda, "art_lambda", allow_zero=True)
    check_choice(top1_mode, "top1_mode", TOP1_MODES)
    check_choice(reduction, "reduction", _REDUCTIONS)
    return probs, beta, lam


def _preselect(x: torch.Tensor, t: torch.Tensor, m: int) -> torch.Tensor:
    """``[x_t, the m - 1 largest other logits in descending order]`` per row (the target then is class 0)."""
    true = x.gather(-1, t.unsqueeze(-1))
    others = x.detach().scatter(-1, t.unsqueeze(-1), -math.inf)
    idx = torch.topk(others, m - 1, dim=-1).indices
    return torch.cat([true, x.gather(-1, idx)], dim=-1)


def _membership(
    x: torch.Tensor,
    t: torch.Tensor,
    k: int,
    method: str,
    beta: float,
    distribution: str,
    art_lambda: float,
) -> torch.Tensor:
    """``(B, k)``: relaxed probability that target ``t[b]`` is among the ``r + 1`` largest of row ``x[b]``."""
    if method in _NETWORKS:
        rows = network_topk_route(
            x, t, k, network=method, steepness=beta, distribution=distribution, art_lambda=art_lambda
        )
    else:
        tau = 1.0 / beta
        p = neural_sort_rows(x, tau, rows=k) if method == "neuralsort" else softsort_rows(x, tau, 1.0, rows=k)
        rows = p.gather(-1, t.view(-1, 1, 1).expand(-1, k, 1)).squeeze(-1)  # P̂[b, r, t_b]
    return rows.cumsum(dim=-1)


def _nll(prob: torch.Tensor) -> torch.Tensor:
    return -torch.log(prob * (1 - 2 * _EPS) + _EPS)


@batch_loss("logits", "targets")
def topk_cross_entropy_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    p_k: Sequence[float],
    method: TopKMethod = "odd_even",
    inverse_temperature: float = 2.0,
    m: int | None = None,
    distribution: Distribution = "cauchy",
    art_lambda: float = 0.25,
    top1_mode: Top1Mode = "sm",
    reduction: Reduction = "mean",
) -> torch.Tensor:
    r"""Top-k cross-entropy (Petersen et al., ICML 2022, "Differentiable Top-k Classification Learning").

    For logits :math:`z \in \mathbb R^C` and target class :math:`t`, a relaxed sorting method gives
    :math:`\pi_k(z)_t`, the relaxed probability that class :math:`t` is among the :math:`k` largest
    logits (the sum of the :math:`k` top positions of the relaxed permutation matrix in row
    :math:`t`). With :math:`P_K` = ``p_k`` (``p_k[k-1]`` is the weight of top-k, ``k = 1..len(p_k)``):

    .. math::
        \ell(z, t) = -\log\Bigl(\textstyle\sum_{k} p_k\, \pi_k(z)_t\,(1 - 2\epsilon) + \epsilon\Bigr),
        \qquad \epsilon = 10^{-7}.

    ``top1_mode`` treats the top-1 term: ``"sm"`` (default) uses :math:`\operatorname{softmax}(z)_t`
    for :math:`\pi_1`; ``"smce"`` drops it from the sum and adds the cross-entropy instead,
    :math:`p_1\,\mathrm{CE}(z, t) + (\sum_{k \ge 2} p_k)\,\ell_{\ge 2}` (:math:`\ell_{\ge 2}`: the loss
    above over :math:`k \ge 2`); ``"sort"`` uses the relaxation for every :math:`k`.

    ``method`` picks the relaxation, with inverse temperature :math:`\beta` = ``inverse_temperature``:

    * ``"odd_even"``, ``"bitonic"``: differentiable sorting networks on the logits (ascending), as
      :func:`rankwise.diffsort` with ``steepness=β``, ``distribution`` and ``art_lambda`` (the
      activation replacement trick of ``distribution="logistic_phi"``); :math:`\pi_k` is the weight of
      class :math:`t` on the ``k`` last wires;
    * ``"splitter_selection"``: the splitter selection network, which only selects and orders the
      ``len(p_k)`` largest (fewer layers than a full sort);
    * ``"neuralsort"``: NeuralSort (Grover et al., ICLR 2019), ``tau = 1/β``;
    * ``"softsort"``: SoftSort (Prillo & Eisenschlos, ICML 2020), ``tau = 1/β``, power 1.

    ``m`` (many classes): only the ``m`` largest logits are relaxed: the target's logit first, then
    the ``m - 1`` largest others in descending order (a hard, non-differentiable pre-selection); the
    softmax / cross-entropy terms also use those ``m`` logits. ``len(p_k) <= m <= C`` (difftopk
    asks for ``len(p_k) < m < C``; ``m = C`` still reorders the logits, so for the networks it is not
    ``m=None``).

    Values and gradients equal ``difftopk.TopKCrossEntropyLoss`` (``diffsort_method=method``,
    ``inverse_temperature``, ``p_k``, ``n=C``, ``m``, ``distribution``, ``art_lambda``, ``top1_mode``)
    for every method it offers (its sparse bitonic and splitter selection networks compute the same
    matrices), in float32 and float64; the defaults are difftopk's (it has no default
    ``inverse_temperature`` nor ``distribution``: 2 and ``"cauchy"`` are those of its README). Cost
    per row: networks O(L C) (L layers: ``C`` for odd-even, about ``log2(C)²/2`` for bitonic), the
    class's route through the network is propagated, no ``C x C`` matrix; NeuralSort and SoftSort
    O(len(p_k) C) plus a sort.

    Args:
        logits: class scores :math:`(*, C)`, floating.
        targets: class indices :math:`(*)`, integer, in ``[0, C)``.
        p_k: :math:`P_K`, non-negative, summing to 1 (within 1e-4).
        method: see above.
        inverse_temperature: :math:`\beta > 0`.
        m: ``None`` (all classes) or the number of logits that enter the relaxation.
        distribution: the comparator's CDF of the networks (see :func:`rankwise.diffsort`).
        art_lambda: :math:`\lambda \ge 0` of ``distribution="logistic_phi"``.
        top1_mode: ``"sm"``, ``"smce"`` or ``"sort"``.
        reduction: ``"mean"`` (over the examples; 0 that keeps the graph for an empty batch),
            ``"sum"`` or ``"none"``.

    Shape:
        - logits: :math:`(*, C)`; targets: :math:`(*)`.
        - output: scalar, or :math:`(*)` for ``reduction="none"``; float32 for float16/bfloat16
          logits, otherwise their dtype.

    A NaN/inf logit makes the loss NaN (every element for ``reduction="none"``).

    Example:
        >>> import torch
        >>> from rankwise.losses import topk_cross_entropy_loss
        >>> logits = torch.tensor([[2.0, 1.0, 0.5, -1.0], [0.0, 3.0, 1.0, 2.0]])
        >>> targets = torch.tensor([1, 0])
        >>> topk_cross_entropy_loss(logits, targets, p_k=[0.5, 0.5], inverse_temperature=2.0)
        tensor(1.8763)
        >>> topk_cross_entropy_loss(logits, targets, p_k=[0.5, 0.5], method="neuralsort", m=3)
        tensor(2.1737)
    """
    probs, beta, lam = _check_options(
        p_k, method, inverse_temperature, m, distribution, art_lambda, top1_mode, reduction
    )
    check_class_logits(logits, targets)
    n_classes, k = logits.shape[-1], len(probs)
    if k > n_classes:
        raise ValueError(f"`p_k` must not be longer than the number of classes {n_classes}, got {k} entries")
    sel = _check_m(m, k, n_classes)
    out_shape = targets.shape
    x = logits.reshape(-1, n_classes).to(compute_dtype(logits.dtype))
    t = targets.reshape(-1).long()
    if sel is not None:
        x, t = _preselect(x, t, sel), torch.zeros_like(t)
    pi = _membership(x, t, k, method, beta, distribution, lam)  # (B, k)
    if top1_mode == "sort":
        loss = _nll(sum(p * pi[:, i] for i, p in enumerate(probs) if p != 0.0) + 0 * pi[:, 0])
    else:
        rest = sum((p * pi[:, i] for i, p in enumerate(probs) if i > 0 and p != 0.0), 0 * pi[:, 0])
        log_sm = torch.log_softmax(x, dim=-1).gather(-1, t.unsqueeze(-1)).squeeze(-1)
        if top1_mode == "sm":
            loss = _nll(probs[0] * log_sm.exp() + rest)
        else:
            loss = probs[0] * -log_sm + math.fsum(probs[1:]) * _nll(rest)
    loss = loss.reshape(out_shape)
    if reduction == "none":
        return loss
    if reduction == "sum" or loss.numel() == 0:
        return loss.sum()
    return loss.mean()


class TopKCrossEntropyLoss(FunctionModule):
    """Module twin of :func:`topk_cross_entropy_loss` (``forward(logits, targets)``)."""

    _function = staticmethod(topk_cross_entropy_loss)
    _options = ("p_k", "method", "inverse_temperature", "m", "distribution", "art_lambda", "top1_mode", "reduction")
    _shown = (
        "p_k",
        "method!r",
        "inverse_temperature",
        "m",
        "distribution!r",
        "art_lambda",
        "top1_mode!r",
        "reduction!r",
    )

    def __init__(
        self,
        *,
        p_k: Sequence[float],
        method: TopKMethod = "odd_even",
        inverse_temperature: float = 2.0,
        m: int | None = None,
        distribution: Distribution = "cauchy",
        art_lambda: float = 0.25,
        top1_mode: Top1Mode = "sm",
        reduction: Reduction = "mean",
    ) -> None:
        super().__init__()
        probs, self.inverse_temperature, self.art_lambda = _check_options(
            p_k, method, inverse_temperature, m, distribution, art_lambda, top1_mode, reduction
        )
        self.p_k = list(probs)
        self.method, self.m, self.distribution = method, m, distribution
        self.top1_mode, self.reduction = top1_mode, reduction


register_loss(
    "topk_cross_entropy",
    module=TopKCrossEntropyLoss,
    inputs={"logits": "logits", "targets": "classes"},
    takes="class_logits",
)(topk_cross_entropy_loss)
