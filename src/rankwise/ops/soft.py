"""``soft_sort`` / ``soft_rank``: one entry point over every differentiable sorting method.

Each method registers its implementation with :func:`register_soft_method`; ``method="..."`` picks
it from that registry (no string dispatch in this module). Implementations receive the input
already moved so that the sorted dimension is last and must accept any leading dims.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rankwise._validation import check_bool, check_dim, check_floating, nan_slices, to_compute

__all__ = ["SoftRank", "SoftSort", "list_soft_methods", "register_soft_method", "soft_rank", "soft_sort"]

# impl(x_last, *, descending, **kwargs) -> tensor of the same shape as x_last
SoftImpl = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class _SoftMethod:
    sort: SoftImpl | None
    rank: SoftImpl | None


_METHODS: dict[str, _SoftMethod] = {}


def register_soft_method(name: str, *, sort: SoftImpl | None = None, rank: SoftImpl | None = None) -> None:
    """Register the soft sort and/or soft rank implementation of a method.

    Both callables take the input with the sorted dimension last, plus keyword arguments
    ``descending`` and the method's own options, and return a tensor of the same shape.
    """
    old = _METHODS.get(name, _SoftMethod(None, None))
    _METHODS[name] = _SoftMethod(sort=sort or old.sort, rank=rank or old.rank)


def list_soft_methods() -> list[str]:
    """Methods accepted by :func:`soft_sort` / :func:`soft_rank`."""
    return sorted(_METHODS)


def _impl(method: Any, kind: str) -> SoftImpl:
    if method not in _METHODS or getattr(_METHODS[method], kind) is None:
        valid = ", ".join(repr(m) for m in sorted(m for m, v in _METHODS.items() if getattr(v, kind)))
        raise ValueError(f"`method` must be one of {valid} for soft_{kind}; got {method!r}")
    fn: SoftImpl = getattr(_METHODS[method], kind)
    return fn


def _apply(kind: str, x: torch.Tensor, method: str, descending: bool, dim: int, kwargs: dict[str, Any]) -> torch.Tensor:
    fn = _impl(method, kind)
    check_floating(x, "x")
    check_bool(descending, "descending")
    if x.dim() == 0:
        raise ValueError("`x` must have at least 1 dimension, got a 0-d tensor")
    d = check_dim(x, dim)
    xm = x.movedim(d, -1)
    if kind == "rank":  # soft ranks reach n: float32 for fp16/bf16 input (docs/conventions.md)
        xm = to_compute(xm)
    out = fn(xm, descending=descending, **kwargs)
    # NaN/inf policy: every soft value of a slice depends on the whole slice
    return nan_slices(out, xm).movedim(-1, d)


def soft_sort(x: torch.Tensor, *, method: str, descending: bool = False, dim: int = -1, **kwargs: Any) -> torch.Tensor:
    r"""Differentiable sort of ``x`` along ``dim``.

    Methods (``rankwise.list_soft_methods()``):

    * ``"isotonic"`` — Blondel et al. (ICML'20): Euclidean (``regularization="l2"``) or KL
      projection onto the permutahedron, O(n log n); options ``regularization``,
      ``regularization_strength`` (default 1.0). Equals ``torchsort.soft_sort``.
    * ``"neuralsort"`` — Grover et al. (ICLR'19): ``P̂ x`` with NeuralSort's relaxed permutation
      matrix; option ``tau``.
    * ``"softsort"`` — Prillo & Eisenschlos (ICML'20); options ``tau``, ``power``.
    * ``"sinkhorn"`` — Cuturi, Teboul & Vert (NeurIPS'19): optimal transport onto sorted targets;
      options ``epsilon`` (default 1e-2), ``p``, ``num_targets`` (the output then has that length
      along ``dim``), ``tol``, ``max_iter``; see :func:`rankwise.soft_sort_sinkhorn`.

    As the strength / temperature goes to 0 the result tends to ``torch.sort(x).values``.

    Shape:
        - x: :math:`(*, n, *)` floating, sorted along ``dim``.
        - output: same shape and dtype as ``x``.

    A slice (along ``dim``) holding a NaN or inf gives NaN for the whole slice (docs/conventions.md).

    Example:
        >>> import torch, rankwise
        >>> x = torch.tensor([[3.0, 1.0, 2.0]])
        >>> rankwise.soft_sort(x, method="isotonic", regularization_strength=0.1)
        tensor([[1., 2., 3.]])
    """
    return _apply("sort", x, method, descending, dim, kwargs)


def soft_rank(x: torch.Tensor, *, method: str, descending: bool = False, dim: int = -1, **kwargs: Any) -> torch.Tensor:
    r"""Differentiable ranks (1..n, ascending unless ``descending``) of ``x`` along ``dim``.

    Methods as in :func:`soft_sort`. For the permutation-matrix methods the soft rank of element
    ``j`` is :math:`\sum_i i\,\hat P_{ij}` (descending) and ``n + 1`` minus that (ascending). As the
    strength / temperature goes to 0 the result tends to ``rankwise.rank(x)``; for ``isotonic`` it
    tends to the constant ``(n + 1) / 2`` as the strength grows.

    Shape:
        - x: :math:`(*, n, *)` floating, ranked along ``dim``.
        - output: same shape as ``x``; dtype of ``x``, float32 for float16/bfloat16 (ranks reach n).

    A slice (along ``dim``) holding a NaN or inf gives NaN for the whole slice (docs/conventions.md).

    Example:
        >>> import torch, rankwise
        >>> x = torch.tensor([[3.0, 1.0, 2.0]])
        >>> rankwise.soft_rank(x, method="isotonic", regularization_strength=0.1)
        tensor([[3., 1., 2.]])
    """
    return _apply("rank", x, method, descending, dim, kwargs)


class SoftSort(nn.Module):
    """Module twin of :func:`soft_sort` holding ``method`` and its options."""

    def __init__(self, *, method: str, descending: bool = False, dim: int = -1, **kwargs: Any) -> None:
        super().__init__()
        _impl(method, "sort")
        check_bool(descending, "descending")
        self.method, self.descending, self.dim, self.kwargs = method, descending, dim, kwargs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return soft_sort(x, method=self.method, descending=self.descending, dim=self.dim, **self.kwargs)


class SoftRank(nn.Module):
    """Module twin of :func:`soft_rank` holding ``method`` and its options."""

    def __init__(self, *, method: str, descending: bool = False, dim: int = -1, **kwargs: Any) -> None:
        super().__init__()
        _impl(method, "rank")
        check_bool(descending, "descending")
        self.method, self.descending, self.dim, self.kwargs = method, descending, dim, kwargs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return soft_rank(x, method=self.method, descending=self.descending, dim=self.dim, **self.kwargs)
