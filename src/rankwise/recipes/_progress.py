"""Progress callbacks of a training stage: the progress bar (epochs counted from 1, as the per-epoch
lines count them) and the step timer of the recipes that report seconds per step."""

from __future__ import annotations

import time
from typing import Any

from lightning.pytorch.callbacks import Callback, RichProgressBar

__all__ = ["EpochProgressBar", "StepTimer"]


class EpochProgressBar(RichProgressBar):  # type: ignore[misc]
    """Lightning's rich progress bar reading ``Epoch k/N`` for the k-th of N epochs (Lightning shows ``k-1/N-1``)."""

    def _get_train_description(self, current_epoch: int) -> str:
        trainer: Any = self.trainer
        text = f"Epoch {current_epoch + 1}"
        if trainer.max_epochs is not None and trainer.max_epochs >= 0:
            text += f"/{trainer.max_epochs}"
        width = len(self.validation_description)
        return f"{text:{width}}" if width > len(text) else text


class StepTimer(Callback):  # type: ignore[misc]
    """Wall seconds of the training steps (forward, backward, optimizer; no validation, no data loading)."""

    def __init__(self) -> None:
        self.seconds, self.steps, self._t0 = 0.0, 0, 0.0

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.seconds += time.perf_counter() - self._t0
        self.steps += 1
