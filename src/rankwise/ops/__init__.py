"""Sorting and ranking operators (exact, blackbox, and relaxed)."""

from rankwise.ops._registry import OPS, get_op, get_op_entry, list_ops, register_op
from rankwise.ops.ranking import BlackboxRank, Rank, blackbox_rank, rank
from rankwise.ops.soft import SoftRank, SoftSort, list_soft_methods, register_soft_method, soft_rank, soft_sort

# implementations register themselves (ops registry and soft methods) on import
from rankwise.ops import isotonic as _isotonic  # noqa: F401  isort: skip
from rankwise.ops.permutation import *  # noqa: F403  isort: skip
from rankwise.ops.permutation import __all__ as _perm_all  # isort: skip
from rankwise.ops.topk import *  # noqa: F403  isort: skip
from rankwise.ops.topk import __all__ as _topk_all  # isort: skip
from rankwise.ops.isotonic import *  # noqa: F403  isort: skip
from rankwise.ops.isotonic import __all__ as _iso_all  # isort: skip
from rankwise.ops.sinkhorn import *  # noqa: F403  isort: skip
from rankwise.ops.sinkhorn import __all__ as _sinkhorn_all  # isort: skip
from rankwise.ops.sorting_network import *  # noqa: F403  isort: skip
from rankwise.ops.sorting_network import __all__ as _sortnet_all  # isort: skip
from rankwise.ops.perturbed import *  # noqa: F403  isort: skip
from rankwise.ops.perturbed import __all__ as _perturbed_all  # isort: skip
from rankwise.ops.lapsum import *  # noqa: F403  isort: skip
from rankwise.ops.lapsum import __all__ as _lapsum_all  # isort: skip
from rankwise.ops.gumbel_sinkhorn import *  # noqa: F403  isort: skip
from rankwise.ops.gumbel_sinkhorn import __all__ as _gs_all  # isort: skip

__all__ = [
    "OPS",
    "BlackboxRank",
    "Rank",
    "SoftRank",
    "SoftSort",
    "blackbox_rank",
    "get_op",
    "get_op_entry",
    "list_ops",
    "list_soft_methods",
    "rank",
    "register_op",
    "register_soft_method",
    "soft_rank",
    "soft_sort",
    *_perm_all,
    *_topk_all,
    *_iso_all,
    *_sinkhorn_all,
    *_sortnet_all,
    *_perturbed_all,
    *_lapsum_all,
    *_gs_all,
]
