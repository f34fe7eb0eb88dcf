"""Registry entries of the DIR regression losses (``rankwise.imbalanced.regression_loss``, one per kind).

They are registered here, in ``rankwise.losses`` (which imports ``rankwise.imbalanced``), so that
``rankwise.imbalanced`` never imports upward into ``rankwise.losses``.
"""

from __future__ import annotations

import functools

from rankwise.imbalanced.losses import REGRESSION_KINDS, RegressionLoss, regression_loss
from rankwise.losses._registry import register_loss

#: what a training recipe passes (the per-sample LDS weights may be None)
_INPUTS = {"pred": "predictions", "target": "targets", "weights": "weights"}

for _kind in REGRESSION_KINDS:
    register_loss(
        f"regression_{_kind}",
        module=functools.partial(RegressionLoss, kind=_kind),  # type: ignore[arg-type]  # the twin of this kind
        inputs=_INPUTS,
        description=f"DIR weighted {_kind} regression loss: regression_loss(..., kind={_kind!r})",
    )(regression_loss)
