r"""Differentiable top-k membership and NeuralSort's differentiable k-nearest neighbours.

Both build only the first ``k`` rows of a relaxed permutation matrix (see
:mod:`rankwise.ops.permutation`), so they cost O(k n) memory instead of O(n²).
"""

from __future__ import annotations

from typing import Literal

import torch

from rankwise._twin import FunctionModule
from rankwise._validation import (
    autocast_off,
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
from rankwise.ops.permutation import gumbel_noise, neural_sort_rows, softsort_rows

__all__ = ["DKNN", "DKNNClassScores", "SoftTopK", "dknn", "dknn_class_scores", "soft_topk"]

TopKMethod = Literal["neuralsort", "softsort"]
DKNNMethod = Literal["deterministic", "stochastic"]


def soft_topk(
    scores: torch.Tensor, k: int, *, tau: float = 1.0, dim: int = -1, method: TopKMethod = "neuralsort"
) -> torch.Tensor:
    r"""Differentiable top-``k`` membership: the sum of the first ``k`` rows of a relaxed permutation.

    .. math::
        m_j = \sum_{i=1}^{k} \hat P[i, j],

    with :math:`\hat P` NeuralSort's matrix (:func:`rankwise.neural_sort`, default) or SoftSort's
    (``method="softsort"``). Only the first ``k`` rows are built: O(k n) time and memory.

    Properties: :math:`m_j \ge 0` and :math:`\sum_j m_j = k` exactly; as ``tau → 0`` ``m`` tends to the
    0/1 indicator of the ``k`` largest scores. Because :math:`\hat P` is not doubly stochastic,
    an entry can exceed 1 slightly at moderate ``tau`` (by at most the column-sum excess of
    :math:`\hat P`; typically a few percent to ~15% for close scores); clamp it if you need a
    probability.

    Shape:
        - scores: :math:`(*, n, *)` floating, scored along ``dim``.
        - output: same shape and dtype as ``scores`` (float16/bfloat16 computed in float32).

    Degenerate inputs: all-equal scores give ``k / n`` everywhere; ``n = 1`` gives ``[1.]``; ``k = n``
    gives the column sums of :math:`\hat P` (total ``n``, close to but not exactly all ones).

    Example:
        >>> import torch, rankwise
        >>> s = torch.tensor([0.3, 2.0, -1.0, 1.5])
        >>> rankwise.soft_topk(s, 2, tau=0.01)
        tensor([0., 1., 0., 1.])
        >>> float(rankwise.soft_topk(s, 2).sum())
        2.0
    """
    check_floating_nd(scores, "scores")
    t = check_positive(tau, "tau")
    check_choice(method, "method", ("neuralsort", "softsort"))
    d = check_dim(scores, dim)
    k = check_k(k, scores.shape[d], "n =")
    s = scores.movedim(d, -1)
    s = s.to(compute_dtype(s.dtype))
    p = neural_sort_rows(s, t, rows=k) if method == "neuralsort" else softsort_rows(s, t, 1.0, rows=k)
    return nan_slices(p.sum(dim=-2), s).movedim(-1, d).to(scores.dtype)


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
    """Module twin of :func:`soft_topk` holding ``k`` and its options."""

    _function = staticmethod(soft_topk)
    _options = ("tau", "dim", "method")
    _positional = ("k",)
    _shown = ("k", "tau", "dim", "method!r")

    def __init__(self, k: int, *, tau: float = 1.0, dim: int = -1, method: TopKMethod = "neuralsort") -> None:
        super().__init__()
        self.k = check_int(k, "k", low=1)
        self.tau = check_positive(tau, "tau")
        self.dim = dim
        self.method = check_choice(method, "method", ("neuralsort", "softsort"))


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
register_op("dknn", module=DKNN)(dknn)
register_op("dknn_class_scores", module=DKNNClassScores)(dknn_class_scores)
