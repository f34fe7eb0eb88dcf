"""SoDeep (Engilberge et al., CVPR'19): learned differentiable sorters, trained by rankwise and bundled.

* :func:`sodeep_sorter` — load a bundled sorter (bidirectional GRU, ``seq_len`` 32 / 64 / 128);
* :func:`sodeep_rank` / ``rankwise.soft_rank(x, method="sodeep")`` — differentiable ranks 1..n;
* :class:`RNNSorter`, :class:`MLPSorter`, :class:`ExactSorter` — the architectures;
* :mod:`rankwise.sodeep.data` — synthetic training sequences;
* :func:`train_sorter` / :func:`evaluate_sorter` (``rankwise.sodeep.train``, needs Lightning) and the
  CLI ``python -m rankwise.sodeep.cli train|evaluate`` (``rankwise sodeep ...``);
* :class:`SorterUpdater` — refine a sorter on the inputs it sees during training.

Importing this package imports nothing else: each name loads its module (torch) on first use, and
Lightning is imported inside :func:`train_sorter` only.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankwise.sodeep.data import FAMILIES as FAMILIES
    from rankwise.sodeep.data import generate as generate
    from rankwise.sodeep.data import mixed_batch as mixed_batch
    from rankwise.sodeep.hub import SodeepRank as SodeepRank
    from rankwise.sodeep.hub import available_sorters as available_sorters
    from rankwise.sodeep.hub import sodeep_rank as sodeep_rank
    from rankwise.sodeep.hub import sodeep_sorter as sodeep_sorter
    from rankwise.sodeep.models import ExactSorter as ExactSorter
    from rankwise.sodeep.models import MLPSorter as MLPSorter
    from rankwise.sodeep.models import RNNSorter as RNNSorter
    from rankwise.sodeep.models import Sorter as Sorter
    from rankwise.sodeep.models import build_sorter as build_sorter
    from rankwise.sodeep.models import standardize as standardize
    from rankwise.sodeep.train import evaluate_sorter as evaluate_sorter
    from rankwise.sodeep.train import train_sorter as train_sorter
    from rankwise.sodeep.updater import SorterUpdater as SorterUpdater
    from rankwise.sodeep.weights_io import BUNDLED_SEQ_LENS as BUNDLED_SEQ_LENS
    from rankwise.sodeep.weights_io import load_sorter as load_sorter
    from rankwise.sodeep.weights_io import save_sorter as save_sorter

#: where each public name lives; loaded on first access (PEP 562), so that ``rankwise.sodeep.cli``
#: (the ``rankwise sodeep`` command) starts without importing torch. ``rankwise.soft_rank(x,
#: method="sodeep")`` imports :mod:`rankwise.sodeep.hub` (which registers the method) when needed.
_LOCATIONS = {
    "FAMILIES": "data",
    "generate": "data",
    "mixed_batch": "data",
    "SodeepRank": "hub",
    "available_sorters": "hub",
    "sodeep_rank": "hub",
    "sodeep_sorter": "hub",
    "ExactSorter": "models",
    "MLPSorter": "models",
    "RNNSorter": "models",
    "Sorter": "models",
    "build_sorter": "models",
    "standardize": "models",
    "SorterUpdater": "updater",
    "BUNDLED_SEQ_LENS": "weights_io",
    "load_sorter": "weights_io",
    "save_sorter": "weights_io",
    # training / evaluation: Lightning and sklearn are imported inside these functions
    "train_sorter": "train",
    "evaluate_sorter": "train",
}

__all__ = sorted(_LOCATIONS)


def __getattr__(name: str) -> Any:
    if name in _LOCATIONS:
        value = getattr(importlib.import_module(f"rankwise.sodeep.{_LOCATIONS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rankwise.sodeep' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LOCATIONS})
