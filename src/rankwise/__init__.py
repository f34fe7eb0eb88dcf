"""rankwise: learn representations whose order matches the order of the labels."""

from rankwise import losses, ops
from rankwise.losses import get_loss, list_losses, register_loss
from rankwise.ops import *  # noqa: F403
from rankwise.ops import __all__ as _ops_all
from rankwise.sodeep import sodeep_sorter  # also registers soft_rank(method="sodeep")

__version__ = "0.1.0"

__all__ = ["__version__", "get_loss", "list_losses", "losses", "ops", "register_loss", "sodeep_sorter", *_ops_all]
