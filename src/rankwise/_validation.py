"""Argument checks shared by all operators and losses.

Every check raises ``TypeError`` or ``ValueError`` whose message names the argument, what was
expected and what was given, e.g. ``"`tau` must be > 0, got -1.0"``.
"""

from __future__ import annotations

from collections.abc import Iterable
from numbers import Real
from typing import Any

import torch

__all__ = [
    "check_choice",
    "check_dim",
    "check_floating",
    "check_floating_nd",
    "check_ndim",
    "check_positive",
    "check_positive_int",
    "check_tensor",
    "compute_dtype",
    "to_compute",
]


def check_tensor(x: Any, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(x).__name__}")
    return x


def check_floating(x: Any, name: str) -> torch.Tensor:
    """``x`` must be a floating-point tensor (gradients need one)."""
    check_tensor(x, name)
    if not (x.is_floating_point()):
        raise TypeError(
            f"`{name}` must be a floating-point tensor, got dtype {x.dtype}; convert it with `{name}.float()`"
        )
    return x


def check_floating_nd(x: Any, name: str) -> torch.Tensor:
    """``x`` must be a floating-point tensor with at least one dimension (the input of a ranking op)."""
    check_floating(x, name)
    if x.dim() == 0:
        raise ValueError(f"`{name}` must have at least 1 dimension, got a 0-d tensor")
    return x


def check_ndim(
    x: torch.Tensor,
    name: str,
    *,
    min_ndim: int = 1,
    max_ndim: int | None = None,
    ndim: int | Iterable[int] | None = None,
) -> None:
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if x.dim() not in allowed:
            want = " or ".join(str(a) for a in allowed)
            raise ValueError(f"`{name}` must have {want} dimensions, got shape {tuple(x.shape)} ({x.dim()} dims)")
        return
    if x.dim() < min_ndim:
        raise ValueError(f"`{name}` must have at least {min_ndim} dimension(s), got shape {tuple(x.shape)}")
    if max_ndim is not None and x.dim() > max_ndim:
        raise ValueError(f"`{name}` must have at most {max_ndim} dimension(s), got shape {tuple(x.shape)}")


def check_dim(x: torch.Tensor, dim: Any, name: str = "dim") -> int:
    """Validate ``dim`` for ``x`` and return it as a non-negative index."""
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"`{name}` must be an int, got {type(dim).__name__}")
    nd = max(x.dim(), 1)
    if not -nd <= dim < nd:
        raise ValueError(f"`{name}` must be in [{-nd}, {nd - 1}] for a {x.dim()}-d input, got {dim}")
    return dim % nd


def check_positive(value: Any, name: str, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"`{name}` must be a real number, got {type(value).__name__}")
    v = float(value)
    if v != v or (v < 0 if allow_zero else v <= 0) or v == float("inf"):
        op = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"`{name}` must be finite and {op}, got {value!r}")
    return v


def check_positive_int(value: Any, name: str) -> int:
    """``value`` must be an ``int`` (not ``bool``) >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a positive int, got {value!r}")
    return value


def check_choice(value: Any, name: str, choices: Iterable[Any]) -> Any:
    options = tuple(choices)
    if value not in options:
        valid = ", ".join(repr(c) for c in options)
        raise ValueError(f"`{name}` must be one of {valid}; got {value!r}")
    return value


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half and bfloat16 are computed in float32; other floating dtypes are kept."""
    if dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    if not dtype.is_floating_point:
        return torch.get_default_dtype()
    return dtype


def to_compute(x: torch.Tensor) -> torch.Tensor:
    """Upcast fp16/bf16 (and integer) tensors to the dtype used for computation."""
    dt = compute_dtype(x.dtype)
    return x if x.dtype == dt else x.to(dt)
