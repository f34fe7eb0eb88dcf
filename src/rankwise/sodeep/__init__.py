"""SoDeep (Engilberge et al., CVPR'19): learned differentiable sorters, trained by rankwise and bundled.

* :func:`sodeep_sorter` — load a bundled sorter (bidirectional GRU, ``seq_len`` 32 / 64 / 128);
* :func:`sodeep_rank` / ``rankwise.soft_rank(x, method="sodeep")`` — differentiable ranks 1..n;
* :class:`RNNSorter`, :class:`MLPSorter`, :class:`ExactSorter` — the architectures;
* :mod:`rankwise.sodeep.data` — synthetic training sequences;
* :func:`train_sorter` / :func:`evaluate_sorter` (``rankwise.sodeep.train``, needs Lightning) and the
  CLI ``python -m rankwise.sodeep.cli train|evaluate`` (``rankwise sodeep ...``);
* :class:`SorterUpdater` — refine a sorter on the inputs it sees during training.

Importing this package needs torch only (Lightning is imported inside :func:`train_sorter`).
"""

from typing import Any

from rankwise.sodeep.data import FAMILIES, generate, mixed_batch
from rankwise.sodeep.hub import SodeepRank, available_sorters, sodeep_rank, sodeep_sorter
from rankwise.sodeep.models import ExactSorter, MLPSorter, RNNSorter, Sorter, build_sorter, standardize
from rankwise.sodeep.updater import SorterUpdater
from rankwise.sodeep.weights_io import BUNDLED_SEQ_LENS, load_sorter, save_sorter

__all__ = [
    "BUNDLED_SEQ_LENS",
    "FAMILIES",
    "ExactSorter",
    "MLPSorter",
    "RNNSorter",
    "SodeepRank",
    "Sorter",
    "SorterUpdater",
    "available_sorters",
    "build_sorter",
    "evaluate_sorter",
    "generate",
    "load_sorter",
    "mixed_batch",
    "save_sorter",
    "sodeep_rank",
    "sodeep_sorter",
    "standardize",
    "train_sorter",
]


def __getattr__(name: str) -> Any:
    # training / evaluation live in rankwise.sodeep.train (Lightning and sklearn imported lazily there)
    if name in ("train_sorter", "evaluate_sorter"):
        from rankwise.sodeep import train

        return getattr(train, name)
    raise AttributeError(f"module 'rankwise.sodeep' has no attribute {name!r}")
