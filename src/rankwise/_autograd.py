"""Autograd helpers shared by the operators and losses.

:func:`graph_vjp` is the double backward of an ``autograd.Function`` whose backward is a closed
form or a kernel: recompute the value with a differentiable formulation of the same function and
differentiate it with a graph, so second derivatives (Hessian-vector products,
``torch.autograd.gradgradcheck``) are exact rather than a constant first gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["graph_vjp"]


def graph_vjp(fn: Callable[..., torch.Tensor], grad: torch.Tensor, x: torch.Tensor, *rest: Any) -> torch.Tensor:
    """``grad``-weighted gradient of ``fn(x, *rest)`` with respect to ``x``, with a graph.

    Called from a Function's ``backward`` under double backward; ``x`` is the saved input (a copy
    that requires grad is used where it does not).

    Example:
        >>> import torch
        >>> x = torch.tensor([1.0, 2.0], requires_grad=True)
        >>> g = graph_vjp(lambda v: (v**3).sum(), torch.tensor(1.0), x)
        >>> g, g.grad_fn is not None
        (tensor([ 3., 12.], grad_fn=<MulBackward0>), True)
    """
    with torch.enable_grad():
        x = x if x.requires_grad else x.detach().requires_grad_()
        (g,) = torch.autograd.grad(fn(x, *rest), x, grad, create_graph=True)
    return g
