"""Rank-based, contrastive and imbalanced-regression losses."""

from rankwise.losses._registry import LOSSES, get_loss, get_loss_entry, list_losses, register_loss
from rankwise.losses.balanced_mse import *  # noqa: F403
from rankwise.losses.balanced_mse import __all__ as _bmse_all
from rankwise.losses.contrastive import *  # noqa: F403
from rankwise.losses.contrastive import __all__ as _contrastive_all
from rankwise.losses.label_distribution import *  # noqa: F403
from rankwise.losses.label_distribution import __all__ as _label_distribution_all
from rankwise.losses.learning_to_rank import *  # noqa: F403
from rankwise.losses.learning_to_rank import __all__ as _ltr_all
from rankwise.losses.ordinal import *  # noqa: F403
from rankwise.losses.ordinal import __all__ as _ordinal_all
from rankwise.losses.ordinal_regression import *  # noqa: F403
from rankwise.losses.ordinal_regression import __all__ as _ordinal_regression_all
from rankwise.losses.ranking import *  # noqa: F403
from rankwise.losses.ranking import __all__ as _ranking_all
from rankwise.losses.retrieval import *  # noqa: F403
from rankwise.losses.retrieval import __all__ as _retrieval_all
from rankwise.losses.topk_classification import *  # noqa: F403
from rankwise.losses.topk_classification import __all__ as _topk_all

from rankwise.imbalanced.losses import *  # noqa: F403  isort: skip
from rankwise.imbalanced.losses import __all__ as _imb_all  # isort: skip
from rankwise.losses import _regression  # noqa: F401  registers regression_* (isort: skip)

__all__ = [
    "LOSSES",
    "get_loss",
    "get_loss_entry",
    "list_losses",
    "register_loss",
    *_ranking_all,
    *_contrastive_all,
    *_retrieval_all,
    *_imb_all,
    *_bmse_all,
    *_ltr_all,
    *_ordinal_all,
    *_label_distribution_all,
    *_ordinal_regression_all,
    *_topk_all,
]
