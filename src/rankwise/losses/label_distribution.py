"""Ordinal losses over ``K`` class logits: distance-weighted, soft-label and label-distribution losses.

Every loss takes ``logits`` of shape ``(..., K)`` (one logit per class) and integer ``targets`` of shape
``(...)`` holding classes ``0..K-1``. The distance-weighted cross-entropy, the unimodal soft-label
cross-entropies, SORD, the squared EMD, the weighted-kappa loss and SLACE equal ``dlordinal`` 2.7.0 on
the same inputs and options; the mean-variance loss (Pan et al., CVPR 2018) and DLDL-v2 (Gao et al.,
IJCAI 2018) follow their papers' formulas. :func:`argmax_class` and :func:`expected_class` decode the
logits into a class.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from rankwise._kernels._custom import constant_result
from rankwise._registry import OrdinalHead
from rankwise._twin import FunctionModule
from rankwise._validation import (
    autocast_off,
    batch_loss,
    check_bool,
    check_choice,
    check_floating,
    check_positive,
    check_real,
    check_same_device,
    common_compute_dtype,
    did_you_mean,
)
from rankwise.losses._registry import register_loss

__all__ = [
    "DISTRIBUTIONS",
    "CDWCELoss",
    "DLDLLoss",
    "EMDLoss",
    "MeanVarianceLoss",
    "QWKLoss",
    "SLACELoss",
    "SORDLoss",
    "UnimodalCELoss",
    "argmax_class",
    "cdw_ce_loss",
    "dldl_loss",
    "emd_loss",
    "expected_class",
    "mean_variance_loss",
    "qwk_loss",
    "slace_loss",
    "sord_loss",
    "unimodal_ce_loss",
]

Reduction = Literal["mean", "sum", "none"]
_REDUCTIONS = ("mean", "sum", "none")
#: the soft-label distributions of :func:`unimodal_ce_loss`
DISTRIBUTIONS = ("beta", "binomial", "poisson", "exponential", "triangular", "general_triangular", "geometric")
#: each distribution's options (``**params`` of :func:`unimodal_ce_loss`) and their defaults
_DIST_PARAMS: dict[str, dict[str, Any]] = {
    "beta": {"params_set": "standard"},
    "binomial": {},
    "poisson": {},
    "exponential": {"p": 1.0, "tau": 1.0},
    "triangular": {"alpha2": 0.05},
    "general_triangular": {"alphas": None},
    "geometric": {"alphas": 0.1},
}
_FTYPES = ("max", "norm_max", "log", "norm_log", "division", "norm_division")
_LOG_EPS = math.log(1e-8)  # CDW-CE's 1e-8 inside its logarithms (dlordinal's convention), as a log


# --------------------------------------------------------------------------------------------------
# argument checks
# --------------------------------------------------------------------------------------------------
def _check_logits(logits: Any) -> int:
    check_floating(logits, "logits")
    if logits.dim() == 0 or logits.shape[-1] < 2:
        raise ValueError(
            f"`logits` must have shape (..., K) with K >= 2 classes in its last dim, got shape {tuple(logits.shape)}"
        )
    return int(logits.shape[-1])


def _assert_on_device(bad: torch.Tensor, message: str) -> None:
    """Raise ``ValueError(message)`` where ``bad`` (a 0-d bool) is true: a host read of one flag on CPU in
    eager mode; elsewhere a device-side assertion (no host synchronization)."""
    if bad.device.type == "cpu" and not torch.compiler.is_compiling():
        if bool(bad):
            raise ValueError(message)
        return
    torch._assert_async(~bad, message)


def _check_classes(targets: Any, k: int, name: str, shape: tuple[int, ...] | None) -> torch.Tensor:
    check_real(targets, name)
    if targets.is_floating_point() or targets.dtype == torch.bool:
        raise TypeError(f"`{name}` must be an integer tensor of classes 0..{k - 1}, got dtype {targets.dtype}")
    if shape is not None and tuple(targets.shape) != shape:
        raise ValueError(f"`{name}` must have shape {shape} (the leading dims of `logits`), got {tuple(targets.shape)}")
    if targets.numel() > 0:
        bad = ((targets < 0) | (targets >= k)).any()
        _assert_on_device(bad, f"`{name}` must hold classes in 0..{k - 1} (K = {k} logits), got a value outside")
    return targets


def _check_inputs(logits: Any, targets: Any) -> tuple[int, torch.Tensor, torch.Tensor]:
    """``K``, the logits as ``(N, K)`` and the targets as ``(N,)`` (leading dims flattened)."""
    k = _check_logits(logits)
    _check_classes(targets, k, "targets", tuple(logits.shape[:-1]))
    check_same_device("logits", logits, ("targets", targets))
    return k, logits.reshape(-1, k), targets.reshape(-1)


def _check_weight(weight: Any, k: int, logits: torch.Tensor) -> torch.Tensor | None:
    if weight is None:
        return None
    check_real(weight, "weight")
    if weight.shape != (k,):
        raise ValueError(f"`weight` must have shape ({k},) (one weight per class), got {tuple(weight.shape)}")
    check_same_device("logits", logits, ("weight", weight))
    return weight


def _check_unit(value: Any, name: str, *, upper: float = 1.0, closed: bool = True) -> float:
    """A real number in ``[0, upper]`` (``closed``) or ``[0, upper)``."""
    v = check_positive(value, name, allow_zero=True)
    if v > upper or (not closed and v == upper):
        raise ValueError(f"`{name}` must be in [0, {upper}{']' if closed else ')'}, got {value!r}")
    return v


def _reduce(loss: torch.Tensor, reduction: str, shape: tuple[int, ...]) -> torch.Tensor:
    if reduction == "none":
        return loss.reshape(shape)
    if reduction == "sum" or loss.numel() == 0:
        return loss.sum()
    return loss.mean()


def _classes(k: int, dt: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.arange(k, dtype=dt, device=device)


# --------------------------------------------------------------------------------------------------
# decoders
# --------------------------------------------------------------------------------------------------
def argmax_class(logits: torch.Tensor) -> torch.Tensor:
    r"""The most probable class of each row of ``logits``: :math:`\arg\max_k z_k` (the first on ties).

    Shape:
        - logits: :math:`(*, K)`, floating.
        - output: :math:`(*)`, int64.

    Example:
        >>> import torch
        >>> from rankwise.losses import argmax_class
        >>> argmax_class(torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.0]]))
        tensor([1, 0])
    """
    _check_logits(logits)
    return logits.argmax(dim=-1)


def expected_class(logits: torch.Tensor) -> torch.Tensor:
    r"""The expected class under the softmax of ``logits``: :math:`\sum_{k=0}^{K-1} k\,\mathrm{softmax}(z)_k`.

    The prediction of the expectation-based losses (:func:`mean_variance_loss`, :func:`dldl_loss`), a
    real number in :math:`[0, K - 1]`.

    Shape:
        - logits: :math:`(*, K)`, floating.
        - output: :math:`(*)`, the compute dtype (float32 for half inputs).

    Example:
        >>> import torch
        >>> from rankwise.losses import expected_class
        >>> expected_class(torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 1e4]]))
        tensor([1., 2.])
    """
    k = _check_logits(logits)
    dt = common_compute_dtype(logits)
    p = torch.softmax(logits.to(dt), dim=-1)
    return (p * _classes(k, dt, logits.device)).sum(-1)


# --------------------------------------------------------------------------------------------------
# CDW-CE
# --------------------------------------------------------------------------------------------------
@batch_loss("logits", "targets", "weight")
def cdw_ce_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    alpha: float = 0.5,
    margin: float = 0.0,
    weight: torch.Tensor | None = None,
    reduction: Reduction = "mean",
) -> torch.Tensor:
    r"""Class distance weighted cross-entropy (Polat et al., 2022), as ``dlordinal.losses.CDWCELoss``.

    With :math:`S = \sum_k e^{z_k}` and :math:`S_{-j} = S - e^{z_j}`, a sample of class :math:`y` costs

    .. math::
        \ell = -\,\tilde w_y \sum_{j=0}^{K-1} |j - y|^{\alpha}
        \left[\log\!\big(\min(S_{-j} + m S,\ S) + 10^{-8}\big) - \log\!\big(S + 10^{-8}\big)\right],

    i.e. :math:`-\sum_j |j-y|^\alpha \log(1 - p_j)` pushing the probability of far classes down
    (:math:`m` = ``margin``; the :math:`10^{-8}` are the reference's). ``weight`` (one per class) is
    divided by its sum and weights each sample by its class, :math:`\tilde w_y = w_y / \sum_k w_k`
    (all ones when ``None``). The logarithms are evaluated from log-sum-exps, so large logits neither
    overflow nor cancel. ``reduction="mean"``: the mean over samples (the reference's sum over classes
    and samples divided by the batch size).

    Shape:
        - logits: :math:`(*, K)`, floating, :math:`K \ge 2`; targets: :math:`(*)`, integer in ``0..K-1``.
        - weight: ``None`` or :math:`(K,)`.
        - output: scalar, or :math:`(*)` for ``reduction="none"``; the compute dtype (float32 for
          half inputs).

    Example:
        >>> import torch
        >>> from rankwise.losses import cdw_ce_loss
        >>> logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
        >>> cdw_ce_loss(logits, torch.tensor([0, 2]), alpha=1.0)
        tensor(0.7709)
    """
    k, z, y = _check_inputs(logits, targets)
    a = check_positive(alpha, "alpha", allow_zero=True)
    m = check_positive(margin, "margin", allow_zero=True)
    check_choice(reduction, "reduction", _REDUCTIONS)
    w = _check_weight(weight, k, logits)
    dt = common_compute_dtype(logits, w)
    z = z.to(dt)
    lse = torch.logsumexp(z, dim=-1, keepdim=True)  # log S
    eye = torch.eye(k, dtype=torch.bool, device=z.device)
    others = z.unsqueeze(-2).masked_fill(eye, -math.inf)  # row j: the logits without class j
    lse_minus = torch.logsumexp(others, dim=-1)  # log S_{-j}, (N, K)
    if m > 0.0:
        inner = torch.minimum(torch.logaddexp(lse_minus, lse + math.log(m)), lse.expand_as(lse_minus))
    else:
        inner = lse_minus
    eps = torch.full((), _LOG_EPS, dtype=dt, device=z.device)
    log_1mp = torch.logaddexp(inner, eps) - torch.logaddexp(lse, eps)
    dist = (_classes(k, dt, z.device) - y.to(dt).unsqueeze(-1)).abs().pow(a)
    loss = -(log_1mp * dist).sum(-1)
    if w is not None:
        w = w.to(dt)
        loss = loss * (w / w.sum())[y]
    return _reduce(loss, reduction, tuple(targets.shape))


class CDWCELoss(FunctionModule):
    """Module twin of :func:`cdw_ce_loss`."""

    _function = staticmethod(cdw_ce_loss)
    _options = ("alpha", "margin", "weight", "reduction")
    _shown = ("alpha", "margin", "reduction!r")

    def __init__(
        self,
        *,
        alpha: float = 0.5,
        margin: float = 0.0,
        weight: torch.Tensor | None = None,
        reduction: Reduction = "mean",
    ) -> None:
        super().__init__()
        self.alpha = check_positive(alpha, "alpha", allow_zero=True)
        self.margin = check_positive(margin, "margin", allow_zero=True)
        self._tensor_option("weight", weight)
        self.reduction = check_choice(reduction, "reduction", _REDUCTIONS)


# --------------------------------------------------------------------------------------------------
# soft-label matrices (float64, pure Python: no scipy)
# --------------------------------------------------------------------------------------------------
#: the beta parameters p,q per class (a = 1) of Vargas et al. (Neurocomputing 2022), the "standard" set
_BETA_PQ = {
    3: "1,4 4,4 4,1",
    4: "1,6 6,10 10,6 6,1",
    5: "1,8 6,14 12,12 14,6 8,1",
    6: "1,10 7,20 15,20 20,15 20,7 10,1",
    7: "1,12 7,26 16,28 24,24 28,16 26,7 12,1",
    8: "1,14 7,31 17,37 27,35 35,27 37,17 31,7 14,1",
    9: "1,16 8,40 18,47 30,47 40,40 47,30 47,18 40,8 16,1",
    10: "1,18 8,45 19,57 32,59 45,55 55,45 59,32 57,19 45,8 18,1",
    11: "1,21 8,51 20,68 34,73 48,69 60,60 69,48 73,34 68,20 51,8 21,1",
    12: "1,23 8,56 20,76 35,85 51,85 65,77 77,65 85,51 85,35 76,20 56,8 23,1",
    13: "1,25 8,61 20,84 36,98 53,100 70,95 84,84 95,70 100,53 98,36 84,20 61,8 25,1",
    14: "1,27 2,17 5,23 9,27 13,28 18,28 23,27 27,23 28,18 28,13 27,9 23,5 17,2 27,1",
}
_BETA_STANDARD: dict[int, tuple[tuple[float, float, float], ...]] = {
    k: tuple((float(pq.split(",")[0]), float(pq.split(",")[1]), 1.0) for pq in rows.split())
    for k, rows in _BETA_PQ.items()
}

_Matrix = tuple[tuple[float, ...], ...]


def _points(k: int) -> list[float]:
    """The ``K + 1`` interval bounds on [0, 1] of the CDF-based soft labels (inset by 1e-9)."""
    return [float(v) for v in np.linspace(1e-9, 1 - 1e-9, k + 1)]


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 100_000):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            delta = d * c
            h *= delta
        if abs(delta - 1.0) < 1e-16:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function :math:`I_x(a, b)`."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def _beta_matrix(k: int, params: tuple[tuple[float, float, float], ...]) -> list[list[float]]:
    pts = _points(k)
    out = []
    for p, q, a in params:
        cdf = [_betainc(p, q, x**a) for x in pts]
        out.append([cdf[i + 1] - cdf[i] for i in range(k)])
    return out


def _binomial_matrix(k: int) -> list[list[float]]:
    n = k - 1
    return [
        [math.comb(n, i) * p**i * (1.0 - p) ** (n - i) for i in range(k)]
        for p in (float(v) for v in np.linspace(0.1, 0.9, k))
    ]


def _softmax_row(z: list[float]) -> list[float]:
    top = max(z)
    e = [math.exp(v - top) for v in z]
    s = sum(e)
    return [v / s for v in e]


def _poisson_matrix(k: int) -> list[list[float]]:
    rows = []
    for lam in range(1, k + 1):
        pmf = [math.exp(i * math.log(lam) - lam - math.lgamma(i + 1)) for i in range(k)]
        rows.append(_softmax_row(pmf))  # the reference normalizes the truncated pmf with a softmax
    return rows


def _exponential_matrix(k: int, p: float, tau: float) -> list[list[float]]:
    return [_softmax_row([-(abs(i - j) ** p) / tau for i in range(k)]) for j in range(k)]


def _triangular_cdf(x: float, a: float, b: float, c: float) -> float:
    if x <= a:
        return 0.0
    if x >= b:
        return 1.0
    if x <= c:
        return (x - a) ** 2 / ((b - a) * (c - a))
    return 1.0 - (b - x) ** 2 / ((b - a) * (b - c))


def _triangles_matrix(k: int, abc: list[tuple[float, float, float]]) -> list[list[float]]:
    pts = _points(k)
    out = []
    for a, b, c in abc:
        cdf = [_triangular_cdf(x, a, b, c) for x in pts]
        out.append([cdf[i + 1] - cdf[i] for i in range(k)])
    return out


def _triangular_matrix(k: int, alpha2: float) -> list[list[float]]:
    """Triangular soft labels of Vargas et al. (2023): mass ``alpha2`` on each neighbour of an inner class."""
    s2 = math.sqrt(2 * alpha2)
    c_minus = (1 - 2 * alpha2) * (2 * alpha2 - s2)
    alpha1 = ((1 - math.sqrt(1 - 4 * c_minus)) / 2) ** 2
    c1 = ((k - 1) / k) ** 2 * (1 - 2 * alpha2) * (s2 * (-1 + s2))
    alpha3 = ((1 - math.sqrt(1 - 4 * c1)) / 2) ** 2
    den = 2.0 * k * (1 - 2 * alpha2)
    abc = [(0.0, 1.0 / ((1.0 - math.sqrt(alpha1)) * k), 0.0)]
    for j in range(2, k):
        num_a = 2.0 * j - 2 - 4 * j * alpha2 + 2 * alpha2
        a = (num_a + s2) / den if (num_a + s2) / den < (j - 1.0) / k else (num_a - s2) / den
        num_b = 2.0 * j - 4 * j * alpha2 + 2 * alpha2
        b = (num_b + s2) / den if (num_b + s2) / den > j / k else (num_b - s2) / den
        abc.append((a, b, (a + b) / 2.0))
    a_plus = 1.0 + 1.0 / (k * (math.sqrt(alpha3) - 1.0))
    abc.append((a_plus if a_plus > 0.0 else 1.0 + 1.0 / (-k * (math.sqrt(alpha3) - 1.0)), 1.0, 1.0))
    return _triangles_matrix(k, abc)


def _inner_triangle(k: int, j: int, left: float, right: float) -> tuple[float, float, float]:
    """The triangle ``(a, b, c)`` of inner class ``j`` (1-based) with mode at the middle of its interval and
    mass ``left`` below and ``right`` above the interval (Vargas et al., 2023)."""
    h = 1.0 / (2 * k)
    c = (2 * j - 1) / (2 * k)

    def v_of(u: float) -> float:  # b - c from the right tail: (v - h)^2 = right (u + v) v, v >= h
        if right == 0.0:
            return h
        s = 2 * h + right * u
        return (s + math.sqrt(s * s - 4 * (1 - right) * h * h)) / (2 * (1 - right))

    def g(u: float) -> float:  # the left tail's equation in u = c - a, u >= h
        return (u - h) ** 2 - left * (u + v_of(u)) * u

    if left == 0.0:
        u = h
    else:
        lo, hi = h, 2 * h
        while g(hi) < 0.0:
            lo, hi = hi, hi * 2
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if g(mid) < 0.0:
                lo = mid
            else:
                hi = mid
            if hi - lo <= 1e-17 * hi:
                break
        u = 0.5 * (lo + hi)
    return c - u, c + v_of(u), c


def _general_triangular_matrix(k: int, alphas: tuple[float, ...]) -> list[list[float]]:
    abc = [(0.0, 1.0 / ((1.0 - math.sqrt(alphas[2])) * k), 0.0)]
    abc += [_inner_triangle(k, j, alphas[2 * j - 1], alphas[2 * j]) for j in range(2, k)]
    abc.append((1.0 - 1.0 / (k * (1.0 - math.sqrt(alphas[2 * k - 1]))), 1.0, 1.0))
    return _triangles_matrix(k, abc)


def _geometric_matrix(k: int, alphas: tuple[tuple[float, float, float], ...], asymmetric: bool) -> list[list[float]]:
    """Geometric soft labels of Haas & Hüllermeier (2023): ``1 - alpha`` on the class, ``alpha`` spread
    geometrically over the others (split ``F_l : F_r`` between the two sides when asymmetric)."""
    out = []
    for y, (a, f_l, f_r) in enumerate(alphas):
        if a == 0.0:
            out.append([1.0 if i == y else 0.0 for i in range(k)])
            continue
        if asymmetric:
            if y == k - 1:
                f_l, f_r = 1.0, 0.0
            elif y == 0:
                f_l, f_r = 0.0, 1.0
            g_l = sum(a ** (y - i) * (1 - a) for i in range(y))
            g_r = sum(a ** (i - y) * (1 - a) for i in range(y + 1, k))
            row = []
            for i in range(k):
                if i == y:
                    row.append(1 - a)
                elif i < y:
                    row.append(f_l * a * a ** (y - i) * (1 - a) / g_l if f_l > 0 else 0.0)
                else:
                    row.append(f_r * a * a ** (i - y) * (1 - a) / g_r if f_r > 0 else 0.0)
        else:
            g = sum(a ** abs(y - i) * (1 - a) for i in range(k) if i != y)
            row = [1 - a if i == y else a * a ** abs(y - i) * (1 - a) / g for i in range(k)]
        out.append(row)
    return out


_MATRICES: dict[tuple[Any, ...], _Matrix] = {}


@constant_result
def _soft_label_matrix(key: tuple[Any, ...]) -> _Matrix:
    """The ``(K, K)`` soft-label matrix (row ``y``: the target distribution of class ``y``) of a resolved
    ``key = (distribution, K, *params)`` from :func:`_resolve`, cached (float64 Python floats)."""
    cached = _MATRICES.get(key)
    if cached is not None:
        return cached
    dist, k = key[0], key[1]
    if dist == "beta":
        rows = _beta_matrix(k, key[2])
    elif dist == "binomial":
        rows = _binomial_matrix(k)
    elif dist == "poisson":
        rows = _poisson_matrix(k)
    elif dist == "exponential":
        rows = _exponential_matrix(k, key[2], key[3])
    elif dist == "triangular":
        rows = _triangular_matrix(k, key[2])
    elif dist == "general_triangular":
        rows = _general_triangular_matrix(k, key[2])
    else:
        rows = _geometric_matrix(k, key[2], key[3])
    out = tuple(tuple(float(v) for v in r) for r in rows)
    _MATRICES[key] = out
    return out


def _check_params(distribution: Any, params: dict[str, Any]) -> None:
    """``distribution`` is known and ``params`` are its options (names only)."""
    check_choice(distribution, "distribution", DISTRIBUTIONS)
    valid = _DIST_PARAMS[distribution]
    unknown = sorted(set(params) - set(valid))
    if unknown:
        names = ", ".join(sorted(valid)) or "none"
        hint = did_you_mean(unknown[0], valid, "options") if valid else "it takes no options"
        raise TypeError(
            f"unimodal_ce_loss(distribution={distribution!r}) got unknown option(s) {', '.join(unknown)}; "
            f"its options are: {names} ({hint})"
        )


def _real_sequence(value: Any, name: str, length: int) -> list[float]:
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise TypeError(f"`{name}` must be a sequence of {length} real numbers, got {type(value).__name__}")
    vals = list(value)
    if len(vals) != length:
        raise ValueError(f"`{name}` must have {length} entries, got {len(vals)}")
    out = []
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, Real):
            raise TypeError(f"`{name}` must hold real numbers, got {v!r}")
        out.append(float(v))
    return out


def _concrete(key: Any) -> Any:
    """``key`` with every number a plain Python number: under ``torch.compile(dynamic=True)`` float options
    and sizes are symbolic, and the soft-label matrix (a constant of the traced graph) needs their values
    (``float.hex`` specializes a symbolic float on its value)."""
    if isinstance(key, tuple):
        return tuple(_concrete(v) for v in key)
    if isinstance(key, (bool, str)) or key is None:
        return key
    value = float.fromhex(float(key).hex())
    return int(value) if isinstance(key, (int, torch.SymInt)) else value


def _resolve(distribution: str, k: int, params: dict[str, Any]) -> tuple[Any, ...]:
    """The hashable key of the soft-label matrix of ``distribution`` for ``K = k`` classes (values checked)."""
    return _concrete(_resolve_key(distribution, k, params))


def _resolve_key(distribution: str, k: int, params: dict[str, Any]) -> tuple[Any, ...]:
    _check_params(distribution, params)
    opts = {**_DIST_PARAMS[distribution], **params}
    if distribution == "beta":
        ps = opts["params_set"]
        if isinstance(ps, str):
            if ps != "standard":
                raise ValueError(f"`params_set` must be 'standard' or a dict {{K: [[p, q, a], ...]}}, got {ps!r}")
            if k not in _BETA_STANDARD:
                raise ValueError(
                    f"`params_set='standard'` has beta parameters for K in 3..14, got K = {k}; "
                    "pass a dict {K: [[p, q, a], ...]}"
                )
            return ("beta", k, _BETA_STANDARD[k])
        if not isinstance(ps, dict):
            raise TypeError(
                f"`params_set` must be 'standard' or a dict {{K: [[p, q, a], ...]}}, got {type(ps).__name__}"
            )
        if k not in ps:
            raise ValueError(f"`params_set` has no entry for K = {k} classes (keys: {sorted(ps)})")
        rows = ps[k]
        if len(rows) != k:
            raise ValueError(f"`params_set[{k}]` must have {k} rows [p, q, a], got {len(rows)}")
        triples = []
        for r in rows:
            p, q, a = _real_sequence(r, f"params_set[{k}] rows", 3)
            if not (p > 0 and q > 0 and a > 0 and math.isfinite(p + q + a)):
                raise ValueError(f"`params_set[{k}]`: p, q and a must be finite and > 0, got {list(r)}")
            triples.append((p, q, a))
        return ("beta", k, tuple(triples))
    if distribution in ("binomial", "poisson"):
        return (distribution, k)
    if distribution == "exponential":
        return ("exponential", k, check_positive(opts["p"], "p"), check_positive(opts["tau"], "tau"))
    if distribution == "triangular":
        return ("triangular", k, _check_unit(opts["alpha2"], "alpha2", upper=0.5, closed=False))
    if distribution == "general_triangular":
        if opts["alphas"] is None:
            raise TypeError("unimodal_ce_loss(distribution='general_triangular') needs `alphas` (2K numbers)")
        al = _real_sequence(opts["alphas"], "alphas", 2 * k)
        for j in range(1, k + 1):
            lo = al[2 * j - 1] if j > 1 else 0.0
            hi = al[2 * j] if j < k else 0.0
            if not (0.0 <= lo < 1.0 and 0.0 <= hi < 1.0 and lo + hi < 1.0):
                raise ValueError(
                    f"`alphas`: the masses below and above class {j - 1} must be in [0, 1) with a sum < 1, "
                    f"got {lo} and {hi}"
                )
        return ("general_triangular", k, tuple(al))
    # geometric
    al = opts["alphas"]
    if isinstance(al, Real) and not isinstance(al, bool):
        a = _check_unit(al, "alphas", closed=False)
        return ("geometric", k, tuple((a, 0.5, 0.5) for _ in range(k)), False)
    if isinstance(al, (str, bytes)) or not isinstance(al, Sequence) or len(al) != k:
        raise ValueError(
            f"`alphas` must be a float in [0, 1), a list of {k} floats or a list of {k} tuples "
            f"(alpha, F_l, F_r); got {al!r}"
        )
    if all(isinstance(v, tuple) for v in al):
        rows = []
        for v in al:
            a, f_l, f_r = _real_sequence(v, "alphas", 3)
            _check_unit(a, "alphas", closed=False)
            if not (0.0 <= f_l <= 1.0 and 0.0 <= f_r <= 1.0 and f_l + f_r == 1.0):
                raise ValueError(f"`alphas`: F_l and F_r must be in [0, 1] and sum to 1, got {v!r}")
            rows.append((a, f_l, f_r))
        return ("geometric", k, tuple(rows), True)
    return ("geometric", k, tuple((_check_unit(v, "alphas", closed=False), 0.5, 0.5) for v in al), False)


# --------------------------------------------------------------------------------------------------
# unimodal soft-label cross-entropies
# --------------------------------------------------------------------------------------------------
def _soft_ce(z: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-sample cross-entropy :math:`-\\sum_k t_k \\log \\mathrm{softmax}(z)_k` (rows)."""
    return -(target * torch.log_softmax(z, dim=-1)).sum(-1)


@batch_loss("logits", "targets")
def unimodal_ce_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    distribution: str,
    eta: float = 1.0,
    reduction: Reduction = "mean",
    **params: Any,
) -> torch.Tensor:
    r"""Cross-entropy with unimodal soft labels, as dlordinal's ``<Distribution>CrossEntropyLoss``.

    Each class :math:`y` has a target distribution :math:`M_{y,\cdot}` over the ``K`` classes (a row of
    the soft-label matrix :math:`M`), mixed with the one-hot label by ``eta``:
    :math:`t = (1-\eta)\,e_y + \eta\,M_{y,\cdot}`, and the loss is :math:`-\sum_k t_k \log \mathrm{softmax}(z)_k`.
    The rows of :math:`M` per ``distribution`` and its options (``**params``):

    * ``"beta"`` (Vargas et al., Neurocomputing 2022): the mass of :math:`[0, 1]`'s ``K`` equal intervals
      under :math:`\mathrm{Beta}(p, q)` of :math:`x^a`; ``params_set="standard"`` (their parameters,
      K = 3..14) or a dict ``{K: [[p, q, a], ...]}``;
    * ``"binomial"`` (Liu et al., 2020): :math:`\mathrm{Bin}(k; K-1, \pi_y)`, :math:`\pi_y` evenly spaced
      in :math:`[0.1, 0.9]`;
    * ``"poisson"`` (Liu et al., 2020): the softmax over :math:`k` of the Poisson pmf
      :math:`\mathrm{Pois}(k; y + 1)`;
    * ``"exponential"`` (Vargas et al., 2022): :math:`\mathrm{softmax}_k(-|k-y|^p/\tau)`; ``p=1.0``, ``tau=1.0``;
    * ``"triangular"`` (Vargas et al., 2023): interval masses of a triangular distribution leaving
      ``alpha2`` (``0.05``, in :math:`[0, 0.5)`) on each neighbour;
    * ``"general_triangular"`` (Vargas et al., 2023): ``alphas`` (2K numbers, required): class
      :math:`j` (0-based) leaves ``alphas[2j+1]`` below and ``alphas[2j+2]`` above its interval (the
      first entry is unused, as in the reference);
    * ``"geometric"`` (Haas & Hüllermeier, 2023): :math:`1 - \alpha` on the class and :math:`\alpha` over
      the others, decaying geometrically; ``alphas=0.1``: a float in :math:`[0, 1)`, ``K`` floats
      (one per class) or ``K`` tuples ``(alpha, F_l, F_r)`` splitting :math:`\alpha` between the sides.

    The matrices are computed in float64 (without scipy) and cast to the compute dtype: float64
    logits give float64 targets (the reference casts them to float32 and refuses float64 logits).

    Shape:
        - logits: :math:`(*, K)`, floating, :math:`K \ge 2`; targets: :math:`(*)`, integer in ``0..K-1``.
        - output: scalar, or :math:`(*)` for ``reduction="none"``; the compute dtype.

    Example:
        >>> import torch
        >>> from rankwise.losses import unimodal_ce_loss
        >>> logits = torch.tensor([[2.0, 0.5, -1.0, -2.0], [0.0, 0.3, 1.2, 0.1]])
        >>> unimodal_ce_loss(logits, torch.tensor([0, 2]), distribution="binomial")
        tensor(0.9934)
        >>> unimodal_ce_loss(logits, torch.tensor([0, 2]), distribution="geometric", alphas=0.2, eta=0.5)
        tensor(0.6265)
    """
    k, z, y = _check_inputs(logits, targets)
    e = _check_unit(eta, "eta")
    check_choice(reduction, "reduction", _REDUCTIONS)
    key = _resolve(distribution, k, params)
    dt = common_compute_dtype(logits)
    m = torch.tensor(_soft_label_matrix(key), dtype=dt, device=z.device)
    t = e * m[y]
    if e != 1.0:
        t = t + (1.0 - e) * F.one_hot(y, k).to(dt)
    return _reduce(_soft_ce(z.to(dt), t), reduction, tuple(targets.shape))


class UnimodalCELoss(FunctionModule):
    """Module twin of :func:`unimodal_ce_loss` (the distribution's options as keyword arguments)."""

    _function = staticmethod(unimodal_ce_loss)
    _options = ("distribution", "eta", "reduction")
    _kwargs = "params"
    _shown = ("distribution!r", "eta", "reduction!r", "**")

    def __init__(self, *, distribution: str, eta: float = 1.0, reduction: Reduction = "mean", **params: Any) -> None:
        super().__init__()
        _check_params(distribution, params)
        self.distribution = distribution
        self.eta = _check_unit(eta, "eta")
        self.reduction = check_choice(reduction, "reduction", _REDUCTIONS)
        self.params = dict(params)


# --------------------------------------------------------------------------------------------------
# SORD
# --------------------------------------------------------------------------------------------------
def _prox_matrix(train_targets: torch.Tensor, k: int, dt: torch.dtype) -> torch.Tensor:
    """The proximity matrix of dlordinal's SORD: ``-log(n(l1, l2) / N)`` with ``n`` half the count of
    ``l1`` plus the counts of the classes from ``l1`` (excluded) to ``l2`` (included)."""
    t = train_targets.reshape(-1)
    counts = torch.zeros(k, dtype=dt, device=t.device).index_add_(0, t, torch.ones(t.shape, dtype=dt, device=t.device))
    _assert_on_device(
        (counts == 0).any(), f"`train_targets` must hold every class 0..{k - 1} (SORD's proximities need them)"
    )
    cum = counts.cumsum(0)
    up = cum.unsqueeze(0) - cum.unsqueeze(1)  # [l1, l2] = C[l2] - C[l1]
    down = -up - counts.unsqueeze(1) + counts.unsqueeze(0)  # C[l1 - 1] - C[l2 - 1]
    idx = torch.arange(k, device=t.device)
    between = torch.where(idx.unsqueeze(0) >= idx.unsqueeze(1), up, down)
    return -torch.log((counts.unsqueeze(1) / 2 + between) / counts.sum())


@batch_loss("logits", "targets", "weight", "train_targets")
def sord_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    alpha: float = 1.0,
    prox: bool = False,
    ftype: str = "max",
    train_targets: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    reduction: Reduction = "mean",
) -> torch.Tensor:
    r"""Soft ordinal labels (Díaz & Marathe, CVPR 2019), as ``dlordinal.losses.SORDLoss``.

    The target of class :math:`y` is :math:`t = \mathrm{softmax}_k(-\alpha\,\phi(y, k))` and the loss the
    cross-entropy :math:`-\sum_k t_k \log \mathrm{softmax}(z)_k`, times ``weight[y]`` when given (not
    normalized). ``prox=False``: :math:`\phi = |k - y|`. ``prox=True`` uses the proximities of the
    training labels ``train_targets`` (integer classes of the training set, each class present):
    :math:`P_{l_1 l_2} = -\log(n_{l_1 l_2}/N)`, :math:`n_{l_1 l_2}` half the count of :math:`l_1` plus the
    counts of the classes after :math:`l_1` up to :math:`l_2` (before, going down), and ``ftype``
    picks :math:`\phi(y, \cdot)` from row :math:`y`: ``"max"`` :math:`\max P - P_y`, ``"log"``
    :math:`-\log P_y`, ``"division"`` :math:`1/P_y`, and their ``"norm_*"`` forms on :math:`P` with each
    column divided by its sum. ``alpha=1`` and ``prox=False`` is the paper's
    :math:`\mathrm{softmax}(-|k-y|)`.

    Shape:
        - logits: :math:`(*, K)`, floating; targets: :math:`(*)`, integer in ``0..K-1``.
        - train_targets: ``None`` or any shape, integer in ``0..K-1`` (needed when ``prox=True``).
        - weight: ``None`` or :math:`(K,)`.
        - output: scalar, or :math:`(*)` for ``reduction="none"``; the compute dtype.

    Example:
        >>> import torch
        >>> from rankwise.losses import sord_loss
        >>> logits = torch.tensor([[2.0, 0.5, -1.0], [0.0, 0.3, 1.2]])
        >>> sord_loss(logits, torch.tensor([0, 2]))
        tensor(0.8710)
        >>> sord_loss(logits, torch.tensor([0, 2]), prox=True, train_targets=torch.tensor([0, 0, 1, 2, 2, 2]))
        tensor(1.0284)
    """
    k, z, y = _check_inputs(logits, targets)
    a = check_positive(alpha, "alpha", allow_zero=True)
    check_bool(prox, "prox")
    check_choice(ftype, "ftype", _FTYPES)
    check_choice(reduction, "reduction", _REDUCTIONS)
    w = _check_weight(weight, k, logits)
    if train_targets is not None:
        _check_classes(train_targets, k, "train_targets", None)
        check_same_device("logits", logits, ("train_targets", train_targets))
    dt = common_compute_dtype(logits, w)
    if not prox:
        phi = (_classes(k, dt, z.device) - y.to(dt).unsqueeze(-1)).abs()
    else:
        if train_targets is None:
            raise ValueError("`train_targets` (the training set's classes) is needed when `prox=True`")
        pm = _prox_matrix(train_targets, k, torch.float64 if dt == torch.float64 else torch.float32)
        if ftype.startswith("norm_"):
            pm = pm / pm.abs().sum(0, keepdim=True).clamp_min(1e-12)
        base = ftype.removeprefix("norm_")
        rows = pm[y]
        if base == "max":
            phi = pm.max() - rows
        elif base == "log":
            phi = -torch.log(rows)
        else:
            phi = 1.0 / rows
        phi = phi.to(dt)
    t = torch.softmax(-a * phi, dim=-1)
    loss = _soft_ce(z.to(dt), t)
    if w is not None:
        loss = loss * w.to(dt)[y]
    return _reduce(loss, reduction, tuple(targets.shape))


class SORDLoss(FunctionModule):
    """Module twin of :func:`sord_loss` (``train_targets`` is kept as given)."""

    _function = staticmethod(sord_loss)
    _options = ("alpha", "prox", "ftype", "train_targets", "weight", "reduction")
    _shown = ("alpha", "prox", "ftype!r", "reduction!r")

    def __init__(
        self,
        *,
        alpha: float = 1.0,
        prox: bool = False,
        ftype: str = "max",
        train_targets: torch.Tensor | None = None,
        weight: torch.Tensor | None = None,
        reduction: Reduction = "mean",
    ) -> None:
        super().__init__()
        self.alpha = check_positive(alpha, "alpha", allow_zero=True)
        self.prox = check_bool(prox, "prox")
        self.ftype = check_choice(ftype, "ftype", _FTYPES)
        if prox and train_targets is None:
            raise ValueError("`train_targets` (the training set's classes) is needed when `prox=True`")
        self._tensor_option("train_targets", train_targets)
        self._tensor_option("weight", weight)
        self.reduction = check_choice(reduction, "reduction", _REDUCTIONS)


# --------------------------------------------------------------------------------------------------
# squared EMD
# --------------------------------------------------------------------------------------------------
@batch_loss("logits", "targets")
def emd_loss(logits: torch.Tensor, targets: torch.Tensor, *, reduction: Reduction = "mean") -> torch.Tensor:
    r"""Squared Earth mover's distance (Hou et al., 2016), as ``dlordinal.losses.EMDLoss``.

    :math:`\sum_{k=0}^{K-1} \big(\sum_{i \le k} p_i - [k \ge y]\big)^2` with :math:`p = \mathrm{softmax}(z)`:
    the squared distance of the predicted and the true cumulative distributions (the ranked
    probability score up to its normalization).

    Shape:
        - logits: :math:`(*, K)`, floating; targets: :math:`(*)`, integer in ``0..K-1``.
        - output: scalar, or :math:`(*)` for ``reduction="none"``; the compute dtype.

    Example:
        >>> import torch
        >>> from rankwise.losses import emd_loss
        >>> emd_loss(torch.tensor([[2.0, 0.5, -1.0], [0.0, 0.3, 1.2]]), torch.tensor([0, 2]))
        tensor(0.1252)
    """
    k, z, y = _check_inputs(logits, targets)
    check_choice(reduction, "reduction", _REDUCTIONS)
    dt = common_compute_dtype(logits)
    cdf = torch.softmax(z.to(dt), dim=-1).cumsum(-1)
    true_cdf = (torch.arange(k, device=z.device) >= y.unsqueeze(-1)).to(dt)
    return _reduce((cdf - true_cdf).square().sum(-1), reduction, tuple(targets.shape))


class EMDLoss(FunctionModule):
    """Module twin of :func:`emd_loss`."""

    _function = staticmethod(emd_loss)
    _options = ("reduction",)
    _shown = ("reduction!r",)

    def __init__(self, *, reduction: Reduction = "mean") -> None:
        super().__init__()
        self.reduction = check_choice(reduction, "reduction", _REDUCTIONS)


# --------------------------------------------------------------------------------------------------
# weighted kappa
# --------------------------------------------------------------------------------------------------
@batch_loss("logits", "targets", "weight")
def qwk_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    penalization: str = "quadratic",
    epsilon: float = 1e-10,
    weight: torch.Tensor | None = None,
    use_logarithm: bool = False,
) -> torch.Tensor:
    r"""Weighted kappa loss (de la Torre et al., 2018; Vargas et al., 2020), as ``dlordinal.losses.WKLoss``
    with ``use_logits=True``.

    With :math:`p = \mathrm{softmax}(z)` over the ``N`` samples of the batch, one-hot labels :math:`q`
    and the penalties :math:`\omega_{ij} = |i-j|^r / (K-1)^r` (``r = 1`` ``"linear"``, ``2``
    ``"quadratic"``), times ``weight[j]`` of the true class :math:`j` when given,

    .. math::
        \mathcal{L} = \frac{\sum_{ij} \omega_{ij} \sum_n p_{ni} q_{nj}}
        {\tfrac1N \sum_{ij} \omega_{ij} \big(\sum_n p_{ni}\big)\big(\sum_n q_{nj}\big) + \epsilon}
        \in [0, 2],

    one minus the (soft) weighted Cohen's kappa; ``use_logarithm=True`` gives
    :math:`\log(\mathcal{L} + \epsilon)` (de la Torre et al.'s form). A batch-level loss: one value for
    all the samples (leading dims flattened); an empty batch gives 0.

    Shape:
        - logits: :math:`(*, K)`, floating; targets: :math:`(*)`, integer in ``0..K-1``.
        - weight: ``None`` or :math:`(K,)`.
        - output: scalar; the compute dtype.

    Example:
        >>> import torch
        >>> from rankwise.losses import qwk_loss
        >>> logits = torch.tensor([[2.0, 0.5, -1.0], [0.0, 0.3, 1.2], [0.1, 1.0, 0.1]])
        >>> qwk_loss(logits, torch.tensor([0, 2, 1]))
        tensor(0.4272)
    """
    k, z, y = _check_inputs(logits, targets)
    check_choice(penalization, "penalization", ("linear", "quadratic"))
    eps = check_positive(epsilon, "epsilon", allow_zero=True)
    check_bool(use_logarithm, "use_logarithm")
    w = _check_weight(weight, k, logits)
    dt = common_compute_dtype(logits, w)
    with autocast_off(z.device):
        p = torch.softmax(z.to(dt), dim=-1)
        q = F.one_hot(y, k).to(dt)
        cls = _classes(k, dt, z.device)
        om = (cls.unsqueeze(1) - cls.unsqueeze(0)).abs() / (k - 1)
        if penalization == "quadratic":
            om = om.square()
        if w is not None:
            om = om * w.to(dt).unsqueeze(0)
        nom = (om * (p.transpose(0, 1) @ q)).sum()
        expected = p.sum(0).unsqueeze(1) * q.sum(0).unsqueeze(0)
        denom = (om * expected).sum() / max(z.shape[0], 1)
        ret = nom / (denom + eps)
        if use_logarithm:
            ret = torch.log(ret + eps)
    return ret


class QWKLoss(FunctionModule):
    """Module twin of :func:`qwk_loss`."""

    _function = staticmethod(qwk_loss)
    _options = ("penalization", "epsilon", "weight", "use_logarithm")
    _shown = ("penalization!r", "epsilon", "use_logarithm")

    def __init__(
        self,
        *,
        penalization: str = "quadratic",
        epsilon: float = 1e-10,
        weight: torch.Tensor | None = None,
        use_logarithm: bool = False,
    ) -> None:
        super().__init__()
        self.penalization = check_choice(penalization, "penalization", ("linear", "quadratic"))
        self.epsilon = check_positive(epsilon, "epsilon", allow_zero=True)
        self._tensor_option("weight", weight)
        self.use_logarithm = check_bool(use_logarithm, "use_logarithm")


# --------------------------------------------------------------------------------------------------
# SLACE
# --------------------------------------------------------------------------------------------------
@batch_loss("logits", "targets", "weight")
def slace_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    alpha: float = 1.0,
    weight: torch.Tensor | None = None,
    reduction: Reduction = "mean",
) -> torch.Tensor:
    r"""Soft labels accumulating cross-entropy (Nachmani et al., AAAI 2025), as ``dlordinal.losses.SLACELoss``.

    With :math:`p = \mathrm{softmax}(z)`, the SORD target :math:`t = \mathrm{softmax}_k(-\alpha|k - y|)` and
    the accumulated probability :math:`A_k = \sum_{j:\,|j-y| \le |k-y|} p_j` (the mass of the classes at
    least as close to :math:`y` as :math:`k`),

    .. math:: \ell = -\sum_k t_k \log(A_k + 10^{-9}),

    times ``weight[y]`` when given (not normalized; the :math:`10^{-9}` is the reference's).

    Shape:
        - logits: :math:`(*, K)`, floating; targets: :math:`(*)`, integer in ``0..K-1``.
        - weight: ``None`` or :math:`(K,)`.
        - output: scalar, or :math:`(*)` for ``reduction="none"``; the compute dtype.

    Example:
        >>> import torch
        >>> from rankwise.losses import slace_loss
        >>> slace_loss(torch.tensor([[2.0, 0.5, -1.0], [0.0, 0.3, 1.2]]), torch.tensor([0, 2]))
        tensor(0.2869)
    """
    k, z, y = _check_inputs(logits, targets)
    a = check_positive(alpha, "alpha", allow_zero=True)
    check_choice(reduction, "reduction", _REDUCTIONS)
    w = _check_weight(weight, k, logits)
    dt = common_compute_dtype(logits, w)
    p = torch.softmax(z.to(dt), dim=-1)
    d = (_classes(k, dt, z.device) - y.to(dt).unsqueeze(-1)).abs()  # (N, K)
    closer = d.unsqueeze(-2) <= d.unsqueeze(-1)  # [n, k, j]: |j - y| <= |k - y|
    acc = (p.unsqueeze(-2) * closer).sum(-1)
    t = torch.softmax(-a * d, dim=-1)
    loss = -(t * torch.log(acc + 1e-9)).sum(-1)
    if w is not None:
        loss = loss * w.to(dt)[y]
    return _reduce(loss, reduction, tuple(targets.shape))


class SLACELoss(FunctionModule):
    """Module twin of :func:`slace_loss`."""

    _function = staticmethod(slace_loss)
    _options = ("alpha", "weight", "reduction")
    _shown = ("alpha", "reduction!r")

    def __init__(
        self, *, alpha: float = 1.0, weight: torch.Tensor | None = None, reduction: Reduction = "mean"
    ) -> None:
        super().__init__()
        self.alpha = check_positive(alpha, "alpha", allow_zero=True)
        self._tensor_option("weight", weight)
        self.reduction = check_choice(reduction, "reduction", _REDUCTIONS)


# --------------------------------------------------------------------------------------------------
# mean-variance and DLDL-v2
# --------------------------------------------------------------------------------------------------
@batch_loss("logits", "targets")
def mean_variance_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    lambda_mean: float = 0.2,
    lambda_variance: float = 0.05,
    reduction: Reduction = "mean",
) -> torch.Tensor:
    r"""Mean-variance loss (Pan et al., CVPR 2018): cross-entropy plus the softmax's mean and variance.

    With :math:`p = \mathrm{softmax}(z)` over the classes :math:`0..K-1`, its mean
    :math:`m = \sum_k k\,p_k` and variance :math:`v = \sum_k p_k (k - m)^2`, a sample of class :math:`y` costs

    .. math:: -\log p_y + \tfrac{\lambda_1}{2} (m - y)^2 + \lambda_2\, v

    (:math:`\lambda_1` = ``lambda_mean``, :math:`\lambda_2` = ``lambda_variance``); the mean over the batch is
    the paper's :math:`L_s + \lambda_1 L_m + \lambda_2 L_v`. Predict with :func:`expected_class`.

    Shape:
        - logits: :math:`(*, K)`, floating; targets: :math:`(*)`, integer in ``0..K-1``.
        - output: scalar, or :math:`(*)` for ``reduction="none"``; the compute dtype.

    Example:
        >>> import torch
        >>> from rankwise.losses import mean_variance_loss
        >>> mean_variance_loss(torch.tensor([[2.0, 0.5, -1.0], [0.0, 0.3, 1.2]]), torch.tensor([0, 2]))
        tensor(0.4305)
    """
    k, z, y = _check_inputs(logits, targets)
    l1 = check_positive(lambda_mean, "lambda_mean", allow_zero=True)
    l2 = check_positive(lambda_variance, "lambda_variance", allow_zero=True)
    check_choice(reduction, "reduction", _REDUCTIONS)
    dt = common_compute_dtype(logits)
    logp = torch.log_softmax(z.to(dt), dim=-1)
    p = logp.exp()
    cls = _classes(k, dt, z.device)
    mean = (p * cls).sum(-1)
    var = (p * (cls - mean.unsqueeze(-1)).square()).sum(-1)
    ce = -logp.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    loss = ce + (l1 / 2) * (mean - y.to(dt)).square() + l2 * var
    return _reduce(loss, reduction, tuple(targets.shape))


class MeanVarianceLoss(FunctionModule):
    """Module twin of :func:`mean_variance_loss`."""

    _function = staticmethod(mean_variance_loss)
    _options = ("lambda_mean", "lambda_variance", "reduction")
    _shown = ("lambda_mean", "lambda_variance", "reduction!r")

    def __init__(
        self, *, lambda_mean: float = 0.2, lambda_variance: float = 0.05, reduction: Reduction = "mean"
    ) -> None:
        super().__init__()
        self.lambda_mean = check_positive(lambda_mean, "lambda_mean", allow_zero=True)
        self.lambda_variance = check_positive(lambda_variance, "lambda_variance", allow_zero=True)
        self.reduction = check_choice(reduction, "reduction", _REDUCTIONS)


@batch_loss("logits", "targets")
def dldl_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    sigma: float = 2.0,
    lambda_l1: float = 1.0,
    reduction: Reduction = "mean",
) -> torch.Tensor:
    r"""DLDL-v2 (Gao et al., IJCAI 2018): label-distribution KL divergence plus the expectation's L1 error.

    The target of class :math:`y` is the discretized Gaussian :math:`t_k \propto \exp(-(k-y)^2 / 2\sigma^2)`
    over the classes :math:`0..K-1` (normalized), and with :math:`p = \mathrm{softmax}(z)` and its
    expectation :math:`\hat y = \sum_k k\,p_k` a sample costs

    .. math:: \sum_k t_k \log\frac{t_k}{p_k} + \lambda\,|\hat y - y|

    (:math:`\lambda` = ``lambda_l1``), the paper's per-sample loss; ``lambda_l1=0`` is DLDL (Gao et al.,
    TIP 2017). The KL term is the cross-entropy to :math:`t` minus the entropy of :math:`t` (the same
    gradients). The authors' Lua Torch7 code averages the KL term over the ``N K`` elements of the
    batch: its loss is this one with ``lambda_l1`` times ``K``, divided by ``K``. Predict with
    :func:`expected_class`.

    Shape:
        - logits: :math:`(*, K)`, floating; targets: :math:`(*)`, integer in ``0..K-1``.
        - output: scalar, or :math:`(*)` for ``reduction="none"``; the compute dtype.

    Example:
        >>> import torch
        >>> from rankwise.losses import dldl_loss
        >>> dldl_loss(torch.tensor([[2.0, 0.5, -1.0], [0.0, 0.3, 1.2]]), torch.tensor([0, 2]))
        tensor(0.6696)
    """
    k, z, y = _check_inputs(logits, targets)
    s = check_positive(sigma, "sigma")
    lam = check_positive(lambda_l1, "lambda_l1", allow_zero=True)
    check_choice(reduction, "reduction", _REDUCTIONS)
    dt = common_compute_dtype(logits)
    cls = _classes(k, dt, z.device)
    t = torch.softmax(-(cls - y.to(dt).unsqueeze(-1)).square() / (2 * s * s), dim=-1)
    logp = torch.log_softmax(z.to(dt), dim=-1)
    kl = (torch.special.xlogy(t, t) - t * logp).sum(-1)
    loss = kl + lam * ((logp.exp() * cls).sum(-1) - y.to(dt)).abs()
    return _reduce(loss, reduction, tuple(targets.shape))


class DLDLLoss(FunctionModule):
    """Module twin of :func:`dldl_loss`."""

    _function = staticmethod(dldl_loss)
    _options = ("sigma", "lambda_l1", "reduction")
    _shown = ("sigma", "lambda_l1", "reduction!r")

    def __init__(self, *, sigma: float = 2.0, lambda_l1: float = 1.0, reduction: Reduction = "mean") -> None:
        super().__init__()
        self.sigma = check_positive(sigma, "sigma")
        self.lambda_l1 = check_positive(lambda_l1, "lambda_l1", allow_zero=True)
        self.reduction = check_choice(reduction, "reduction", _REDUCTIONS)


# --------------------------------------------------------------------------------------------------
# registration
# --------------------------------------------------------------------------------------------------
_INPUTS = {"logits": "logits", "targets": "classes"}
_ARGMAX = OrdinalHead("classes", argmax_class)
_EXPECTED = OrdinalHead("classes", expected_class)

register_loss("cdw_ce", module=CDWCELoss, inputs=_INPUTS, takes="logits", ordinal=_ARGMAX)(cdw_ce_loss)
register_loss(
    "unimodal_ce",
    module=UnimodalCELoss,
    inputs=_INPUTS,
    takes="logits",
    ordinal=_ARGMAX,
    description="cross-entropy with unimodal soft labels (option `distribution`: " + ", ".join(DISTRIBUTIONS) + ")",
)(unimodal_ce_loss)
register_loss(
    "sord",
    module=SORDLoss,
    inputs=_INPUTS,
    takes="logits",
    ordinal=OrdinalHead("classes", argmax_class, train_classes="train_targets"),
)(sord_loss)
register_loss("emd", module=EMDLoss, inputs=_INPUTS, takes="logits", ordinal=_ARGMAX)(emd_loss)
register_loss("qwk", module=QWKLoss, inputs=_INPUTS, takes="logits", ordinal=_ARGMAX)(qwk_loss)
register_loss("slace", module=SLACELoss, inputs=_INPUTS, takes="logits", ordinal=_ARGMAX)(slace_loss)
register_loss("mean_variance", module=MeanVarianceLoss, inputs=_INPUTS, takes="logits", ordinal=_EXPECTED)(
    mean_variance_loss
)
register_loss("dldl", module=DLDLLoss, inputs=_INPUTS, takes="logits", ordinal=_EXPECTED)(dldl_loss)
