"""rankwise: learn representations whose order matches the order of the labels.

The package loads lazily (PEP 562): ``import rankwise`` imports nothing else, so that the
``rankwise`` command starts without importing torch; the first access to an operator, a loss or a
subpackage (``rankwise.rank``, ``rankwise.losses``, ...) imports the operators, losses and
SoDeep sorters, which register themselves, exactly as an eager import would.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: subpackages importable as attributes (``rankwise.data``, ...)
_SUBPACKAGES = ("data", "distributed", "imbalanced", "losses", "metrics", "models", "ops", "recipes", "sodeep")
_FROM_LOSSES = ("get_loss", "list_losses", "register_loss")
#: brain-age helpers re-exported at the top level (``rankwise.discretize_age``, ...)
_FROM_BRAIN_AGE = ("correct_age_bias", "discretize_age")

if TYPE_CHECKING:  # what the lazy loader provides, for type checkers and IDEs
    from rankwise import losses as losses
    from rankwise import ops as ops
    from rankwise.brain_age import correct_age_bias as correct_age_bias
    from rankwise.brain_age import discretize_age as discretize_age
    from rankwise.losses import get_loss as get_loss
    from rankwise.losses import list_losses as list_losses
    from rankwise.losses import register_loss as register_loss
    from rankwise.ops import *  # noqa: F403
    from rankwise.sodeep import sodeep_sorter as sodeep_sorter


def _load() -> list[str]:
    """Import the operators, losses and SoDeep sorters (they register themselves) and bind the
    top-level names; returns the operator names re-exported at the top level."""
    ops = importlib.import_module("rankwise.ops")
    losses = importlib.import_module("rankwise.losses")
    sodeep = importlib.import_module("rankwise.sodeep.hub")  # registers soft_rank(method="sodeep")
    names: list[str] = list(ops.__all__)
    g = globals()
    g.update({name: getattr(ops, name) for name in names})
    g.update({name: getattr(losses, name) for name in _FROM_LOSSES})
    g.update(ops=ops, losses=losses, sodeep_sorter=sodeep.sodeep_sorter)
    return names


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        if name in ("ops", "losses"):
            _load()
        return importlib.import_module(f"rankwise.{name}")
    if name == "__all__":
        return _all()
    if name.startswith("__"):
        raise AttributeError(f"module 'rankwise' has no attribute {name!r}")
    if name in _FROM_BRAIN_AGE:
        return getattr(importlib.import_module("rankwise.brain_age"), name)
    if name in _load() or name in _FROM_LOSSES or name == "sodeep_sorter":
        return globals()[name]
    raise AttributeError(f"module 'rankwise' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_SUBPACKAGES, *_FROM_LOSSES, *_FROM_BRAIN_AGE, "sodeep_sorter", *_load()})


def _all() -> list[str]:
    return [
        "__version__",
        *_FROM_BRAIN_AGE,
        "get_loss",
        "list_losses",
        "losses",
        "ops",
        "register_loss",
        "sodeep_sorter",
        *_load(),
    ]
