"""Lightning modules of the training recipes.

* :class:`DIRRegressor` -- deep imbalanced regression: backbone -> feature -> linear head, a
  ``regression_loss`` kind, optional LDS per-sample weights (from the full training labels), FDS on
  the features, and any weighted sum of the ``ranksim`` / ``conr`` / ``spearman`` / ``pairwise``
  regularizers. With ``freeze_backbone=True`` only the head is trained (RRT, RnC linear probe).
* :class:`RnCPretrainer` -- Rank-N-Contrast stage 1: two augmented views per example, ``rnc_loss``
  on the backbone features.

The loops, checkpoints, logging, precision and devices are Lightning's (see ``rankwise.recipes.runner``).
"""

from __future__ import annotations

import math
import os
import random
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import nn

from rankwise._binning import snap_floor
from rankwise.recipes import _deps
from rankwise.recipes.config import Config, config_from_dict

__all__ = [
    "DIRRegressor",
    "EpochIndexSampler",
    "EpochShuffleSampler",
    "NonFiniteLossError",
    "RnCPretrainer",
    "item_seed",
    "reseed",
]

#: fault injection for the reliability tests: make the loss NaN at this global step
ENV_NAN_AT_STEP = "RANKWISE_FAULT_NAN_AT_STEP"


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or inf; the run stops and keeps its last good checkpoint."""


def reseed(seed: int, step: int, rank: int = 0) -> None:
    """Seed every RNG from ``(seed, step, rank)`` so a step replays identically after a resume.

    The recipes call it before every training step (with the global step), so random choices in
    the losses (e.g. RankSim's one-example-per-label draw), dropout and augmentations do not depend
    on how many random numbers Lightning's loops consumed before (which differs after a restart).
    """
    s = (int(seed) * 1_000_003 + int(step) * 7919 + int(rank) * 104_729) % (2**31 - 1)
    random.seed(s)
    np.random.seed(s)  # noqa: NPY002 - user code (e.g. augmentations) may use the legacy global RNG
    torch.manual_seed(s)


class EpochShuffleSampler(torch.utils.data.Sampler[int]):
    """Random permutation that depends only on ``(seed, epoch)`` (Lightning calls ``set_epoch``)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = int(n)
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())


class EpochIndexSampler(EpochShuffleSampler):
    """Indices ``epoch * n + i`` (``i`` shuffled by ``(seed, epoch)`` when ``shuffle``): fresh every epoch.

    For datasets whose items are random draws seeded by the index (``dataset[g]`` uses item
    ``g % n`` and the seed :func:`item_seed` ``(seed, g)``): every epoch sees new draws (new
    augmentations, new random lists), and a run resumed from an end-of-epoch checkpoint replays
    exactly the draws of an uninterrupted run, whatever the number of processes or workers.
    """

    def __init__(self, n: int, seed: int, *, shuffle: bool = True) -> None:
        super().__init__(n, seed)
        self.shuffle = bool(shuffle)

    def __iter__(self):
        base = self.epoch * self.n
        if not self.shuffle:
            return iter(range(base, base + self.n))
        return iter((base + torch.as_tensor(list(super().__iter__()))).tolist())


def item_seed(seed: int, index: int) -> int:
    """A 63-bit seed for random item ``index`` of a run seeded ``seed`` (see :class:`EpochIndexSampler`)."""
    return (int(seed) * 0x9E3779B97F4A7C15 + int(index) * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) % (2**63 - 1)


def _configure_optimizers(
    module: L.LightningModule, cfg: Config, lr: float | None = None, max_epochs: int | None = None
) -> Any:
    params = [p for p in module.parameters() if p.requires_grad]
    o = cfg.optimizer
    lr = o.lr if lr is None else lr
    opt: torch.optim.Optimizer
    if o.name == "adam":
        opt = torch.optim.Adam(params, lr=lr, weight_decay=o.weight_decay)
    elif o.name == "adamw":
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=o.weight_decay)
    else:
        opt = torch.optim.SGD(params, lr=lr, momentum=o.momentum, weight_decay=o.weight_decay)
    s = cfg.schedule
    total = max_epochs or cfg.trainer.max_epochs
    if s.kind == "none" and s.warmup_epochs == 0:
        return opt
    milestones = list(s.milestones)

    def factor(epoch: int) -> float:
        f = 1.0
        if s.kind == "multistep":
            f = s.gamma ** sum(epoch >= m for m in milestones)
        elif s.kind == "cosine":
            f = 0.5 * (1.0 + math.cos(math.pi * min(epoch, total) / max(total, 1)))
        if s.warmup_epochs > 0 and epoch < s.warmup_epochs:
            f *= (epoch + 1) / (s.warmup_epochs + 1)
        return f

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}


class DIRRegressor(L.LightningModule):
    """Backbone -> features -> linear head, trained with the DIR loss stack of ``config``.

    Args:
        config: a :class:`~rankwise.recipes.config.Config` as a plain dict (saved in checkpoints).
        input_dim: tabular input width (``RegressionData.input_dim``).
        bin_width: label bin width (LDS/FDS buckets).
        train_labels: the FULL training labels (LDS weight table, FDS label range); not saved as
            a hyperparameter -- the weight table is a buffer of the state dict.
        meta: ``RegressionData.meta`` (extra backbone options).
        freeze_backbone: train only the head (RRT, linear probe); the backbone stays in eval mode.
    """

    def __init__(
        self,
        config: dict[str, Any],
        *,
        input_dim: int | None = None,
        bin_width: float = 1.0,
        train_labels: np.ndarray | None = None,
        meta: dict[str, Any] | None = None,
        freeze_backbone: bool = False,
    ) -> None:
        super().__init__()
        self.hparams.update(
            {
                "config": config,
                "input_dim": input_dim,
                "bin_width": float(bin_width),
                "freeze_backbone": bool(freeze_backbone),
            }
        )
        self.cfg = config_from_dict(config)
        self.bin_width = float(bin_width)
        self.backbone, self.feature_dim = _deps.build_backbone(
            self.cfg.model.backbone, input_dim=input_dim, meta=meta or {}, options=self.cfg.model.options
        )
        self.head = nn.Linear(self.feature_dim, 1)
        self._label_mean = float(np.mean(train_labels)) if train_labels is not None and len(train_labels) else 0.0
        with torch.no_grad():  # start from the mean label: the regressor need not learn the offset first
            self.head.bias.fill_(self._label_mean)
        lds = self.cfg.loss.lds
        self.use_weights = lds.reweight != "none"
        bins = torch.zeros(0, dtype=torch.int64)
        table = torch.zeros(0, dtype=torch.float32)
        if self.use_weights:
            if train_labels is None:
                raise ValueError("`train_labels` are required when `loss.lds.reweight` is not 'none'")
            b, t = _deps.lds_weight_table(
                train_labels,
                self.bin_width,
                reweight=lds.reweight,
                lds=lds.lds,
                kernel=lds.kernel,
                ks=lds.ks,
                sigma=lds.sigma,
            )
            bins = torch.as_tensor(b, dtype=torch.int64)
            table = torch.as_tensor(t, dtype=torch.float32)
        self.register_buffer("lds_bins", bins)
        self.register_buffer("lds_table", table)
        f = self.cfg.loss.fds
        self.fds: nn.Module | None = None
        if f.enabled:
            lo, hi = (0.0, 1.0) if train_labels is None else (float(np.min(train_labels)), float(np.max(train_labels)))
            self.fds = _deps.make_fds(
                self.feature_dim,
                bin_width=self.bin_width,
                kernel=f.kernel,
                ks=f.ks,
                sigma=f.sigma,
                momentum=f.momentum,
                start_update=f.start_update,
                start_smooth=f.start_smooth,
                label_range=(lo, hi),
            )
        self.freeze_backbone = bool(freeze_backbone)
        if self.freeze_backbone:
            self.backbone.requires_grad_(False)
        self._fds_feats: list[torch.Tensor] = []
        self._fds_labels: list[torch.Tensor] = []
        self._val_err: list[torch.Tensor] = []

    # ------------------------------------------------------------------ helpers
    def sample_weights(self, y: torch.Tensor) -> torch.Tensor | None:
        """LDS/reweighting weight of each label (table lookup by bin ``floor(y / bin_width)``)."""
        if not self.use_weights:
            return None
        bins: torch.Tensor = self.lds_bins  # type: ignore[assignment]
        table: torch.Tensor = self.lds_table  # type: ignore[assignment]
        b = snap_floor(y.detach(), self.bin_width).long()  # the binning rule of lds_weights (any dtype)
        idx = torch.searchsorted(bins, b).clamp_(max=bins.numel() - 1)
        w = table[idx]
        return torch.where(bins[idx] == b, w, torch.ones_like(w)).to(y.dtype)

    def features(self, x: Any) -> torch.Tensor:
        f = self.backbone(x)
        return f.flatten(1) if f.dim() > 2 else f

    def forward(self, x: Any) -> torch.Tensor:
        return self.head(self.features(x)).squeeze(-1)

    def reset_head(self) -> None:
        self.head.reset_parameters()
        with torch.no_grad():
            self.head.bias.fill_(self._label_mean)

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
        feats = self.features(x)
        if self.fds is not None:
            self._fds_feats.append(feats.detach())
            self._fds_labels.append(y.detach())
            feats = _deps.fds_smooth(self.fds, feats, y, self.current_epoch)
        pred = self.head(feats).squeeze(-1)
        w = self.sample_weights(y)
        loss_cfg = self.cfg.loss
        task = _deps.regression_loss(pred, y, w, kind=loss_cfg.kind, options=loss_cfg.options)
        total = task
        logs = {"train/task_loss": task.detach()}
        for name, reg in loss_cfg.regularizers.items():
            if reg.weight == 0:
                continue
            value = _deps.regularizer_fn(name)(feats, pred, y, w, **reg.options)
            total = total + reg.weight * value
            logs[f"train/{name}"] = value.detach()
        fault = os.environ.get(ENV_NAN_AT_STEP)
        if fault is not None and self.global_step >= int(fault):
            total = total * float("nan")
        if not bool(torch.isfinite(total.detach())):
            raise NonFiniteLossError(
                f"the training loss became {total.detach().item()} at epoch {self.current_epoch}, "
                f"global step {self.global_step} (task loss {task.detach().item():.4g}); stopping. "
                "The last good checkpoint is kept; try a smaller learning rate or regularizer weight."
            )
        logs["train/loss"] = total.detach()
        self.log_dict(logs, on_step=True, on_epoch=True, prog_bar=False, batch_size=y.numel(), sync_dist=True)
        return total

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # FDS statistics are refreshed from the whole epoch's features at its last batch, i.e.
        # before validation and the epoch-end checkpoint, so a resumed run sees the same state.
        if self.fds is None or batch_idx + 1 != self.trainer.num_training_batches:
            return
        if self._fds_feats:
            feats = torch.cat(self._fds_feats)
            labels = torch.cat(self._fds_labels)
            _deps.fds_update(self.fds, feats, labels, self.current_epoch)
        self._fds_feats, self._fds_labels = [], []

    # ------------------------------------------------------------------ validation / prediction
    def on_validation_epoch_start(self) -> None:
        self._val_err = []

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        y = y.reshape(-1).float()
        pred = self(x)
        self._val_err.append((pred.float() - y).abs().detach())

    def on_validation_epoch_end(self) -> None:
        err = torch.cat(self._val_err) if self._val_err else torch.zeros(1, device=self.device)
        self.log("val/mae", err.mean(), prog_bar=True, sync_dist=True)
        self.log("val/gm", torch.exp(torch.log(err.clamp_min(1e-12)).mean()), sync_dist=True)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> dict[str, torch.Tensor]:
        x, y = batch
        feats = self.features(x)
        pred = self.head(feats).squeeze(-1)
        return {"pred": pred.float(), "label": y.reshape(-1).float(), "features": feats.float()}

    def configure_optimizers(self) -> Any:
        return _configure_optimizers(self, self.cfg)


class RnCPretrainer(L.LightningModule):
    """Rank-N-Contrast stage 1: ``rnc_loss`` on two augmented views of every example.

    Tabular views: ``x + noise * N(0, 1)`` then feature dropout with probability
    ``feature_dropout``; image views: random horizontal flip + the same Gaussian noise.
    """

    def __init__(
        self,
        config: dict[str, Any],
        *,
        input_dim: int | None = None,
        meta: dict[str, Any] | None = None,
        kind: str = "tabular",
    ) -> None:
        super().__init__()
        self.hparams.update({"config": config, "input_dim": input_dim, "kind": kind})
        self.cfg = config_from_dict(config)
        self.kind = kind
        self.backbone, self.feature_dim = _deps.build_backbone(
            self.cfg.model.backbone, input_dim=input_dim, meta=meta or {}, options=self.cfg.model.options
        )

    def augment(self, x: torch.Tensor) -> torch.Tensor:
        r = self.cfg.rnc
        if self.kind == "image" and x.dim() == 4:
            flip = torch.rand(x.shape[0], 1, 1, 1, device=x.device) < 0.5
            x = torch.where(flip, x.flip(-1), x)
        x = x + r.noise * torch.randn_like(x)
        if r.feature_dropout > 0 and self.kind == "tabular":
            keep = (torch.rand_like(x) >= r.feature_dropout).to(x.dtype)
            x = x * keep
        return x

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        reseed(self.cfg.run.seed + 17, self.global_step, self.global_rank)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        if self.kind == "text_pair":
            raise ValueError("the Rank-N-Contrast recipe supports tabular and image data, got text pairs")
        y = y.reshape(-1).float()
        views = torch.cat([self.augment(x), self.augment(x)])
        f = self.backbone(views)
        f = f.flatten(1) if f.dim() > 2 else f
        feats = torch.stack([f[: y.numel()], f[y.numel() :]], dim=1)
        loss = _deps.rnc_loss(feats, y, temperature=self.cfg.rnc.temperature)
        if not bool(torch.isfinite(loss.detach())):
            raise NonFiniteLossError(
                f"the Rank-N-Contrast loss became {loss.detach().item()} at epoch {self.current_epoch}, "
                f"global step {self.global_step}; stopping. The last good checkpoint is kept."
            )
        self.log("pretrain/rnc_loss", loss.detach(), on_step=True, on_epoch=True, batch_size=y.numel(), sync_dist=True)
        return loss

    def configure_optimizers(self) -> Any:
        return _configure_optimizers(self, self.cfg, lr=self.cfg.rnc.lr, max_epochs=self.cfg.rnc.pretrain_epochs)
