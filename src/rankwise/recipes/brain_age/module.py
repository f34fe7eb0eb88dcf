"""The Lightning module of the ``brain_age`` recipe (:mod:`rankwise.recipes.brain_age.recipe`): one training
stage of TSAN (ScaleDense, or the second stage on the frozen first) or SFCN, its task loss and
regularizers, an ordinal head over the age classes (:func:`age_classes`), ``task.lds`` weights, and the
validation MAE that selects the stage's ``best.ckpt``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import lightning as L
import numpy as np
import torch
from torch import nn
from torchmetrics import MeanAbsoluteError

from rankwise._binning import LabelClasses
from rankwise.models.volumetric import SFCN, ScaleDense
from rankwise.recipes.common import check_finite, reseed
from rankwise.recipes.config import Config
from rankwise.recipes.eval_metrics import shard_keep_mask, val_sampler
from rankwise.recipes.loss_terms import Objective, Term, build_regularizers, build_task_loss, ordinal_head_of
from rankwise.recipes.optim import configure
from rankwise.recipes.regression.net import (
    check_ordinal_options,
    class_counts,
    class_map_buffer,
    decode_ordinal,
    fit_label_classes,
    label_classes_of,
    lds_buffers,
    lds_sample_weights,
    loss_param_groups,
    ordinal_head_module,
    ordinal_loss_tensors,
    train_classes,
)

__all__ = ["BrainAgeModule"]


def _network(cfg: Config, backbone: str) -> nn.Module:
    from rankwise import models

    opts = dict(cfg.model.options)
    net, _ = models.build_backbone(backbone, **opts)
    return net


def _freeze_unused_heads(net: nn.Module) -> None:
    """The TSAN networks build both heads (with and without sex) as the authors' release does; the one
    ``forward`` never uses (and, without sex, the sex branch) gets no gradient, so DDP does not wait for it."""
    if not hasattr(net, "end_fc_without_gender"):
        return
    unused = ["end_fc_without_gender"] if net.use_sex else ["end_fc_with_gender", "male_fc"]
    for name in unused:
        getattr(net, name).requires_grad_(False)


class BrainAgeModule(L.LightningModule):
    """One training stage: ``stage="first"`` (ScaleDense or SFCN) or ``"second"`` (TSAN's second stage).

    ``first`` (second stage only) is the trained, frozen stage-1 network (kept in eval mode).
    """

    def __init__(
        self,
        cfg: Config,
        *,
        stage: Literal["first", "second"] = "first",
        first: nn.Module | None = None,
        age_scale: float = 1.0,
        train_labels: Any = None,
        bin_width: float = 1.0,
    ) -> None:
        super().__init__()
        self.cfg, self.task, self.stage = cfg, cfg.task, stage
        #: stage 1's output is age / age_scale (:func:`~rankwise.recipes.brain_age.recipe.resolve_age_scale`);
        #: stage 2 applies it to its frozen input
        self.age_scale = float(age_scale)
        backbone = cfg.model.backbone
        self.kind = "sfcn" if backbone == "sfcn" else "tsan"
        self.net = _network(cfg, "tsan_second_stage" if stage == "second" else backbone)
        self.first = first
        if first is not None:
            first.requires_grad_(False)
            first.eval()
        labels = None if train_labels is None else torch.as_tensor(np.asarray(train_labels, dtype=np.float64))
        self.terms = build_regularizers(cfg.loss.regularizers, train_labels=labels)
        #: the ordinal head of the task loss (``None``: regression / SFCN's KL) and the age classes it predicts
        self.ordinal = ordinal_head_of(cfg.loss) if stage == "first" else None
        self.label_classes: LabelClasses | None = None
        #: the registry's task loss (:func:`build_task_loss`) of ScaleDense's one stage (an ordinal head's, or
        #: ``loss.name`` / ``regression_<loss.kind>`` on the ages); ``None``: SFCN's KL, TSAN's second stage
        self.task_loss: nn.Module | None = None
        self.bin_width = float(bin_width)
        #: LDS weights of the task loss (``task.lds``; only ScaleDense's one stage,
        #: :meth:`~rankwise.recipes.brain_age.recipe.BrainAgeRecipe.check`)
        self.use_weights = stage == "first" and cfg.task.lds.reweight != "none"
        if self.use_weights:
            bins, table = lds_buffers(cfg.task.lds, train_labels, self.bin_width)
            self.register_buffer("lds_bins", bins)
            self.register_buffer("lds_table", table)
        if self.ordinal is None and stage == "first" and self.kind == "tsan":
            self.task_loss = build_task_loss(cfg.loss, train_labels=labels)
        if self.ordinal is not None:
            lc = age_classes(cfg, self.net, train_labels)
            self.label_classes = lc
            self.register_buffer("label_class_map", class_map_buffer(lc))
            self.net.replace_head(  # type: ignore[operator]
                ordinal_head_module(
                    self.ordinal,
                    int(self.net.head_in_features),  # type: ignore[arg-type]
                    lc.num_classes,
                    counts=None if train_labels is None else class_counts(lc, train_labels),
                )
            )
            tc = None if train_labels is None else train_classes(lc, train_labels)
            self.task_loss = build_task_loss(cfg.loss, num_classes=lc.num_classes, train_classes=tc)
            check_ordinal_options(self.task_loss, self.ordinal, lc.num_classes)
        self.uses_sex = bool(getattr(self.net, "use_sex", False))
        _freeze_unused_heads(self.net)
        #: the stage's task loss plus the weighted regularizers on the final age
        self.objective = Objective(self._task_term(), self.terms)
        # sums and counts over every rank, each validation volume once (rankwise.recipes.eval_metrics)
        self.val_mae = MeanAbsoluteError().set_dtype(torch.float64)
        self._val_seen = 0

    def train(self, mode: bool = True) -> BrainAgeModule:
        super().train(mode)
        if self.first is not None:
            self.first.eval()  # frozen: BatchNorm keeps its statistics
        return self

    def predict_age(self, vol: torch.Tensor, sex: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{"age": (B,), ...}``: the prediction of this stage and what its loss needs."""
        from rankwise import discretize_age

        if self.kind == "sfcn":
            if self.ordinal is not None:
                logits = self.net.logits(vol)  # type: ignore[operator]
                cmap: torch.Tensor = self.label_class_map  # type: ignore[assignment]
                return {"age": decode_ordinal(self.ordinal, logits, cmap), "logits": logits}
            logp = self.net(vol)
            return {"age": self.net.predict_age(logp), "log_probs": logp}  # type: ignore[operator]
        if self.stage == "first":  # ScaleDense: its penultimate features, then its final layers (or the head)
            assert isinstance(self.net, ScaleDense)
            feats = self.net.features(vol, sex)
            raw = self.net.final_layers(feats)
            if self.ordinal is not None:
                cmap = self.label_class_map  # type: ignore[assignment]
                return {"age": decode_ordinal(self.ordinal, raw, cmap), "logits": raw, "features": feats}
            return {"age": self.age_scale * raw.reshape(-1), "features": feats}
        assert self.first is not None
        with torch.no_grad():
            dis = discretize_age(self.age_scale * self.first(vol, sex).reshape(-1, 1).float(), self.task.step)
        residual, age = self.net(vol, sex, dis)
        return {"age": age.reshape(-1), "residual": residual.reshape(-1), "discretized": dis.reshape(-1)}

    def forward(self, vol: torch.Tensor, sex: torch.Tensor) -> torch.Tensor:
        return self.predict_age(vol, sex)["age"]

    def sample_weights(self, y: torch.Tensor) -> torch.Tensor | None:
        """The ``task.lds`` weight of each age (:func:`~rankwise.recipes.regression.net.lds_sample_weights`), or
        ``None``."""
        if not self.use_weights:
            return None
        bins: torch.Tensor = self.lds_bins  # type: ignore[assignment]
        table: torch.Tensor = self.lds_table  # type: ignore[assignment]
        return lds_sample_weights(y, bins, table, self.bin_width)

    def loss_tensors(self, out: dict[str, torch.Tensor], y: torch.Tensor) -> dict[str, Any]:
        """The batch tensors by role (``features``, ``predictions``, ``targets``, ``weights`` and an ordinal
        head's ``logits`` / ``classes`` / ``levels``) that the task loss and the regularizers take."""
        tensors: dict[str, Any] = {
            **out,  # what this stage's own task loss reads (SFCN's log_probs, TSAN's residual)
            "features": out.get("features"),
            "predictions": out["age"],
            "targets": y,
            "weights": self.sample_weights(y),
        }
        if self.ordinal is not None and self.label_classes is not None:
            k = self.label_classes.num_classes
            cmap: torch.Tensor = self.label_class_map  # type: ignore[assignment]
            classes = label_classes_of(y, cmap, k)
            tensors.update(ordinal_loss_tensors(self.task_loss, out["logits"], classes, k))
        return tensors

    def _task_term(self) -> Any:
        """The stage's task loss as a term of its objective: the registry's (:func:`build_task_loss`) for
        ScaleDense's one stage or an ordinal head; SFCN's KL to its soft labels; TSAN's second stage: the
        ``loss.kind`` regression loss of the residual (target ``age - discretized``)."""
        if self.task_loss is not None:  # ScaleDense's one stage, or an ordinal head
            return self.task_loss
        if self.kind == "sfcn":
            return Term("sfcn_kl", self._sfcn_kl)
        return Term(f"regression_{self.cfg.loss.kind}", self._regression)

    def _sfcn_kl(self, tensors: Mapping[str, Any]) -> torch.Tensor:
        from rankwise.models.volumetric import sfcn_kl_loss, sfcn_soft_labels

        centers: torch.Tensor = self.net.bin_centers  # type: ignore[assignment]
        width: float = self.net.bin_step  # type: ignore[assignment]
        soft = sfcn_soft_labels(tensors["targets"], centers, sigma=self.task.sfcn_sigma, bin_width=width)
        return sfcn_kl_loss(tensors["log_probs"], soft)

    def _regression(self, tensors: Mapping[str, Any]) -> torch.Tensor:
        from rankwise.imbalanced import regression_loss

        y = tensors["targets"]
        if self.stage == "second":
            return regression_loss(tensors["residual"], y - tensors["discretized"], kind=self.cfg.loss.kind)
        return regression_loss(tensors["predictions"], y, kind=self.cfg.loss.kind)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        reseed(self.cfg.run.seed + (31 if self.stage == "second" else 0), self.global_step, self.global_rank)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        y = y.reshape(-1).float()
        out = self.predict_age(x["volume"], x["sex"])
        value = self.objective(self.loss_tensors(out, y))
        n = y.numel()
        check_finite(value.total, self, f"brain-age ({self.stage} stage)")
        self.objective.log(self, value, batch_size=n)
        self.log(
            "train/mae",
            (out["age"].detach() - y).abs().mean(),
            on_step=False,
            on_epoch=True,
            batch_size=n,
            sync_dist=True,
        )
        return value.total

    def on_validation_epoch_start(self) -> None:
        self._val_seen = 0

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        y = y.reshape(-1).float()
        pred = self(x["volume"], x["sex"]).detach().float().reshape(-1)
        # a volume the DistributedSampler repeats to even out the shards counts once
        keep = shard_keep_mask(val_sampler(self.trainer), self._val_seen, y.numel(), y.device)
        self._val_seen += y.numel()
        self.val_mae.update(pred[keep], y[keep])
        # a Metric object: Lightning computes it over the whole split at the epoch's end and resets it
        self.log("val/mae", self.val_mae, on_step=False, on_epoch=True)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> dict[str, torch.Tensor]:
        x, y = batch
        return {"pred": self(x["volume"], x["sex"]).float(), "label": y.reshape(-1).float()}

    def param_groups(self) -> list[dict[str, Any]]:
        """Trainable parameters; a task loss with parameters (Balanced MSE's noise) gets its own group
        (lr ``loss.lr``), as in the DIR recipes."""
        loss = self.task_loss if self.task_loss is not None else nn.Module()
        return loss_param_groups(self, loss, self.cfg.loss.lr)

    def configure_optimizers(self) -> Any:
        lr = self.task.stage2_lr if self.stage == "second" else None
        return configure(self, self.cfg.optimizer, self.cfg.schedule, lr=lr)


def age_classes(cfg: Config, net: nn.Module, train_labels: Any) -> LabelClasses:
    """The age classes of an ordinal head: SFCN's bins (``age_range`` in ``bins`` steps), else
    :meth:`LabelClasses.fit` on the training ages with ``task.class_width``."""
    if cfg.model.backbone == "sfcn":
        assert isinstance(net, SFCN)
        return LabelClasses(lo=net.age_range[0], width=net.bin_step, num_classes=net.bins)
    if train_labels is None:
        raise ValueError("`train_labels` are required for an ordinal head on ScaleDense (they define the classes)")
    return fit_label_classes(train_labels, cfg.task.class_width, cfg.loss.name)
