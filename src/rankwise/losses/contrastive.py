"""Contrastive losses: SupCon / SimCLR, triplet, N-pairs, Rank-N-Contrast and ConR.

Implementations live in private modules (``_supcon``, ``_pairs``, ``_regression_contrastive``);
this module re-exports their public names.
"""

from rankwise.losses._pairs import NPairsLoss, TripletLoss, npairs_loss, triplet_loss
from rankwise.losses._regression_contrastive import ConRLoss, RnCLoss, conr_loss, rnc_loss
from rankwise.losses._supcon import SupConLoss, supcon_loss

__all__ = [
    "ConRLoss",
    "NPairsLoss",
    "RnCLoss",
    "SupConLoss",
    "TripletLoss",
    "conr_loss",
    "npairs_loss",
    "rnc_loss",
    "supcon_loss",
    "triplet_loss",
]
