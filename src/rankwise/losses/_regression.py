"""Registry entries of the DIR regression losses (``rankwise.imbalanced.regression_loss``, one per kind).

They are registered here, in ``rankwise.losses`` (which imports ``rankwise.imbalanced``), so that
``rankwise.imbalanced`` never imports upward into ``rankwise.losses``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

from rankwise.imbalanced.losses import REGRESSION_KINDS, RegressionLoss, regression_loss
from rankwise.losses._registry import register_loss

#: what a training recipe passes (the per-sample LDS weights may be None)
_INPUTS = {"pred": "predictions", "target": "targets", "weights": "weights"}


def _of_kind(kind: str) -> Callable[..., torch.Tensor]:
    """``regression_loss`` with ``kind`` as the default of its ``kind`` option (the function of the entry
    ``regression_<kind>``: the name gives that loss)."""

    @functools.wraps(regression_loss)
    def loss(*args: Any, **kwargs: Any) -> torch.Tensor:
        kwargs.setdefault("kind", kind)
        return regression_loss(*args, **kwargs)

    sig = inspect.signature(regression_loss)
    loss.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[p.replace(default=kind) if p.name == "kind" else p for p in sig.parameters.values()]
    )
    loss.__name__ = loss.__qualname__ = f"regression_{kind}_loss"
    return loss


for _kind in REGRESSION_KINDS:
    register_loss(
        f"regression_{_kind}",
        module=functools.partial(RegressionLoss, kind=_kind),  # type: ignore[arg-type]  # the twin of this kind
        inputs=_INPUTS,
        takes="predictions",
        description=f"DIR weighted {_kind} regression loss: regression_loss(..., kind={_kind!r})",
    )(_of_kind(_kind))
