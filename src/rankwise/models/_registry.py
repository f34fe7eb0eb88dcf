"""Backbone registry: ``build_backbone(kind, **options) -> (module, feature_dim)``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from torch import nn

from rankwise._registry import Registry

__all__ = ["BACKBONES", "backbone_info", "build_backbone", "list_backbones", "register_backbone"]

F = TypeVar("F", bound=Callable[..., Any])

BACKBONES: Registry[Callable[..., Any]] = Registry("backbone")


def register_backbone(name: str, *, description: str = "") -> Callable[[F], F]:
    """Decorator registering a factory ``fn(**options) -> (nn.Module, feature_dim)``."""
    return BACKBONES.register(name, gradient="none", description=description)  # type: ignore[return-value]


def build_backbone(kind: str, **options: Any) -> tuple[nn.Module, int]:
    """Build the registered backbone ``kind``: returns ``(module, feature_dim)``.

    ``module(x)`` maps a batch to features of shape ``(B, feature_dim)``. Kinds: ``"mlp"``
    (tabular, needs ``in_dim``), ``"resnet18"``/``"resnet34"``/``"resnet50"`` (images),
    ``"small_cnn"`` (small grey images), ``"text_pair"`` (sentence pairs, needs ``vocab_size``).

    Example:
        >>> import torch
        >>> net, dim = build_backbone("mlp", in_dim=10, feature_dim=32)
        >>> net(torch.randn(4, 10)).shape, dim
        (torch.Size([4, 32]), 32)
    """
    return BACKBONES.get(kind)(**options)


def list_backbones() -> list[str]:
    """Names of the registered backbones, sorted."""
    return BACKBONES.names()


def backbone_info(kind: str) -> str:
    """The factory's docstring."""
    return inspect.cleandoc(BACKBONES.get(kind).__doc__ or kind)
