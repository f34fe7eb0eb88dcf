"""Relaxed permutation matrices: NeuralSort (deterministic, stochastic) and SoftSort.

PLACEHOLDER — being implemented (see issue "Foundation"). Public contract below is fixed.
"""

from __future__ import annotations

import torch

__all__ = ["neural_sort", "softsort_matrix", "stochastic_neural_sort"]


def neural_sort(scores: torch.Tensor, *, tau: float = 1.0, hard: bool = False, dim: int = -1) -> torch.Tensor:
    raise NotImplementedError


def stochastic_neural_sort(scores: torch.Tensor, *, tau: float = 1.0, hard: bool = False, n_samples: int = 1,
                           generator: torch.Generator | None = None, log_scores: bool = False) -> torch.Tensor:
    raise NotImplementedError


def softsort_matrix(scores: torch.Tensor, *, tau: float = 1.0, power: float = 1.0, hard: bool = False,
                    dim: int = -1) -> torch.Tensor:
    raise NotImplementedError
