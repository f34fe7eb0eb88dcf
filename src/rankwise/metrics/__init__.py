"""Evaluation metrics of rankings and retrieval."""

from rankwise.metrics.retrieval import *  # noqa: F403
from rankwise.metrics.retrieval import __all__ as _retrieval_all

__all__ = [*_retrieval_all]
