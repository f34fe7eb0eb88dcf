"""The Lightning module of the regression recipes: :class:`DIRRegressor` trains a
:class:`~rankwise.recipes.regression.net.DIRNet`.

The network, its state dict and its prediction are those of :class:`DIRNet` (plain torch); this
class adds the training, validation and prediction steps of the Lightning loops. Only training
imports it: evaluation and prediction rebuild the plain network
(:mod:`rankwise.recipes.regression.predict`).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import numpy as np
import torch
from torchmetrics import MeanAbsoluteError

from rankwise.recipes.common import check_finite, reseed
from rankwise.recipes.config import Config
from rankwise.recipes.eval_metrics import GeometricMeanAbsoluteError, shard_keep_mask, val_sampler
from rankwise.recipes.loss_terms import Objective
from rankwise.recipes.optim import configure
from rankwise.recipes.regression.net import DIRNet, ordinal_loss_tensors

__all__ = ["DIRRegressor"]


class DIRRegressor(DIRNet, L.LightningModule):
    """:class:`~rankwise.recipes.regression.net.DIRNet` (same arguments) trained with the DIR loss stack of
    ``cfg.loss`` as a LightningModule: training and validation steps, FDS statistics, optimizers."""

    def __init__(
        self,
        cfg: Config,
        *,
        input_dim: int | None = None,
        bin_width: float = 1.0,
        train_labels: np.ndarray | None = None,
        meta: dict[str, Any] | None = None,
        freeze_backbone: bool = False,
    ) -> None:
        super().__init__(
            cfg,
            input_dim=input_dim,
            bin_width=bin_width,
            train_labels=train_labels,
            meta=meta,
            freeze_backbone=freeze_backbone,
        )
        self.hparams.update({"input_dim": input_dim, "bin_width": float(bin_width), "freeze_backbone": freeze_backbone})
        self._fds_feats: list[torch.Tensor] = []
        self._fds_labels: list[torch.Tensor] = []
        #: the task loss plus the weighted regularizers (both stay submodules of the network)
        self.objective = Objective(self.task_loss, self.regularizers)
        # sums and counts over every rank, each validation sample once (rankwise.recipes.eval_metrics)
        self.val_mae = MeanAbsoluteError().set_dtype(torch.float64)
        self.val_gm = GeometricMeanAbsoluteError()
        self._val_seen = 0

    # ------------------------------------------------------------------ training
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        reseed(self.cfg.run.seed, self.global_step, self.global_rank)

    def on_train_epoch_start(self) -> None:
        if self.freeze_backbone:
            self.backbone.eval()
        self._fds_feats, self._fds_labels = [], []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        y = y.reshape(-1).float()
        encoded = self.features(x)
        feats = encoded
        if self.fds is not None:
            self._fds_feats.append(encoded.detach())
            self._fds_labels.append(y.detach())
            feats = self.fds(encoded, y, self.current_epoch)
        pred, logits = self.head_outputs(feats)
        w = self.sample_weights(y)
        # regularizers on the features (RankSim, ConR) see the ENCODER output, before FDS smoothing, as
        # in RankSim's reference (agedb-dir/train.py: the regularizer takes the encoding, FDS then smooths
        # it for the regressor); the head and the task loss see the smoothed features
        tensors = {"features": encoded, "predictions": pred, "targets": y, "weights": w}
        if logits is not None and self.label_classes is not None:  # an ordinal head: logits, classes, levels
            k = self.label_classes.num_classes
            tensors.update(ordinal_loss_tensors(self.task_loss, logits, self.label_class(y), k))
        value = self.objective(tensors)
        task = value.parts[self.objective.task.name]
        check_finite(
            value.total,
            self,
            "training",
            lambda: f"task loss {task.detach().item():.4g}; try a smaller learning rate or regularizer weight",
        )
        self.objective.log(self, value, batch_size=y.numel())
        return value.total

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # FDS statistics are refreshed from the whole epoch's features at its last batch, i.e.
        # before validation and the epoch-end checkpoint, so a resumed run sees the same state.
        if self.fds is None or batch_idx + 1 != self.trainer.num_training_batches:
            return
        if self._fds_feats:
            feats = torch.cat(self._fds_feats)
            labels = torch.cat(self._fds_labels)
            # sync: per-bin sums are all-reduced over the ranks of a DDP run (no-op in a single process)
            self.fds.update(feats, labels, self.current_epoch, sync=True)  # type: ignore[operator]
        self._fds_feats, self._fds_labels = [], []

    # ------------------------------------------------------------------ validation / prediction
    def on_validation_epoch_start(self) -> None:
        self._val_seen = 0

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        y = y.reshape(-1).float()
        pred = self(x).detach().float().reshape(-1)
        # a sample the DistributedSampler repeats to even out the shards counts once
        keep = shard_keep_mask(val_sampler(self.trainer), self._val_seen, y.numel(), y.device)
        self._val_seen += y.numel()
        self.val_mae.update(pred[keep], y[keep])
        self.val_gm.update(pred[keep], y[keep])
        # Metric objects: Lightning computes them over the whole split at the epoch's end and resets them
        self.log("val/mae", self.val_mae, prog_bar=True, on_step=False, on_epoch=True)
        self.log("val/gm", self.val_gm, on_step=False, on_epoch=True)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> dict[str, torch.Tensor]:
        return self.predict_batch(batch)

    def configure_optimizers(self) -> Any:
        return configure(self, self.cfg.optimizer, self.cfg.schedule)
