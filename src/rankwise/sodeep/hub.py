"""Bundled sorters and the ``"sodeep"`` soft-rank method.

``sodeep_sorter(seq_len, model="gru")`` loads a sorter shipped inside the package (no download).
Importing this module registers ``soft_rank(x, method="sodeep")`` and the operator
``"sodeep_rank"`` (:func:`sodeep_rank`).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from rankwise._validation import check_bool, check_choice, check_dim, check_floating_nd, compute_dtype, nan_slices
from rankwise.ops._registry import register_op
from rankwise.ops.soft import register_soft_method
from rankwise.sodeep.models import SORTER_MODELS, Sorter
from rankwise.sodeep.weights_io import BUNDLED_SEQ_LENS, bundled_path, load_sorter

__all__ = ["SodeepRank", "available_sorters", "sodeep_rank", "sodeep_sorter"]

_CACHE: dict[tuple[Any, ...], Sorter] = {}


def available_sorters() -> list[tuple[str, int]]:
    """``(model, seq_len)`` pairs whose weights are bundled with this installation."""
    return [(m, n) for m in SORTER_MODELS for n in BUNDLED_SEQ_LENS if bundled_path(n, m).is_file()]


def sodeep_sorter(seq_len: int, model: str = "gru", *, trainable: bool = False) -> Sorter:
    """Load the bundled SoDeep sorter for sequences of length ``seq_len`` (no download).

    Bundled: ``model="gru"`` (bidirectional GRU) for ``seq_len`` in 32, 64, 128; weights are read
    with ``torch.load(weights_only=True)``. ``model="exact"`` returns the parameter-free
    pairwise-sigmoid sorter for any length. The sorter is returned in eval mode with frozen
    parameters unless ``trainable=True`` (see :class:`rankwise.sodeep.SorterUpdater` to refine it).
    Its training command and evaluation report are in ``sorter.metadata``.

    Calling it: ``sorter(x)`` maps ``(*, n)`` scores to normalized ranks (SoDeep's ``get_rank``:
    largest -> ``1/n``, smallest -> ``1``); ``sorter(x, descending=False)`` gives ascending ones.

    Example:
        >>> import torch, rankwise
        >>> sorter = rankwise.sodeep_sorter(32)
        >>> x = torch.linspace(0, 1, 32)
        >>> r = sorter(x)  # normalized ranks, largest -> 1/32
        >>> int(r.argmin()), int(r.argmax())
        (31, 0)
    """
    check_choice(model, "model", SORTER_MODELS)
    if model == "exact":
        from rankwise.sodeep.models import ExactSorter

        return ExactSorter(int(seq_len))
    path = bundled_path(seq_len, model)
    if not path.is_file():
        have = ", ".join(f"{m}/{n}" for m, n in available_sorters()) or "none"
        raise ValueError(f"no bundled {model!r} sorter for seq_len={seq_len}; bundled sorters (model/seq_len): {have}")
    sorter = load_sorter(path)
    sorter.requires_grad_(trainable)
    return sorter


def _cached(model: str, n: int, device: torch.device, dtype: torch.dtype) -> Sorter:
    key = (model, n, device, dtype)
    if key not in _CACHE:
        base_key = (model, n, torch.device("cpu"), torch.float32)
        if base_key not in _CACHE:
            _CACHE[base_key] = sodeep_sorter(n, model)
        _CACHE[key] = copy.deepcopy(_CACHE[base_key]).to(device=device, dtype=dtype)
    return _CACHE[key]


def _resolve(n: int, sorter: nn.Module | None, model: str, device: torch.device, dtype: torch.dtype) -> nn.Module:
    if sorter is not None:
        if not isinstance(sorter, nn.Module):
            raise TypeError(
                f"`sorter` must be an nn.Module (e.g. rankwise.sodeep_sorter(n)), got {type(sorter).__name__}"
            )
        return sorter
    check_choice(model, "model", SORTER_MODELS)
    if model == "exact":
        from rankwise.sodeep.models import ExactSorter

        return ExactSorter(max(n, 1))
    cached = _CACHE.get((model, n, device, dtype))
    if cached is not None:
        return cached
    bundled = available_sorters()
    if (model, n) not in bundled:
        lens = sorted(k for m, k in bundled if m == model)
        raise ValueError(
            f"no bundled SoDeep {model!r} sorter for sequences of length n={n} (x.shape[-1]); bundled seq_lens: "
            f"{lens}. Pass `sorter=` (e.g. a sorter trained with `rankwise sodeep train --seq-len {n}`)"
        )
    return _cached(model, n, device, dtype)


def _soft_rank_impl(
    x: torch.Tensor, *, descending: bool = False, sorter: nn.Module | None = None, model: str = "gru"
) -> torch.Tensor:
    """soft_rank implementation (sorted dim last): ranks 1..n, ascending unless ``descending``."""
    n = x.shape[-1]
    cdt = compute_dtype(x.dtype)  # ranks reach n: float32 for fp16/bf16 (docs/conventions.md)
    if n <= 1 or x.numel() == 0:
        return nan_slices((x * 0 + 1).to(cdt), x)
    s = _resolve(n, sorter, model, x.device, cdt)
    norm = s(x.to(cdt), descending=descending)
    return nan_slices(norm * n, x)


def sodeep_rank(
    x: torch.Tensor, *, sorter: nn.Module | None = None, model: str = "gru", descending: bool = False, dim: int = -1
) -> torch.Tensor:
    r"""Differentiable ranks :math:`1..n` predicted by a SoDeep sorter (Engilberge et al., CVPR'19).

    A sorter :math:`f_\Theta` trained on synthetic sequences predicts normalized ranks; this returns
    :math:`n\,f_\Theta(x)` — ascending ranks (smallest -> 1) unless ``descending`` (largest -> 1).
    Same as ``rankwise.soft_rank(x, method="sodeep", ...)``. Gradients are those of the network
    (a smooth surrogate of the rank function).

    The sorter is ``sorter`` if given, else the bundled ``model`` sorter whose ``seq_len`` equals
    ``n = x.shape[dim]`` (bundled: 32, 64, 128); any other ``n`` raises ``ValueError`` naming ``n``
    and the bundled lengths. ``n <= 1`` gives rank 1 without a sorter. Input is standardized per
    sequence (scale/offset invariant); fp16/bf16 are computed and returned in float32 (ranks reach
    n); other dtypes are kept. A sequence holding a NaN or inf gives NaN ranks for the whole sequence.

    Shape:
        - x: :math:`(*, n, *)` floating, ranked along ``dim``.
        - output: same shape as ``x``.

    Example:
        >>> import torch, rankwise
        >>> x = torch.randn(4, 32, requires_grad=True)
        >>> r = rankwise.soft_rank(x, method="sodeep")
        >>> r.shape, bool((r - rankwise.rank(x)).abs().mean() < 2)
        (torch.Size([4, 32]), True)
        >>> r.sum().backward()
    """
    check_floating_nd(x, "x")
    check_bool(descending, "descending")
    d = check_dim(x, dim)
    return _soft_rank_impl(x.movedim(d, -1), descending=descending, sorter=sorter, model=model).movedim(-1, d)


class SodeepRank(nn.Module):
    """Module twin of :func:`sodeep_rank` (registers ``sorter`` as a submodule when given)."""

    def __init__(
        self, *, sorter: nn.Module | None = None, model: str = "gru", descending: bool = False, dim: int = -1
    ) -> None:
        super().__init__()
        check_choice(model, "model", SORTER_MODELS)
        check_bool(descending, "descending")
        self.sorter = sorter
        self.model, self.descending, self.dim = model, descending, dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sodeep_rank(x, sorter=self.sorter, model=self.model, descending=self.descending, dim=self.dim)


register_soft_method("sodeep", rank=_soft_rank_impl)
register_op("sodeep_rank", module=SodeepRank, gradient="exact")(sodeep_rank)
