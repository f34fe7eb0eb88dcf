"""Differentiable top-k and NeuralSort kNN.

PLACEHOLDER — being implemented (see issue "Foundation"). Public contract below is fixed.
"""

from __future__ import annotations

import torch

__all__ = ["dknn", "soft_topk"]


def soft_topk(scores: torch.Tensor, k: int, *, tau: float = 1.0, dim: int = -1) -> torch.Tensor:
    raise NotImplementedError


def dknn(query: torch.Tensor, neighbors: torch.Tensor, k: int, *, tau: float = 1.0,
         method: str = "deterministic", n_samples: int = 1) -> torch.Tensor:
    raise NotImplementedError
