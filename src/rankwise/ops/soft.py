"""``soft_sort`` / ``soft_rank``: one entry point over every differentiable sorting method.

Each method registers its implementation with :func:`register_soft_method` in :data:`SOFT_METHODS`
(a :class:`rankwise._registry.Registry`); ``method="..."`` picks it from that registry (no string
dispatch in this module). Implementations receive the input
already moved so that the sorted dimension is last and must accept any leading dims.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rankwise._kernels._custom import constant_result
from rankwise._registry import Registry
from rankwise._twin import FunctionModule
from rankwise._validation import check_bool, check_dim, check_floating, nan_slices, to_compute

__all__ = ["SoftRank", "SoftSort", "list_soft_methods", "register_soft_method", "soft_rank", "soft_sort"]

# impl(x_last, *, descending, **kwargs) -> tensor of the same shape as x_last
SoftImpl = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class _SoftMethod:
    sort: SoftImpl | None
    rank: SoftImpl | None
    #: the implementations apply the NaN/inf policy themselves (``soft_*`` then skips its own pass)
    handles_nonfinite: bool = False
    #: keyword options of ``sort`` / ``rank`` (``None``: it takes ``**kwargs``), read from their signatures
    #: when the method is registered: a traced call must not inspect the signature (dynamo then reads the
    #: defaults as graph inputs, and a float default reaches the implementation as a tensor)
    sort_options: tuple[str, ...] | None = None
    rank_options: tuple[str, ...] | None = None


def _options(fn: SoftImpl) -> tuple[str, ...] | None:
    """Keyword options of an implementation (after the input and ``descending``); None if it takes ``**kwargs``."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return tuple(p.name for p in params if p.kind in kinds and p.name != "descending")


#: soft sort / soft rank implementations by method name
SOFT_METHODS: Registry[Any] = Registry("soft method")
_PLUGINS_LOADED = False
#: modules outside :mod:`rankwise.ops` that register operators and soft methods when imported (the
#: SoDeep sorters: ``soft_rank(method="sodeep")``). They import ``rankwise.ops``, so ``ops`` names them
#: instead of importing them: the dependency points one way (plugin -> ops), as for a third-party plugin.
PLUGIN_MODULES: list[str] = ["rankwise.sodeep.hub"]


@constant_result
def load_plugins() -> bool:
    """Import :data:`PLUGIN_MODULES` once, so that their methods are available however rankwise was
    imported (``import rankwise.ops`` alone, or the lazy top-level package). Under ``torch.compile``
    the tracer runs it eagerly (a constant of the trace: imports cannot be traced)."""
    global _PLUGINS_LOADED
    if not _PLUGINS_LOADED:
        _PLUGINS_LOADED = True
        import importlib

        for name in PLUGIN_MODULES:
            importlib.import_module(name)
    return True


def register_soft_method(
    name: str, *, sort: SoftImpl | None = None, rank: SoftImpl | None = None, handles_nonfinite: bool = False
) -> None:
    """Register the soft sort and/or soft rank implementation of a method.

    Both callables take the input with the sorted dimension last, plus keyword arguments
    ``descending`` and the method's own options, and return a tensor of the same shape.
    ``handles_nonfinite=True`` declares that they already return NaN for every slice holding a NaN
    or inf (docs/conventions.md), so :func:`soft_sort` / :func:`soft_rank` skip their own pass.
    """
    old = SOFT_METHODS[name] if name in SOFT_METHODS else _SoftMethod(None, None)
    sort, rank = sort or old.sort, rank or old.rank
    method = _SoftMethod(
        sort=sort,
        rank=rank,
        handles_nonfinite=handles_nonfinite,
        sort_options=_options(sort) if sort is not None else None,
        rank_options=_options(rank) if rank is not None else None,
    )
    SOFT_METHODS.add(name, method, replace=True)


def list_soft_methods() -> list[str]:
    """Methods accepted by :func:`soft_sort` / :func:`soft_rank`."""
    load_plugins()
    return SOFT_METHODS.names()


def _impl(method: Any, kind: str) -> SoftImpl:
    if method not in SOFT_METHODS:
        load_plugins()
    fn = getattr(SOFT_METHODS[method], kind) if method in SOFT_METHODS else None
    if fn is None:
        valid = ", ".join(repr(m) for m, v in SOFT_METHODS.items() if getattr(v, kind))
        raise ValueError(f"`method` must be one of {valid} for soft_{kind}; got {method!r}")
    impl: SoftImpl = fn
    return impl


def _check_options(kind: str, method: str, kwargs: dict[str, Any], fn: SoftImpl | None = None) -> None:
    """Unknown keyword options raise ``TypeError`` naming ``soft_<kind>`` and what each method accepts
    (``fn``: the method's implementation when the caller has looked it up already)."""
    if fn is None:
        fn = _impl(method, kind)
    if not kwargs:
        return
    accepted = getattr(SOFT_METHODS[method], f"{kind}_options")
    unknown = [k for k in kwargs if accepted is not None and k not in accepted]
    if not unknown:
        return
    per_method = []
    for name, registered in SOFT_METHODS.items():
        if getattr(registered, kind) is not None:
            opts = getattr(registered, f"{kind}_options")
            per_method.append(f"{name}: {', '.join(opts) if opts else 'no options'}" if opts is not None else name)
    got = ", ".join(repr(k) for k in unknown)
    plural = "s" if len(unknown) > 1 else ""
    raise TypeError(
        f"soft_{kind}(method={method!r}) got unexpected keyword argument{plural} {got}; "
        f"{method!r} accepts {', '.join(accepted) if accepted else 'no options'} "
        f"(options by method: {'; '.join(per_method)})"
    )


def _apply(kind: str, x: torch.Tensor, method: str, descending: bool, dim: int, kwargs: dict[str, Any]) -> torch.Tensor:
    fn = _impl(method, kind)
    _check_options(kind, method, kwargs, fn)
    check_floating(x, "x")
    check_bool(descending, "descending")
    if x.dim() == 0:
        raise ValueError("`x` must have at least 1 dimension, got a 0-d tensor")
    d = check_dim(x, dim)
    last = d == x.dim() - 1
    xm = x if last else x.movedim(d, -1)
    if kind == "rank":  # soft ranks reach n: float32 for fp16/bf16 input (docs/conventions.md)
        xm = to_compute(xm)
    out = fn(xm, descending=descending, **kwargs)
    # NaN/inf policy: every soft value of a slice depends on the whole slice
    if not SOFT_METHODS[method].handles_nonfinite:
        out = nan_slices(out, xm)
    return out if last else out.movedim(-1, d)


def soft_sort(
    x: torch.Tensor, *, method: str = "isotonic", descending: bool = False, dim: int = -1, **kwargs: Any
) -> torch.Tensor:
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
    * ``"diffsort"`` — differentiable sorting networks (Petersen et al., ICML'21/ICLR'22), see
      :func:`rankwise.diffsort`; options ``network``, ``steepness``, ``distribution``, ``art_lambda``.
    * ``"lapsum"`` — Struski et al. (ICML'25): sums of Laplace CDFs with a closed-form inverse,
      O(n log n); option ``alpha`` (the Laplace scale, default 1.0); see :func:`rankwise.lapsum_sort`
      and :func:`rankwise.lapsum_rank`.

    ``method`` defaults to ``"isotonic"``, so ``soft_sort(x, regularization_strength=0.1)`` is
    ``torchsort.soft_sort(x, regularization_strength=0.1)``. An option the method does not accept
    raises ``TypeError`` listing the options of every method.

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


def soft_rank(
    x: torch.Tensor, *, method: str = "isotonic", descending: bool = False, dim: int = -1, **kwargs: Any
) -> torch.Tensor:
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


class SoftSort(FunctionModule):
    """Module twin of :func:`soft_sort` holding ``method`` and its options."""

    _function = staticmethod(soft_sort)
    _options = ("method", "descending", "dim")
    _kwargs = "kwargs"
    _shown = ()

    def __init__(self, *, method: str = "isotonic", descending: bool = False, dim: int = -1, **kwargs: Any) -> None:
        super().__init__()
        _check_options("sort", method, kwargs)
        check_bool(descending, "descending")
        self.method, self.descending, self.dim, self.kwargs = method, descending, dim, kwargs


class SoftRank(FunctionModule):
    """Module twin of :func:`soft_rank` holding ``method`` and its options."""

    _function = staticmethod(soft_rank)
    _options = ("method", "descending", "dim")
    _kwargs = "kwargs"
    _shown = ()

    def __init__(self, *, method: str = "isotonic", descending: bool = False, dim: int = -1, **kwargs: Any) -> None:
        super().__init__()
        _check_options("rank", method, kwargs)
        check_bool(descending, "descending")
        self.method, self.descending, self.dim, self.kwargs = method, descending, dim, kwargs
