"""The operator registry: ``register_op`` / ``get_op`` / ``list_ops``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rankwise._registry import Registry, RegistryEntry

__all__ = ["OPS", "get_op", "get_op_entry", "list_ops", "register_op"]

OPS: Registry[Callable[..., Any]] = Registry("operator")

register_op = OPS.register


def _load_plugins() -> None:
    from rankwise.ops.soft import load_plugins  # operators registered from outside rankwise.ops

    load_plugins()


def get_op(name: str) -> Callable[..., Any]:
    """Return the function registered as ``name`` (``ValueError`` listing valid names otherwise)."""
    _load_plugins()
    return OPS.get(name)


def get_op_entry(name: str) -> RegistryEntry:
    _load_plugins()
    return OPS.entry(name)


def list_ops() -> list[str]:
    """Names of all registered operators, sorted."""
    _load_plugins()
    return OPS.names()
