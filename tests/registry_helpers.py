"""Shared by the registry-wide tests (conformance, properties, compile, CUDA)."""

from __future__ import annotations

from typing import Any

import torch


def tensors(out: Any) -> list[torch.Tensor]:
    """The tensors of an op's or loss's output (a tensor, or nested tuples / lists / dicts of them)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in tensors(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in tensors(o)]
    return []
