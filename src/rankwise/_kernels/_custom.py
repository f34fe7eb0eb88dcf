"""Kernels as PyTorch custom operators, for ``torch.compile``.

A numba kernel is not a torch operation: ``torch.compile`` cannot trace into it (numpy views, a
JIT'd call). Every entry point of the layer is therefore a :class:`KernelOp`: called eagerly it
runs its Python implementation directly (no dispatcher overhead); under ``torch.compile`` tracing
it calls the custom operator ``torch.ops.rankwise.<name>`` (``torch.library.custom_op`` with a
``register_fake`` shape function, and ``register_autograd`` where the operator has a backward
kernel), which the compiled graph keeps as one opaque node.

Registering an operator is not free (schema parsing, dispatcher entries), so they are registered
lazily, all at once, the first time a trace reaches one (:func:`_register_all`, evaluated eagerly
by the tracer as a constant): ``import rankwise`` stays fast.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

__all__ = ["KernelOp", "constant_result", "traced_usable"]

_OPS: list[KernelOp] = []

_F = TypeVar("_F", bound=Callable[..., Any])


def constant_result(fn: _F) -> _F:
    """``torch.compiler.assume_constant_result(fn)`` (the tracer calls ``fn`` eagerly and keeps its
    result as a constant) without importing ``torch._dynamo`` at import time (seconds): the mark is
    the attribute that function sets (a test checks that they agree)."""
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn


class KernelOp:
    """One kernel entry point: ``impl`` eagerly, ``torch.ops.rankwise.<name>`` when traced.

    ``schema``: the operator's schema without the name (e.g. ``"(Tensor x, float eps) -> Tensor"``);
    ``fake``: outputs of the right shapes and dtypes for fake (meta) inputs; ``backward`` and
    ``setup_context``: as ``torch.library.register_autograd`` takes them (optional); ``mutates``: the
    arguments written in place (marked ``Tensor(a!)`` in the schema too); ``device_types``: where
    the implementation runs (``None``: every device, e.g. Triton kernels, which run on CUDA and, under
    the Triton interpreter, on CPU).
    """

    def __init__(
        self,
        name: str,
        schema: str,
        impl: Callable[..., Any],
        fake: Callable[..., Any],
        *,
        backward: Callable[..., Any] | None = None,
        setup_context: Callable[..., Any] | None = None,
        mutates: tuple[str, ...] = (),
        device_types: str | None = "cpu",
    ) -> None:
        self.name, self.schema, self.impl, self.fake = name, schema, impl, fake
        self.backward, self.setup_context, self.mutates = backward, setup_context, mutates
        self.device_types = device_types
        self.__doc__ = impl.__doc__
        self.registered = False
        _OPS.append(self)

    def __call__(self, *args: Any) -> Any:
        if torch.compiler.is_compiling():
            _register_all()
            return getattr(torch.ops.rankwise, self.name)(*args)
        return self.impl(*args)

    def op(self) -> Any:
        """The registered operator (registering every kernel operator now if needed)."""
        _register_all()
        return getattr(torch.ops.rankwise, self.name)


@constant_result
def _register_all() -> bool:
    """Register every :class:`KernelOp` as ``torch.ops.rankwise.<name>`` (once)."""
    for k in _OPS:
        if not k.registered:
            op = torch.library.custom_op(
                f"rankwise::{k.name}", k.impl, mutates_args=k.mutates, device_types=k.device_types, schema=k.schema
            )
            op.register_fake(k.fake)
            if k.backward is not None:
                op.register_autograd(k.backward, setup_context=k.setup_context)
            k.registered = True
    return True


@constant_result
def traced_usable() -> bool:
    """Whether a traced call should take the kernels (numba importable and ``RANKWISE_NUMBA`` not
    "off"): a constant of the trace, so the compiled graph holds the kernel operators; the kernels
    load (and wait) when the compiled code first runs."""
    from rankwise._kernels import _loader

    return _loader.usable()
