"""Evaluation metrics of rankings (learning to rank: NDCG, MRR, MAP@k on padded (batch, list)
tensors) and of retrieval (Recall@k, MAP@R, R-precision of embeddings)."""

from rankwise.metrics.learning_to_rank import *  # noqa: F403
from rankwise.metrics.learning_to_rank import __all__ as _ltr_all
from rankwise.metrics.ordinal import *  # noqa: F403
from rankwise.metrics.ordinal import __all__ as _ordinal_all
from rankwise.metrics.retrieval import *  # noqa: F403
from rankwise.metrics.retrieval import __all__ as _retrieval_all

__all__ = [*_ltr_all, *_ordinal_all, *_retrieval_all]
