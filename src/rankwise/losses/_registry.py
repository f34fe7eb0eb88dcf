"""The loss registry: ``register_loss`` / ``get_loss`` / ``list_losses``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rankwise._registry import Registry, RegistryEntry

__all__ = ["LOSSES", "get_loss", "get_loss_entry", "list_losses", "register_loss"]

LOSSES: Registry[Callable[..., Any]] = Registry("loss")

register_loss = LOSSES.register


def get_loss(name: str) -> Callable[..., Any]:
    """Return the loss function registered as ``name`` (``ValueError`` listing valid names otherwise)."""
    return LOSSES.get(name)


def get_loss_entry(name: str) -> RegistryEntry:
    return LOSSES.entry(name)


def list_losses() -> list[str]:
    """Names of all registered losses, sorted."""
    return LOSSES.names()
