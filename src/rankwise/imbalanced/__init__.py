"""Deep imbalanced regression toolkit: weighted/focal losses, LDS, FDS, Balanced MSE's label densities, shot metrics."""

from rankwise.imbalanced.fds import *  # noqa: F403
from rankwise.imbalanced.fds import __all__ as _fds_all
from rankwise.imbalanced.label_density import *  # noqa: F403
from rankwise.imbalanced.label_density import __all__ as _density_all
from rankwise.imbalanced.lds import *  # noqa: F403
from rankwise.imbalanced.lds import __all__ as _lds_all
from rankwise.imbalanced.losses import *  # noqa: F403
from rankwise.imbalanced.losses import __all__ as _losses_all
from rankwise.imbalanced.metrics import *  # noqa: F403
from rankwise.imbalanced.metrics import __all__ as _metrics_all

__all__ = [*_losses_all, *_lds_all, *_density_all, *_fds_all, *_metrics_all]
