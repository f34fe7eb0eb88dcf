"""What rankwise's Lightning trainers share (the run lifecycle of ``rankwise.recipes`` and the SoDeep sorter
training of ``rankwise.sodeep``): Lightning's console output reduced to what concerns the user."""

from __future__ import annotations

import logging
import warnings

__all__ = ["quiet_lightning"]


def quiet_lightning() -> None:
    """Silence what is not the user's concern: Lightning's info lines and tips, and known warnings."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for pattern in (
        ".*does not have many workers.*",
        ".*Checkpoint directory.*exists and is not empty.*",
        ".*number of training batches.*",
        ".*LeafSpec.*",
        ".*isinstance.*treespec.*",
        ".*is_leaf.*",
        ".*You are using a CUDA device.*",
        ".*GPU available but not used.*",
    ):
        warnings.filterwarnings("ignore", message=pattern)
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.utils\._pytree")
