"""Rank-N-Contrast (Zha et al., NeurIPS'23), ``recipe: rnc``: contrastive pretraining, then a linear regressor.

Stage 1 (``pretrain``, ``task.pretrain_epochs``): :class:`RnCPretrainer` trains the backbone with
:func:`rankwise.losses.rnc_loss` on two augmented views of every example (tabular: Gaussian noise
``task.noise`` + feature dropout ``task.feature_dropout``; images: random horizontal flip + the
same noise), over the global batch under DDP; a :class:`~rankwise.recipes.stages.Stage` named
``pretrain`` (checkpoints in ``RUN_DIR/pretrain/``, log in ``logs/pretrain`` with the loss as
``pretrain/loss`` and ``pretrain/loss/rnc``, ``pretrain/done``
once finished) handing its last weights on. Stage 2: the DIR regressor of
:mod:`rankwise.recipes.regression.recipe` on the frozen pretrained backbone, trained and evaluated as
``dir`` (``trainer.max_epochs``, the ``loss`` section).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from pydantic import Field

from rankwise.recipes.common import build_backbone, check_finite, regression_loaders, reseed
from rankwise.recipes.config import Config, ConfigError
from rankwise.recipes.datamodules import LoaderData
from rankwise.recipes.loss_terms import Objective, build_term
from rankwise.recipes.optim import configure
from rankwise.recipes.registry import register_recipe
from rankwise.recipes.regression.recipe import DIROptions, DIRRecipe, build_regressor, fit_regressor
from rankwise.recipes.rundir import Run
from rankwise.recipes.rundir._record import KIND_OF_MODALITY
from rankwise.recipes.stages import Stage

__all__ = ["RnCOptions", "RnCPretrainer", "RnCRecipe"]


class RnCOptions(DIROptions):
    """Rank-N-Contrast stage 1 (contrastive pretraining); stage 2 (the regressor) uses ``trainer``/``optimizer``/
    ``loss`` and the LDS/FDS options below."""

    pretrain_epochs: int = Field(20, description="epochs of contrastive pretraining", ge=1)
    temperature: float = Field(2.0, description="rnc_loss temperature", gt=0)
    lr: float | None = Field(None, description="pretraining learning rate (default optimizer.lr)", gt=0)
    noise: float = Field(0.05, description="std of the Gaussian noise added to each view", ge=0)
    feature_dropout: float = Field(0.1, description="tabular views: probability of zeroing each feature", ge=0, lt=1)


class RnCPretrainer(L.LightningModule):
    """Rank-N-Contrast stage 1: ``rnc_loss`` on two augmented views of every example."""

    def __init__(
        self,
        cfg: Config,
        *,
        input_dim: int | None = None,
        meta: dict[str, Any] | None = None,
        modality: str = "table",
    ) -> None:
        super().__init__()
        #: the checkpoint's ``kind`` names the modality as ``data.json``'s summary does
        self.hparams.update({"input_dim": input_dim, "kind": KIND_OF_MODALITY.get(modality, modality)})
        self.cfg, self.task, self.modality = cfg, cfg.task, modality
        self.backbone, self.feature_dim = build_backbone(cfg.model, meta=meta, input_dim=input_dim)
        #: ``rnc_loss`` from the loss registry, like the regularizers (batch-level: the global batch under DDP)
        self.rnc = build_term("rnc", {"temperature": cfg.task.temperature}, "task.temperature")
        self.objective = Objective(self.rnc)

    def augment(self, x: torch.Tensor) -> torch.Tensor:
        t: RnCOptions = self.task
        if self.modality == "images" and x.dim() == 4:
            flip = torch.rand(x.shape[0], 1, 1, 1, device=x.device) < 0.5
            x = torch.where(flip, x.flip(-1), x)
        x = x + t.noise * torch.randn_like(x)
        if t.feature_dropout > 0 and self.modality == "table":
            keep = (torch.rand_like(x) >= t.feature_dropout).to(x.dtype)
            x = x * keep
        return x

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        reseed(self.cfg.run.seed + 17, self.global_step, self.global_rank)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        y = y.reshape(-1).float()
        views = torch.cat([self.augment(x), self.augment(x)])
        f = self.backbone(views)
        f = f.flatten(1) if f.dim() > 2 else f
        feats = torch.stack([f[: y.numel()], f[y.numel() :]], dim=1)
        value = self.objective({"features": feats, "targets": y})
        check_finite(value.total, self, "Rank-N-Contrast")
        self.objective.log(self, value, batch_size=y.numel(), prefix="pretrain")
        return value.total

    def configure_optimizers(self) -> Any:
        return configure(self, self.cfg.optimizer, self.cfg.schedule, lr=self.task.lr)


class RnCRecipe(DIRRecipe):
    """Two stages: Rank-N-Contrast pretraining of the backbone, then a linear regressor on it (frozen)."""

    name = "rnc"
    description = "Rank-N-Contrast: contrastive pretraining, then a linear regressor on the frozen encoder"
    options: type = RnCOptions
    frozen_backbone = True

    def fit(self, run: Run) -> dict[str, Any]:
        data = run.data
        if data.modality == "text_pairs":
            raise ConfigError("recipe 'rnc' supports tabular and image data, got text pairs")
        pre = RnCPretrainer(run.cfg, input_dim=data.input_dim, meta=data.meta, modality=data.modality)
        train_dl, _, _ = regression_loaders(data, run.cfg)
        epochs = run.cfg.task.pretrain_epochs
        run.run_stage(Stage("pretrain", pre, LoaderData(train_dl), epochs=epochs, best=False, hand_on="last"))
        module = build_regressor(run, freeze_backbone=True)
        module.backbone.load_state_dict(pre.backbone.state_dict())
        return fit_regressor(run, module)


register_recipe(RnCRecipe())
