r"""Differentiable top-k membership and NeuralSort's differentiable k-nearest neighbours.

Both build only the first ``k`` rows of a relaxed permutation matrix (see
:mod:`rankwise.ops.permutation`), so they cost O(k n) memory instead of O(n²).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from rankwise._twin import FunctionModule
from rankwise._validation import (
    autocast_off,
    check_bool,
    check_choice,
    check_dim,
    check_floating,
    check_floating_nd,
    check_generator,
    check_int,
    check_k,
    check_positive,
    check_same_device,
    check_tensor,
    compute_dtype,
    nan_slices,
    to_compute,
)
from rankwise.ops._registry import register_op
from rankwise.ops.isotonic import Regularization, isotonic_topk_mask, soft_sort_isotonic
from rankwise.ops.lapsum import lapsum_sort, lapsum_topk
from rankwise.ops.permutation import gumbel_noise, neural_sort_rows, softsort_rows
from rankwise.ops.perturbed import perturbed_topk
from rankwise.ops.sorting_network import Distribution, Network, diffsort, diffsort_topk_mask
from rankwise.ops.sparse_topk import ot_topk_mask, sparse_topk_mask

__all__ = [
    "DKNN",
    "TOPK_METHODS",
    "DKNNClassScores",
    "SoftTopK",
    "SoftTopKValues",
    "dknn",
    "dknn_class_scores",
    "soft_topk",
    "soft_topk_values",
]

DKNNMethod = Literal["deterministic", "stochastic"]


# --------------------------------------------------------------------------------------------------
# soft_topk methods: mask(s, k, **options) / values(s, k, **options) on the k LARGEST entries of the
# rows of ``s`` (selected dim last, computation dtype, any leading dims)
# --------------------------------------------------------------------------------------------------
def _neuralsort_mask(s: torch.Tensor, k: int, *, tau: float = 1.0) -> torch.Tensor:
    return neural_sort_rows(s, check_positive(tau, "tau"), rows=k).sum(dim=-2)


def _neuralsort_values(s: torch.Tensor, k: int, *, tau: float = 1.0) -> torch.Tensor:
    return (neural_sort_rows(s, check_positive(tau, "tau"), rows=k) @ s.unsqueeze(-1)).squeeze(-1)


def _softsort_mask(s: torch.Tensor, k: int, *, tau: float = 1.0, power: float = 1.0) -> torch.Tensor:
    return softsort_rows(s, check_positive(tau, "tau"), check_positive(power, "power"), rows=k).sum(dim=-2)


def _softsort_values(s: torch.Tensor, k: int, *, tau: float = 1.0, power: float = 1.0) -> torch.Tensor:
    p = softsort_rows(s, check_positive(tau, "tau"), check_positive(power, "power"), rows=k)
    return (p @ s.unsqueeze(-1)).squeeze(-1)


def _isotonic_mask(
    s: torch.Tensor, k: int, *, regularization: Regularization = "l2", regularization_strength: float = 1.0
) -> torch.Tensor:
    return isotonic_topk_mask(s, k, regularization=regularization, regularization_strength=regularization_strength)


def _isotonic_values(
    s: torch.Tensor, k: int, *, regularization: Regularization = "l2", regularization_strength: float = 1.0
) -> torch.Tensor:
    out = soft_sort_isotonic(
        s, descending=True, regularization=regularization, regularization_strength=regularization_strength
    )
    return out[..., :k]


def _sparse_mask(
    s: torch.Tensor,
    k: int,
    *,
    p: float = 2.0,
    regularization_strength: float = 1.0,
    solver: str = "pav",
    num_iter: int = 500,
    tol: float = 1e-4,
) -> torch.Tensor:
    return sparse_topk_mask(
        s, k, p=p, regularization_strength=regularization_strength, solver=solver, num_iter=num_iter, tol=tol
    )


def _ot_mask(s: torch.Tensor, k: int, *, epsilon: float = 0.1, max_iter: int = 200) -> torch.Tensor:
    return ot_topk_mask(s, k, epsilon=epsilon, max_iter=max_iter)


def _diffsort_mask(
    s: torch.Tensor,
    k: int,
    *,
    network: Network = "odd_even",
    steepness: float = 10.0,
    distribution: Distribution = "cauchy",
    art_lambda: float = 0.25,
    error_free: bool = False,
) -> torch.Tensor:
    return diffsort_topk_mask(
        s,
        k,
        network=network,
        steepness=steepness,
        distribution=distribution,
        art_lambda=art_lambda,
        error_free=error_free,
    )


def _diffsort_values(
    s: torch.Tensor,
    k: int,
    *,
    network: Network = "odd_even",
    steepness: float = 10.0,
    distribution: Distribution = "cauchy",
    art_lambda: float = 0.25,
    error_free: bool = False,
) -> torch.Tensor:
    out = diffsort(
        s,
        network=network,
        steepness=steepness,
        distribution=distribution,
        art_lambda=art_lambda,
        descending=True,
        return_matrix=False,
        error_free=error_free,
    )
    return out[..., :k]


def _perturbed_mask(
    s: torch.Tensor,
    k: int,
    *,
    sigma: float = 0.1,
    n_samples: int = 100,
    noise: str = "gumbel",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    return perturbed_topk(s, k, sigma=sigma, n_samples=n_samples, noise=noise, generator=generator)  # type: ignore[arg-type]


def _lapsum_mask(s: torch.Tensor, k: int, *, alpha: float = 1.0) -> torch.Tensor:
    return lapsum_topk(s, k, alpha, dim=-1, descending=True)


def _lapsum_values(s: torch.Tensor, k: int, *, alpha: float = 1.0) -> torch.Tensor:
    return lapsum_sort(s, alpha, dim=-1, descending=True)[..., :k]


@dataclass(frozen=True)
class TopKMethodImpl:
    """One ``soft_topk`` method: ``mask(s, k, **options)`` (the relaxed membership of the ``k`` largest
    entries of the rows of ``s``, selected dim last) and, where the method defines them,
    ``values(s, k, **options)`` (the relaxed ``k`` largest values, largest first, shape ``(*, k)``)."""

    mask: Callable[..., torch.Tensor]
    values: Callable[..., torch.Tensor] | None = None

    @property
    def options(self) -> tuple[str, ...]:
        params = list(inspect.signature(self.mask).parameters.values())[2:]
        return tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


#: ``soft_topk`` / ``soft_topk_values`` methods by name (one entry per method)
TOPK_METHODS: dict[str, TopKMethodImpl] = {
    "neuralsort": TopKMethodImpl(_neuralsort_mask, _neuralsort_values),
    "softsort": TopKMethodImpl(_softsort_mask, _softsort_values),
    "isotonic": TopKMethodImpl(_isotonic_mask, _isotonic_values),
    "sparse": TopKMethodImpl(_sparse_mask),
    "ot": TopKMethodImpl(_ot_mask),
    "diffsort": TopKMethodImpl(_diffsort_mask, _diffsort_values),
    "lapsum": TopKMethodImpl(_lapsum_mask, _lapsum_values),
    "perturbed": TopKMethodImpl(_perturbed_mask),
}
#: the options of every method, read once (a traced call must not inspect signatures)
_TOPK_OPTIONS: dict[str, tuple[str, ...]] = {}


def _topk_method(method: Any, options: dict[str, Any], values: bool) -> TopKMethodImpl:
    fn = "soft_topk_values" if values else "soft_topk"
    if not isinstance(method, str) or method not in TOPK_METHODS:
        raise ValueError(f"`method` must be one of {', '.join(map(repr, TOPK_METHODS))} for {fn}; got {method!r}")
    impl = TOPK_METHODS[method]
    if values and impl.values is None:
        with_values = ", ".join(repr(m) for m, v in TOPK_METHODS.items() if v.values is not None)
        raise ValueError(
            f"`method` {method!r} defines no relaxed top-k values (only a membership: use soft_topk); "
            f"soft_topk_values accepts method {with_values}"
        )
    if method not in _TOPK_OPTIONS:
        _TOPK_OPTIONS[method] = impl.options
    accepted = _TOPK_OPTIONS[method]
    unknown = [o for o in options if o not in accepted]
    if unknown:
        per_method = "; ".join(f"{m}: {', '.join(v.options) or 'no options'}" for m, v in TOPK_METHODS.items())
        raise TypeError(
            f"{fn}(method={method!r}) got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
            f"{method!r} accepts {', '.join(accepted) or 'no options'} (options by method: {per_method})"
        )
    return impl


def _prepare(scores: torch.Tensor, k: Any, dim: int, descending: Any) -> tuple[torch.Tensor, int, int]:
    check_floating_nd(scores, "scores")
    check_bool(descending, "descending")
    d = check_dim(scores, dim)
    kk = check_k(k, scores.shape[d], "n =")
    s = scores.movedim(d, -1)
    s = s.to(compute_dtype(s.dtype))
    return (s if descending else -s), kk, d


def soft_topk(
    scores: torch.Tensor,
    k: int,
    *,
    method: str = "neuralsort",
    dim: int = -1,
    descending: bool = True,
    **options: Any,
) -> torch.Tensor:
    r"""Differentiable top-``k`` membership: a relaxation of the 0/1 indicator of the ``k`` largest scores.

    ``descending=False`` relaxes the ``k`` smallest instead. Methods (``options`` are their keyword
    options; an option the method does not take raises ``TypeError`` listing every method's):

    * ``"neuralsort"`` (default; ``tau=1.0``) and ``"softsort"`` (``tau=1.0``, ``power=1.0``): the sum of
      the first ``k`` rows of NeuralSort's (Grover et al., ICLR 2019) or SoftSort's (Prillo &
      Eisenschlos, ICML 2020) relaxed permutation :math:`\hat P`,
      :math:`m_j = \sum_{i \le k} \hat P[i, j]`; O(k n). :math:`\hat P` is not doubly stochastic, so an
      entry may exceed 1 slightly at moderate ``tau``.
    * ``"isotonic"`` (``regularization="l2"`` or ``"kl"``, ``regularization_strength=1.0``): Blondel et
      al., ICML 2020, "Fast Differentiable Sorting and Ranking", applied to top-k: the projection of
      ``scores / regularization_strength`` onto the permutahedron of :math:`w = (1^k, 0^{n-k})` (the
      capped simplex), Euclidean or KL; PAV, O(n log n). ``"l2"`` is sparse (exact 0s and 1s).
    * ``"sparse"`` (``p=2`` or ``4/3``, ``regularization_strength=1.0``, ``solver="pav"`` or
      ``"dykstra"`` (``p = 2``), ``num_iter=500``, ``tol=1e-4``): Sander et al., ICML 2023, "Fast,
      Differentiable and Sparse Top-k: a Convex Analysis Perspective": the p-norm regularized mask
      :math:`\mathrm{clip}(((x - 	au)/\lambda)_+^{q-1}, 0, 1)`, :math:`q = p/(p-1)`, see
      :mod:`rankwise.ops.sparse_topk`; ``p = 2`` equals ``"isotonic"`` with ``"l2"``.
    * ``"ot"`` (``epsilon=0.1``, ``max_iter=200``): Xie et al., NeurIPS 2020, "Differentiable Top-k with
      Optimal Transport": ``n`` times the mass that the entropic transport plan from the scores to
      the two points {0, 1} sends to the point of weight ``k / n``; implicit backward.
    * ``"diffsort"`` (``network``, ``steepness``, ``distribution``, ``art_lambda``, ``error_free``, as
      :func:`rankwise.diffsort`): the first ``k`` sorted positions of a differentiable sorting
      network's doubly stochastic matrix, summed, computed through the layers' transposes without
      building the matrix: O(L n) for ``L`` layers (``error_free=True``: the exact 0/1 membership
      forward, the error-free swaps' gradients backward).
    * ``"perturbed"`` (``sigma``, ``n_samples``, ``noise``, ``generator``): :func:`rankwise.perturbed_topk`.

    Every method returns entries >= 0 summing to ``k`` (exactly, up to rounding; ``perturbed``:
    exactly for each sample); all but ``neuralsort`` / ``softsort`` stay in [0, 1]; as the temperature
    (``tau``, ``regularization_strength``, ``epsilon``, ``1 / steepness``, ``sigma``) goes to 0 the
    membership tends to the 0/1 indicator of the top ``k`` (docs/operators.md has the table of
    costs, sparsity and limits).

    Shape:
        - scores: :math:`(*, n, *)` floating, scored along ``dim``.
        - output: same shape and dtype as ``scores`` (float16/bfloat16 computed in float32).

    Degenerate inputs: all-equal scores give ``k / n`` everywhere (``perturbed``: in expectation;
    ``diffsort``: entries that sum to ``k`` but depend on the positions, since a sorting network's
    blend of tied inputs is not symmetric); ``n = 1`` gives ``[1.]``; ``k`` must be an int in
    ``[1, n]`` (a real ``k``: :func:`rankwise.lapsum_topk`). A slice holding a NaN or inf gives NaN for
    the whole slice.

    Example:
        >>> import torch, rankwise
        >>> s = torch.tensor([0.3, 2.0, -1.0, 1.5])
        >>> rankwise.soft_topk(s, 2, tau=0.01)
        tensor([0., 1., 0., 1.])
        >>> float(rankwise.soft_topk(s, 2).sum())
        2.0
        >>> rankwise.soft_topk(s, 2, method="isotonic", regularization_strength=2.0)
        tensor([0.2000, 1.0000, 0.0000, 0.8000])
        >>> rankwise.soft_topk(s, 1, method="sparse", descending=False)
        tensor([0., 0., 1., 0.])
    """
    impl = _topk_method(method, options, values=False)
    s, kk, d = _prepare(scores, k, dim, descending)
    out = impl.mask(s, kk, **options)
    return nan_slices(out, s).movedim(-1, d).to(scores.dtype)


def soft_topk_values(
    scores: torch.Tensor,
    k: int,
    *,
    method: str = "neuralsort",
    dim: int = -1,
    descending: bool = True,
    **options: Any,
) -> torch.Tensor:
    r"""Differentiable top-``k`` values: the ``k`` largest soft-sorted values, largest first.

    Defined by the methods that relax the sorted values: ``"neuralsort"`` and ``"softsort"``
    (:math:`\hat P_{1..k} x`), ``"isotonic"`` (the first ``k`` entries of the isotonic soft sort,
    :func:`rankwise.soft_sort_isotonic` with ``descending=True``) and ``"diffsort"`` (the first ``k``
    outputs of the descending sorting network); the other methods of :func:`soft_topk` define only a
    membership and raise ``ValueError``. ``descending=False`` gives the ``k`` smallest values, smallest
    first. Options as in :func:`soft_topk`. As the temperature goes to 0 the result tends to
    ``torch.topk(scores, k, dim).values``.

    Shape:
        - scores: :math:`(*, n, *)` floating, scored along ``dim``.
        - output: ``scores``' shape with ``k`` along ``dim``; dtype of ``scores``.

    Example:
        >>> import torch, rankwise
        >>> s = torch.tensor([0.3, 2.0, -1.0, 1.5])
        >>> rankwise.soft_topk_values(s, 2, tau=0.01)
        tensor([2.0000, 1.5000])
        >>> rankwise.soft_topk_values(s, 2, method="isotonic", regularization_strength=0.1)
        tensor([2.0000, 1.5000])
    """
    impl = _topk_method(method, options, values=True)
    s, kk, d = _prepare(scores, k, dim, descending)
    assert impl.values is not None
    out = impl.values(s, kk, **options)
    out = nan_slices(out, s)
    return (out if descending else -out).movedim(-1, d).to(scores.dtype)


def dknn(
    query: torch.Tensor,
    neighbors: torch.Tensor,
    k: int,
    *,
    tau: float = 1.0,
    method: DKNNMethod = "deterministic",
    n_samples: int = 1,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    r"""NeuralSort's differentiable k-nearest-neighbour membership (Grover et al., ICLR'19, sec. 5.3).

    Each query scores the candidates by negative squared Euclidean distance,
    :math:`s_{qj} = -\lVert x_q - y_j \rVert^2`, and the membership is the top-``k`` relaxation of
    :func:`soft_topk`: :math:`m_{qj} = \sum_{i \le k} \hat P_q[i, j]`. With
    ``method="stochastic"`` the scores are the log-scores of a Plackett-Luce distribution and the
    membership averages ``n_samples`` relaxed samples (Gumbel-perturbed scores, reparameterized;
    noise from ``generator`` or the global RNG).

    The per-query constant :math:`\lVert x_q\rVert^2` is dropped from the scores
    (:math:`s_{qj} = 2 x_q^\top y_j - \lVert y_j\rVert^2`): :math:`\hat P` and the Plackett-Luce law
    are invariant to it, and it only costs precision.

    Rows sum to ``k`` exactly and are >= 0; as ``tau → 0`` (deterministic) they tend to the 0/1
    indicator of the ``k`` nearest neighbours (ties broken by the relaxation, i.e. shared). As for
    :func:`soft_topk`, an entry may exceed 1 slightly at moderate ``tau``. Use
    :func:`dknn_class_scores` to turn memberships into class scores (the paper's loss is
    ``-dknn_class_scores(m, labels, C).gather(-1, y[:, None]) / k``).

    Shape:
        - query: :math:`(*, M, D)` floating.
        - neighbors: :math:`(*, N, D)` floating (leading dims broadcast with ``query``'s).
        - output: :math:`(*, M, N)`; dtype: the promoted floating dtype of the inputs
          (float16/bfloat16 computed in float32 and cast back).

    Example:
        >>> import torch, rankwise
        >>> q = torch.tensor([[0.0, 0.0], [5.0, 5.0]])
        >>> y = torch.tensor([[0.1, 0.0], [4.0, 5.0], [0.0, -0.3], [6.0, 6.0]])
        >>> rankwise.dknn(q, y, 2, tau=0.01)
        tensor([[1., 0., 1., 0.],
                [0., 1., 0., 1.]])
        >>> rankwise.dknn(q, y, 2).sum(-1)
        tensor([2., 2.])
    """
    check_floating(query, "query")
    check_floating(neighbors, "neighbors")
    for name, x in (("query", query), ("neighbors", neighbors)):
        if x.dim() < 2:
            raise ValueError(
                f"`{name}` must have at least 2 dimensions (..., rows, features), got shape {tuple(x.shape)}"
            )
    if query.shape[-1] != neighbors.shape[-1]:
        raise ValueError(
            f"`query` and `neighbors` must have the same feature size, got {query.shape[-1]} and {neighbors.shape[-1]}"
        )
    k = check_k(k, neighbors.shape[-2], "number of neighbours N =")
    t = check_positive(tau, "tau")
    check_choice(method, "method", ("deterministic", "stochastic"))
    m = check_int(n_samples, "n_samples", low=1)
    check_same_device("query", query, ("neighbors", neighbors))
    gen = check_generator(generator, query)
    out_dtype = torch.promote_types(query.dtype, neighbors.dtype)
    cdt = compute_dtype(out_dtype)
    q, y = query.to(cdt), neighbors.to(cdt)
    scores = 2 * (q @ y.transpose(-1, -2)) - (y * y).sum(-1).unsqueeze(-2)  # (*, M, N)
    if method == "deterministic":
        member = neural_sort_rows(scores, t, rows=k).sum(dim=-2)
    else:
        perturbed = scores.unsqueeze(0) + gumbel_noise((m, *scores.shape), scores, gen)
        member = neural_sort_rows(perturbed, t, rows=k).sum(dim=-2).mean(dim=0)
    # NaN/inf policy: a non-finite query makes its row NaN, a non-finite neighbour every row
    return nan_slices(member, scores).to(out_dtype)


def dknn_class_scores(membership: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    r"""Class scores from (soft) neighbour membership: :math:`c_{qc} = \sum_j m_{qj}\,[\,\ell_j = c\,]`.

    With ``membership = dknn(query, neighbors, k)`` each row of the result sums to ``k`` and its
    argmax is the (soft) majority vote among the ``k`` nearest neighbours. Labels outside
    ``[0, num_classes)`` contribute to no class (no device check, to avoid a host sync).

    Shape:
        - membership: :math:`(*, M, N)` floating.
        - labels: :math:`(N,)` or :math:`(*, N)` integer class indices.
        - output: :math:`(*, M, C)` with ``C = num_classes``; dtype of ``membership``.

    Example:
        >>> import torch, rankwise
        >>> m = torch.tensor([[0.9, 0.1, 1.0]])
        >>> rankwise.dknn_class_scores(m, torch.tensor([2, 0, 2]), 3)
        tensor([[0.1000, 0.0000, 1.9000]])
    """
    check_floating(membership, "membership")
    check_tensor(labels, "labels")
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise TypeError(f"`labels` must be an integer tensor, got dtype {labels.dtype}")
    if membership.dim() < 2:
        raise ValueError(
            f"`membership` must have at least 2 dimensions (..., M, N), got shape {tuple(membership.shape)}"
        )
    if labels.dim() < 1 or labels.shape[-1] != membership.shape[-1]:
        raise ValueError(
            f"`labels` must have shape (..., N) with N = {membership.shape[-1]}, got shape {tuple(labels.shape)}"
        )
    c = check_int(num_classes, "num_classes", low=1)
    check_same_device("membership", membership, ("labels", labels))
    classes = torch.arange(c, device=labels.device)
    m = to_compute(membership)  # fp16/bf16: summed in float32, returned in the dtype of membership
    onehot = (labels.unsqueeze(-1) == classes).to(m.dtype)  # (*, N, C)
    with autocast_off(m.device):  # the documented dtype under torch.autocast too
        return (m @ onehot).to(membership.dtype)


class SoftTopK(FunctionModule):
    """Module twin of :func:`soft_topk` holding ``k``, ``method`` and its options."""

    _function = staticmethod(soft_topk)
    _options = ("method", "dim", "descending")
    _positional = ("k",)
    _kwargs = "options"
    _shown = ("k", "method!r", "dim", "descending", "**")
    #: whether the twin computes the relaxed values (``soft_topk_values``) rather than the membership
    _values = False

    def __init__(
        self, k: int, *, method: str = "neuralsort", dim: int = -1, descending: bool = True, **options: Any
    ) -> None:
        super().__init__()
        self.k = check_int(k, "k", low=1)
        _topk_method(method, options, values=self._values)
        self.method, self.dim, self.descending = method, dim, check_bool(descending, "descending")
        self.options = options


class SoftTopKValues(SoftTopK):
    """Module twin of :func:`soft_topk_values` holding ``k``, ``method`` and its options."""

    _function = staticmethod(soft_topk_values)
    _values = True


class DKNN(FunctionModule):
    """Module twin of :func:`dknn`: ``DKNN(k, tau=...)(query, neighbors)``."""

    _function = staticmethod(dknn)
    _options = ("tau", "method", "n_samples", "generator")
    _positional = ("k",)
    _shown = ("k", "tau", "method!r", "n_samples")

    def __init__(
        self,
        k: int,
        *,
        tau: float = 1.0,
        method: DKNNMethod = "deterministic",
        n_samples: int = 1,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.k = check_int(k, "k", low=1)
        self.tau = check_positive(tau, "tau")
        self.method = check_choice(method, "method", ("deterministic", "stochastic"))
        self.n_samples = check_int(n_samples, "n_samples", low=1)
        self.generator = generator


class DKNNClassScores(FunctionModule):
    """Module twin of :func:`dknn_class_scores` holding ``num_classes``."""

    _function = staticmethod(dknn_class_scores)
    _options = ()
    _positional = ("num_classes",)

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.num_classes = check_int(num_classes, "num_classes", low=1)


# ----------------------------------------------------------------------------------------------
# registration
# ----------------------------------------------------------------------------------------------


register_op("soft_topk", module=SoftTopK)(soft_topk)
register_op("soft_topk_values", module=SoftTopKValues)(soft_topk_values)
register_op("dknn", module=DKNN)(dknn)
register_op("dknn_class_scores", module=DKNNClassScores)(dknn_class_scores)
