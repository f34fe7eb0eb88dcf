"""Evaluation metrics (not differentiable): learning-to-rank metrics on padded (batch, list) tensors."""

from rankwise.metrics.learning_to_rank import *  # noqa: F403
from rankwise.metrics.learning_to_rank import __all__ as _ltr_all

__all__ = [*_ltr_all]
