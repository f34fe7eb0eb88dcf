"""The base of the ``nn.Module`` twins of functional operators and losses.

A twin is a thin module around one function: its constructor takes the function's keyword-only
options (same names, same defaults), checks them and stores each as an attribute; ``forward``
calls the function with the tensors it is given and those options; ``extra_repr`` lists them.
A twin subclasses :class:`FunctionModule`, names the function (``_function``) and the options it
forwards (``_options``) and shows (``_shown``, default all), and writes only its ``__init__``
(the checks), so the constructor signature stays the documented one::

    class NeuralSort(FunctionModule):
        _function = staticmethod(neural_sort)
        _options = ("tau", "hard", "dim")

        def __init__(self, *, tau: float = 1.0, hard: bool = False, dim: int = -1) -> None:
            super().__init__()
            self.tau, self.hard, self.dim = check_positive(tau, "tau"), check_bool(hard, "hard"), dim

Tensor options (class weights, the training classes) are kept with :meth:`FunctionModule._tensor_option`
as non-persistent buffers, so they move with the module.
Twins with state of their own (buffers, learned sorters, running statistics) stay plain modules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import nn

__all__ = ["FunctionModule"]


class FunctionModule(nn.Module):
    """Module twin of ``_function``: ``forward(*tensors, **more)`` is
    ``_function(*tensors, **more, **{name: self.name for name in _options})``."""

    _function: ClassVar[Callable[..., Any]]
    #: attribute names passed to ``_function`` as keyword options
    _options: ClassVar[tuple[str, ...]] = ()
    #: the function's positional-or-keyword options after the tensors (``k`` of ``soft_topk(scores, k)``),
    #: passed by name too (so the tensors may come by position or by name)
    _positional: ClassVar[tuple[str, ...]] = ()
    #: the attribute holding a dict of further options passed on as ``**kwargs`` (``None``: none)
    _kwargs: ClassVar[str | None] = None
    #: what ``repr`` shows (``None``: ``_positional`` then ``_options``); ``"name!r"`` shows
    #: ``repr(value)``; ``"**"`` shows the ``_kwargs`` options (as ``name=repr(value)``)
    _shown: ClassVar[tuple[str, ...] | None] = None

    def _tensor_option(self, name: str, value: Any) -> None:
        """Keep the tensor option ``name`` (or None) as a non-persistent buffer: it follows the module's
        ``.to(device)`` and stays out of the state dict. Anything but a tensor or None: a TypeError."""
        if value is not None and not isinstance(value, torch.Tensor):
            raise TypeError(f"`{name}` must be a tensor or None, got {type(value).__name__}")
        self.register_buffer(name, value, persistent=False)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        options = {k: getattr(self, k) for k in (*self._positional, *self._options)}
        more = getattr(self, self._kwargs) if self._kwargs is not None else {}
        return type(self)._function(*args, **kwargs, **options, **more)

    def extra_repr(self) -> str:
        shown = (*self._positional, *self._options) if self._shown is None else self._shown
        parts: list[str] = []
        for k in shown:
            if k == "**":
                more = getattr(self, self._kwargs) if self._kwargs is not None else {}
                parts.extend(f"{name}={value!r}" for name, value in more.items())
                continue
            name = k.removesuffix("!r")
            value = getattr(self, name)
            parts.append(f"{name}={value!r}" if k.endswith("!r") else f"{name}={value}")
        return ", ".join(parts)
