"""The progress bar of a training stage: epochs counted from 1, as the per-epoch lines count them."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import RichProgressBar

__all__ = ["EpochProgressBar"]


class EpochProgressBar(RichProgressBar):  # type: ignore[misc]
    """Lightning's rich progress bar reading ``Epoch k/N`` for the k-th of N epochs (Lightning shows ``k-1/N-1``)."""

    def _get_train_description(self, current_epoch: int) -> str:
        trainer: Any = self.trainer
        text = f"Epoch {current_epoch + 1}"
        if trainer.max_epochs is not None and trainer.max_epochs >= 0:
            text += f"/{trainer.max_epochs}"
        width = len(self.validation_description)
        return f"{text:{width}}" if width > len(text) else text
