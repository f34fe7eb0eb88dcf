"""Random draws of the stochastic operators and losses, traceable with symbolic shapes.

``torch.rand(shape, generator=None)`` and ``torch.rand(shape)`` draw the same numbers in eager mode, but
they are different ATen overloads: the ``generator`` overloads (``rand.generator``, ``randn.generator``,
``randperm.generator``) take concrete sizes only, so under ``torch.compile(dynamic=True)`` a call that
passes ``generator=None`` fails on the symbolic batch size ("SymIntArrayRef expected to contain only
concrete integers"). These helpers pass ``generator`` only when one is given.

A ``torch.Generator`` object itself cannot be an input of a traced graph (dynamo has no graph value for
it): a compiled call with an explicit generator breaks the graph at the draw (``fullgraph=True``
refuses it); with ``generator=None`` the draw is part of the graph and comes from the global generator
(``torch.manual_seed``), in the order eager mode draws it.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["rand_from", "randn_from", "randperm_from"]


def _generator_kwargs(generator: torch.Generator | None) -> dict[str, Any]:
    """``{"generator": generator}`` when one is given, else nothing (the overloads without it)."""
    return {} if generator is None else {"generator": generator}


def rand_from(
    shape: tuple[int, ...],
    generator: torch.Generator | None,
    *,
    device: torch.device,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``torch.rand(shape)`` on ``device``, from ``generator`` (the global generator if ``None``)."""
    return torch.rand(shape, device=device, dtype=dtype, **_generator_kwargs(generator))


def randn_from(
    shape: tuple[int, ...],
    generator: torch.Generator | None,
    *,
    device: torch.device,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``torch.randn(shape)`` on ``device``, from ``generator`` (the global generator if ``None``)."""
    return torch.randn(shape, device=device, dtype=dtype, **_generator_kwargs(generator))


def randperm_from(n: int, generator: torch.Generator | None, *, device: torch.device) -> torch.Tensor:
    """``torch.randperm(n)`` on ``device``, from ``generator`` (the global generator if ``None``)."""
    return torch.randperm(n, device=device, **_generator_kwargs(generator))
