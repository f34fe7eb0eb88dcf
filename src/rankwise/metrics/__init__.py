"""Evaluation metrics of rankings (learning to rank: NDCG, MRR, MAP@k on padded (batch, list)
tensors), of retrieval (Recall@k, MAP@R, R-precision of embeddings) and of ordinal predictions (MAE,
accuracies, weighted kappa, Spearman, Kendall) and top-k accuracy of class scores.

The streaming ordinal metrics (torchmetrics, exact under DDP) live in :mod:`rankwise.metrics.streaming`;
``rankwise.metrics.OrdinalMetrics`` and ``rankwise.metrics.real_sample_mask`` import it on first use
(torchmetrics is a training dependency, not a core one, so they are not in ``__all__``)."""

from typing import Any

from rankwise.metrics.classification import *  # noqa: F403
from rankwise.metrics.classification import __all__ as _classification_all
from rankwise.metrics.learning_to_rank import *  # noqa: F403
from rankwise.metrics.learning_to_rank import __all__ as _ltr_all
from rankwise.metrics.ordinal import *  # noqa: F403
from rankwise.metrics.ordinal import __all__ as _ordinal_all
from rankwise.metrics.retrieval import *  # noqa: F403
from rankwise.metrics.retrieval import __all__ as _retrieval_all

__all__ = [*_ltr_all, *_ordinal_all, *_retrieval_all, *_classification_all]

_STREAMING = ("OrdinalMetrics", "real_sample_mask")


def __getattr__(name: str) -> Any:
    if name in _STREAMING:
        from rankwise.metrics import streaming

        return getattr(streaming, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
