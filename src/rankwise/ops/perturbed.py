r"""Perturbed optimizers for ranks and top-k (Berthet et al., NeurIPS'20).

For a linear program :math:`y^*(\theta) = \arg\max_{y \in \mathcal C} \langle y, \theta \rangle` (ranks:
:math:`\mathcal C` = the permutahedron of :math:`(1, \dots, n)`, whose maximizer is the vector of
ascending ranks; top-k: :math:`\{y \in [0, 1]^n, \sum y = k\}`, whose maximizer is the indicator
of the k largest entries), the perturbed optimizer is the expectation under noise
:math:`Z` with density :math:`\mu(z) \propto e^{-\nu(z)}`,

.. math::
    y_\varepsilon(\theta) = \mathbb E\bigl[y^*(\theta + \varepsilon Z)\bigr], \qquad
    J_\theta\, y_\varepsilon(\theta) = \frac1\varepsilon\,
        \mathbb E\bigl[y^*(\theta + \varepsilon Z)\, \nabla\nu(Z)^\top\bigr],

both estimated by Monte Carlo with the same ``n_samples`` noise draws (:math:`\nabla\nu(z) = z` for
normal noise, :math:`1 - e^{-z}` for Gumbel noise). The noise is i.i.d. per entry and each row
(the ranked dimension) is one problem, so the vector-Jacobian product of a row uses that row's
samples only. The Fenchel-Young loss has gradient :math:`y_\varepsilon(\theta) - y`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from rankwise._random import randn_from
from rankwise._registry import RelaxationInfo
from rankwise._validation import (
    check_bool,
    check_choice,
    check_dim,
    check_floating_nd,
    check_generator,
    check_int,
    check_k,
    check_positive,
    check_real,
    check_same_device,
    common_compute_dtype,
    compute_dtype,
    nan_slices,
    rank_dtype,
)
from rankwise.ops._registry import register_op
from rankwise.ops.permutation import gumbel_noise
from rankwise.ops.ranking import rank_last
from rankwise.ops.soft import register_soft_method

__all__ = [
    "PerturbedFYLoss",
    "PerturbedRank",
    "PerturbedTopK",
    "perturbed_fy_loss",
    "perturbed_rank",
    "perturbed_topk",
]

Noise = Literal["gumbel", "normal"]
Reduction = Literal["mean", "sum", "none"]
_NOISES = ("gumbel", "normal")
_REDUCTIONS = ("mean", "sum", "none")
Solver = Callable[[torch.Tensor], torch.Tensor]


def _sample(shape: tuple[int, ...], like: torch.Tensor, noise: str, generator: torch.Generator | None) -> torch.Tensor:
    """Noise ``Z`` of the given kind."""
    if noise == "normal":
        return randn_from(shape, generator, device=like.device, dtype=like.dtype)
    return gumbel_noise(shape, like, generator)


def _grad_nu(z: torch.Tensor, noise: str) -> torch.Tensor:
    """``∇ν(Z)``, the negative score of the noise density: ``Z`` (normal), ``1 - exp(-Z)`` (Gumbel)."""
    return z if noise == "normal" else -torch.expm1(-z)


class _Perturbed(torch.autograd.Function):
    """``mean_s y*(θ + σ Z_s)`` with the perturbation Jacobian estimator in backward.

    The solvers' outputs have a constant sum over the row (ranks: n(n+1)/2, top-k: k), so
    ``1ᵀ J = 0`` and ``Jᵀ g = Jᵀ (g - mean(g))``: the estimator is applied to the centred cotangent.
    This changes no expectation (``E[∇ν(Z)] = 0``) and removes the sample noise of the constant
    term ``mean(g) · sum(y)`` (the authors' code applies it to ``g`` itself).
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, theta: torch.Tensor, solver: Solver, sigma: float, z: torch.Tensor, noise: str
    ) -> torch.Tensor:
        y = solver(theta.unsqueeze(0) + sigma * z)  # (S, ..., n)
        ctx.sigma = sigma
        ctx.save_for_backward(y, _grad_nu(z, noise))
        return y.mean(0)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        y, grad_nu = ctx.saved_tensors
        g = g - g.mean(-1, keepdim=True)
        inner = (y * g).sum(-1, keepdim=True)  # <g, y*(θ + σ Z_s)> per sample and row
        return (inner * grad_nu).mean(0) / ctx.sigma, None, None, None, None


def _check_common(sigma: Any, n_samples: Any, noise: Any, descending: Any) -> tuple[float, int]:
    s = check_positive(sigma, "sigma")
    m = check_int(n_samples, "n_samples", low=1)
    check_choice(noise, "noise", _NOISES)
    check_bool(descending, "descending")
    return s, m


def _perturbed(
    x: torch.Tensor, solver: Solver, sigma: float, n_samples: int, noise: str, generator: torch.Generator | None
) -> torch.Tensor:
    """``x`` with the solved dimension last, compute dtype."""
    z = _sample((n_samples, *x.shape), x, noise, generator)
    out: torch.Tensor = _Perturbed.apply(x, solver, sigma, z, noise)
    return out


def _ranks_solver(descending: bool) -> Solver:
    return lambda v: rank_last(v, descending, "ordinal")


def perturbed_rank(
    x: torch.Tensor,
    *,
    sigma: float = 0.1,
    n_samples: int = 100,
    noise: Noise = "gumbel",
    descending: bool = False,
    dim: int = -1,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    r"""Perturbed ranks (Berthet et al., NeurIPS'20): the expected exact ranks of ``x + sigma * Z``.

    .. math::
        r_\sigma(x) = \mathbb E\bigl[\operatorname{rank}(x + \sigma Z)\bigr]
        \approx \frac1S \sum_{s=1}^S \operatorname{rank}(x + \sigma Z_s),

    ranks 1..n, ascending (the largest entry gets ``n``) unless ``descending`` (the largest gets 1).
    The ascending rank vector is the maximizer of :math:`\langle y, x\rangle` over the
    permutahedron, so the backward pass is the paper's perturbation estimator
    :math:`\frac1{\sigma S}\sum_s \langle \bar g, \operatorname{rank}(x + \sigma Z_s)\rangle\, \nabla\nu(Z_s)`,
    an unbiased estimate of the vector-Jacobian product of :math:`r_\sigma` (not the derivative
    of the Monte-Carlo forward, which is piecewise constant). :math:`\bar g = g - \mathrm{mean}(g)`:
    ranks sum to a constant, so centring the cotangent changes no expectation and removes the sample
    noise of that constant (the authors' code uses :math:`g`). Noise: ``"gumbel"`` (standard
    Gumbel, :math:`\nabla\nu(z) = 1 - e^{-z}`; then :math:`\mathbb E[\operatorname{rank}_i] =
    1 + \sum_{j \ne i} \operatorname{sigmoid}((x_i - x_j)/\sigma)` exactly) or ``"normal"``
    (:math:`\nabla\nu(z) = z`), drawn from ``generator`` (on the input's device) or the global RNG;
    equal seeds give equal results. Cost: O(S n log n) time and O(S n) memory per row.

    As ``sigma → 0`` the result tends to ``rankwise.rank(x)`` (ties broken at random, i.e. averaged);
    as ``sigma`` grows every rank tends to :math:`(n + 1) / 2`.

    Shape:
        - x: :math:`(*, n, *)` floating, ranked along ``dim``.
        - output: same shape as ``x``; dtype of ``x``, float32 for float16/bfloat16 (ranks up to n).

    Degenerate inputs: empty → empty; ``n = 1`` → 1; all ties → each rank has mean :math:`(n+1)/2`
    (up to Monte-Carlo error). A NaN or ±inf in a slice makes the slice NaN.

    Example:
        >>> import torch, rankwise
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.tensor([0.3, 2.0, -1.0, 0.35])
        >>> rankwise.perturbed_rank(x, sigma=0.1, n_samples=1000, generator=g)
        tensor([2.3920, 4.0000, 1.0000, 2.6080])
        >>> float(rankwise.perturbed_rank(x, generator=g).sum())  # ranks always sum to n (n + 1) / 2
        10.0
    """
    check_floating_nd(x, "x")
    s, m = _check_common(sigma, n_samples, noise, descending)
    d = check_dim(x, dim)
    gen = check_generator(generator, x)
    xc = x.movedim(d, -1)
    xc = xc.to(compute_dtype(xc.dtype))
    out = nan_slices(_perturbed(xc, _ranks_solver(descending), s, m, noise, gen), xc)
    return out.to(rank_dtype(x.dtype)).movedim(-1, d)


def perturbed_topk(
    x: torch.Tensor,
    k: int,
    *,
    sigma: float = 0.1,
    n_samples: int = 100,
    noise: Noise = "gumbel",
    dim: int = -1,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    r"""Perturbed top-``k`` membership (Berthet et al., NeurIPS'20): the expected top-k indicator of ``x + sigma * Z``.

    The indicator of the ``k`` largest entries maximizes :math:`\langle y, x\rangle` over
    :math:`\{y \in [0,1]^n : \sum_j y_j = k\}`; its expectation under noise is estimated with
    ``n_samples`` draws and differentiated with the perturbation estimator, as in
    :func:`perturbed_rank`. With Gumbel noise this is the probability that an entry is among the
    first ``k`` draws without replacement of a Plackett-Luce model with weights
    :math:`e^{x/\sigma}` (``k = 1``: ``softmax(x / sigma)``). Entries lie in [0, 1] and each row
    sums to ``k`` exactly. A NaN or ±inf in a slice makes the slice NaN.

    Shape:
        - x: :math:`(*, n, *)` floating, scored along ``dim``.
        - output: same shape and dtype as ``x`` (float16/bfloat16 computed in float32).

    Example:
        >>> import torch, rankwise
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.tensor([0.3, 2.0, -1.0, 0.35])
        >>> rankwise.perturbed_topk(x, 2, sigma=0.1, n_samples=1000, generator=g)
        tensor([0.3920, 1.0000, 0.0000, 0.6080])
    """
    check_floating_nd(x, "x")
    s, m = _check_common(sigma, n_samples, noise, False)
    d = check_dim(x, dim)
    kk = check_k(k, x.shape[d], "n =")
    gen = check_generator(generator, x)
    xc = x.movedim(d, -1)
    xc = xc.to(compute_dtype(xc.dtype))

    def solver(v: torch.Tensor) -> torch.Tensor:
        idx = torch.topk(v, kk, dim=-1).indices
        return torch.zeros_like(v).scatter_(-1, idx, 1.0)

    out = nan_slices(_perturbed(xc, solver, s, m, noise, gen), xc)
    return out.to(x.dtype).movedim(-1, d)


def perturbed_fy_loss(
    x: torch.Tensor,
    target_ranks: torch.Tensor,
    *,
    sigma: float = 0.1,
    n_samples: int = 100,
    noise: Noise = "gumbel",
    descending: bool = False,
    dim: int = -1,
    reduction: Reduction = "mean",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    r"""Fenchel-Young loss of perturbed ranks (Berthet et al., NeurIPS'20, sec. 4).

    With :math:`F_\sigma(\theta) = \mathbb E[\max_{y \in \mathcal C}\langle y, \theta + \sigma Z\rangle]`
    (:math:`\mathcal C` = the permutahedron, see :func:`perturbed_rank`), the Fenchel-Young loss
    :math:`L(\theta; y) = F_\sigma(\theta) + \Omega(y) - \langle\theta, y\rangle` has gradient
    :math:`\nabla_\theta L = r_\sigma(\theta) - y` (:math:`r_\sigma` = :func:`perturbed_rank`). The
    conjugate :math:`\Omega(y)` is intractable but constant in :math:`\theta`; this function
    returns, per row, the Monte-Carlo estimate

    .. math::
        \hat L(\theta; y) = \frac1S \sum_{s=1}^S \bigl\langle \operatorname{rank}(\theta + \sigma Z_s)
            - y,\; \theta + \sigma Z_s \bigr\rangle \;\ge 0,

    which equals :math:`L` minus the constant :math:`\Omega(y) + \sigma\langle y, \mathbb E Z\rangle`,
    is 0 exactly when ``target_ranks`` are the ranks of every perturbed sample, and whose exact
    gradient is :math:`\frac1S\sum_s \operatorname{rank}(\theta + \sigma Z_s) - y` (the same samples
    as :func:`perturbed_rank` with the same ``generator`` seed). (The authors' implementation
    returns :math:`\lVert r_\sigma(\theta) - y \rVert^2` as the value with that gradient.) With
    ``descending=True`` ranks are descending (1 = largest) and :math:`\theta` enters as
    :math:`-\theta`. ``target_ranks`` receive no gradient.

    Shape:
        - x: :math:`(*, n, *)` floating scores; ``target_ranks``: same shape and device, ranks 1..n
          (or any point of the permutahedron, e.g. averaged ranks of ties), floating or integer.
        - output: scalar for ``reduction="mean"``/``"sum"`` (over rows), else ``x.shape`` without
          ``dim``; in the promoted compute dtype of ``x`` and ``target_ranks`` (float32 for half inputs).

    Degenerate inputs: no rows gives 0 (keeping the graph); ``n = 1`` gives 0. A NaN or ±inf in a
    row of ``x`` or ``target_ranks`` makes that row's loss NaN.

    Example:
        >>> import torch, rankwise
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.tensor([[0.3, 2.0, -1.0]], requires_grad=True)
        >>> loss = rankwise.perturbed_fy_loss(x, torch.tensor([[1.0, 3.0, 2.0]]), generator=g)
        >>> loss.backward()
        >>> loss.detach(), x.grad.round(decimals=2)  # gradient: expected ranks - target
        (tensor(1.3098), tensor([[ 1.,  0., -1.]]))
    """
    check_floating_nd(x, "x")
    check_real(target_ranks, "target_ranks")
    check_same_device("x", x, ("target_ranks", target_ranks))
    if target_ranks.shape != x.shape:
        raise ValueError(f"`target_ranks` must have the shape of `x` {tuple(x.shape)}, got {tuple(target_ranks.shape)}")
    s, m = _check_common(sigma, n_samples, noise, descending)
    check_choice(reduction, "reduction", _REDUCTIONS)
    d = check_dim(x, dim)
    gen = check_generator(generator, x)
    cdt = common_compute_dtype(x, target_ranks)
    theta = x.movedim(d, -1).to(cdt)
    y = target_ranks.detach().movedim(d, -1).to(cdt)
    z = _sample((m, *theta.shape), theta, noise, gen)
    pert = theta.unsqueeze(0) + s * z  # (S, ..., n)
    if descending:
        pert = -pert
    ystar = rank_last(pert.detach(), False, "ordinal")  # maximizer of <y, pert> over the permutahedron
    per_row = ((ystar - y) * pert).sum(-1).mean(0)  # (...,), >= 0
    per_row = nan_slices(nan_slices(per_row, theta, out_dims=0), y, out_dims=0)  # NaN/inf policy: per row
    if reduction == "none":
        return per_row
    if per_row.numel() == 0:
        return theta.sum() * 0
    return per_row.mean() if reduction == "mean" else per_row.sum()


# ----------------------------------------------------------------------------------------------
# soft_rank(method="perturbed")
# ----------------------------------------------------------------------------------------------
def _perturbed_soft_rank(
    x: torch.Tensor,
    *,
    descending: bool,
    sigma: float = 0.1,
    n_samples: int = 100,
    noise: Noise = "gumbel",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    return perturbed_rank(x, sigma=sigma, n_samples=n_samples, noise=noise, descending=descending, generator=generator)


register_soft_method("perturbed", rank=_perturbed_soft_rank)


# ----------------------------------------------------------------------------------------------
# Module twins
# ----------------------------------------------------------------------------------------------
class _PerturbedModule(nn.Module):
    def __init__(
        self,
        *,
        sigma: float = 0.1,
        n_samples: int = 100,
        noise: Noise = "gumbel",
        descending: bool = False,
        dim: int = -1,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.sigma, self.n_samples = _check_common(sigma, n_samples, noise, descending)
        self.noise, self.descending, self.dim, self.generator = noise, descending, dim, generator

    def _kwargs(self) -> dict[str, Any]:
        return {
            "sigma": self.sigma,
            "n_samples": self.n_samples,
            "noise": self.noise,
            "dim": self.dim,
            "generator": self.generator,
        }

    def extra_repr(self) -> str:
        return f"sigma={self.sigma}, n_samples={self.n_samples}, noise={self.noise!r}, dim={self.dim}"


class PerturbedRank(_PerturbedModule):
    """Module twin of :func:`perturbed_rank` (the optional ``generator`` is kept by reference)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return perturbed_rank(x, descending=self.descending, **self._kwargs())


class PerturbedTopK(_PerturbedModule):
    """Module twin of :func:`perturbed_topk` holding ``k`` and the noise options."""

    def __init__(
        self,
        k: int,
        *,
        sigma: float = 0.1,
        n_samples: int = 100,
        noise: Noise = "gumbel",
        dim: int = -1,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(sigma=sigma, n_samples=n_samples, noise=noise, dim=dim, generator=generator)
        self.k = check_int(k, "k", low=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return perturbed_topk(x, self.k, **self._kwargs())

    def extra_repr(self) -> str:
        return f"k={self.k}, " + super().extra_repr()


class PerturbedFYLoss(_PerturbedModule):
    """Module twin of :func:`perturbed_fy_loss`: ``PerturbedFYLoss(sigma=...)(x, target_ranks)``."""

    def __init__(
        self,
        *,
        sigma: float = 0.1,
        n_samples: int = 100,
        noise: Noise = "gumbel",
        descending: bool = False,
        dim: int = -1,
        reduction: Reduction = "mean",
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(
            sigma=sigma, n_samples=n_samples, noise=noise, descending=descending, dim=dim, generator=generator
        )
        self.reduction = check_choice(reduction, "reduction", _REDUCTIONS)

    def forward(self, x: torch.Tensor, target_ranks: torch.Tensor) -> torch.Tensor:
        return perturbed_fy_loss(
            x, target_ranks, descending=self.descending, reduction=self.reduction, **self._kwargs()
        )


# ----------------------------------------------------------------------------------------------
# registration
# ----------------------------------------------------------------------------------------------


register_op("perturbed_rank", module=PerturbedRank, gradient="surrogate", stochastic=True)(perturbed_rank)
register_op("perturbed_topk", module=PerturbedTopK, gradient="surrogate", stochastic=True)(perturbed_topk)
# gradient "exact": the exact gradient of the returned Monte-Carlo value (at fixed noise)
register_op(
    "perturbed_fy_loss",
    module=PerturbedFYLoss,
    gradient="exact",
    stochastic=True,
    relaxation=RelaxationInfo(
        "perturbed",
        returns="rank_loss",
        params=("n_samples",),
        options={"sigma": 0.1, "noise": "gumbel"},
        description="Fenchel-Young loss of perturbed ranks vs the true ranks (rankwise.perturbed_fy_loss, "
        "Berthet et al.); `n_samples` perturbations",
    ),
)(perturbed_fy_loss)
