"""Rank-based, contrastive and imbalanced-regression losses."""

from rankwise.losses._registry import LOSSES, get_loss, get_loss_entry, list_losses, register_loss

__all__ = ["LOSSES", "get_loss", "get_loss_entry", "list_losses", "register_loss"]
