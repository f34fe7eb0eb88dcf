"""Deep imbalanced regression (``recipe: dir``) and its last-layer re-training (``recipe: rrt``).

:class:`DIRRegressor`: backbone -> features -> linear head. The task loss is the registered loss
``loss.name`` (``loss.kind: l1`` is shorthand for ``regression_l1``, i.e. ``regression_loss(kind="l1")``), with
optional per-sample LDS weights from the full training labels; FDS smooths the features;
``loss.regularizers`` add weighted losses from the registry on the features or the predictions
(see :mod:`rankwise.recipes.loss_terms`); feature regularizers (RankSim, ConR) see the encoder
output before FDS smoothing, as in the RankSim paper and code. Validation MAE selects ``checkpoints/best.ckpt``, which
is evaluated on the val and test sets with the many/medium/few-shot metrics
(``metrics.json``: ``test``, ``val``), predictions (``predictions.npz``) and plots.

``rrt`` (Regressor Re-Training, Yang et al. 2021) loads a trained run (``task.init_checkpoint``),
freezes its encoder and re-trains the head (re-initialized with ``task.reset_head``) with the
config's loss (typically LDS weights).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from pydantic import Field
from torch import nn

from rankwise._binning import label_bins_np, snap_floor, snap_floor_np
from rankwise.recipes.base import RegressionRecipe
from rankwise.recipes.common import (
    EpochShuffleSampler,
    build_backbone,
    check_finite,
    reseed,
    to_builtin,
)
from rankwise.recipes.config import Config, ConfigError, FDSConfig, LDSConfig, Options, check_lds_fds
from rankwise.recipes.loss_terms import build_regularizers, build_task_loss, check_loss_config
from rankwise.recipes.optim import configure
from rankwise.recipes.registry import register_recipe
from rankwise.recipes.rundir import Run, load_state_dict, load_weights

__all__ = [
    "DIROptions",
    "DIRRecipe",
    "DIRRegressor",
    "RRTOptions",
    "RRTRecipe",
    "evaluate_regressor",
    "lds_weight_table",
    "make_fds",
    "regression_loaders",
]


class DIROptions(Options):
    """LDS sample weights and FDS feature smoothing of the regressor (the ``loss`` section: its losses)."""

    lds: LDSConfig = Field(default_factory=LDSConfig, description="label-distribution smoothing / reweighting")
    fds: FDSConfig = Field(default_factory=FDSConfig, description="feature-distribution smoothing")


class RRTOptions(DIROptions):
    """Regressor re-training: a trained run's frozen encoder, a re-trained head."""

    init_checkpoint: str | None = Field(None, description="run directory or .ckpt whose encoder is frozen (required)")
    reset_head: bool = Field(True, description="re-initialize the head before re-training it")


# ------------------------------------------------------------------------------------------ pieces


def lds_weight_table(
    train_labels: np.ndarray, bin_width: float, *, reweight: str, lds: bool, kernel: str, ks: int, sigma: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per-bin weights ``(bins, weights)`` from ``rankwise.imbalanced.lds_weights`` on the full train labels.

    The per-sample weights only depend on the label's bin, so they are stored as a small table
    (sorted integer bins ``floor(y / bin_width)`` and their weight) and looked up for each batch.
    """
    from rankwise.imbalanced import lds_weights

    labels = np.asarray(train_labels, dtype=np.float64).reshape(-1)
    w = lds_weights(
        labels,
        bin_width=bin_width,
        reweight=reweight,  # type: ignore[arg-type]
        lds=lds,
        kernel=kernel,  # type: ignore[arg-type]
        ks=ks,
        sigma=sigma,
    )
    w = w.detach().cpu().numpy() if isinstance(w, torch.Tensor) else np.asarray(w)
    w = np.asarray(w, dtype=np.float64).reshape(-1)
    bins = label_bins_np(labels, bin_width)  # the binning rule of lds_weights / FDS / shot metrics
    ubins, inv = np.unique(bins, return_inverse=True)
    table = np.bincount(inv, weights=w) / np.bincount(inv)
    return ubins, table


def make_fds(feature_dim: int, f: Any, *, bin_width: float, label_range: tuple[float, float]) -> nn.Module:
    """``rankwise.imbalanced.FDS`` over the bins covering ``label_range`` (options ``f``: an ``FDSConfig``)."""
    from rankwise.imbalanced import FDS

    lo = snap_floor_np(np.array(label_range[0]), bin_width) * bin_width
    hi = (snap_floor_np(np.array(label_range[1]), bin_width) + 1) * bin_width
    return FDS(
        feature_dim,
        bin_width=bin_width,
        label_range=(float(lo), float(hi)),
        kernel=f.kernel,
        ks=f.ks,
        sigma=f.sigma,
        momentum=f.momentum,
        start_update=f.start_update,
        start_smooth=f.start_smooth,
    )


class DIRRegressor(L.LightningModule):
    """Backbone -> features -> linear head, trained with the DIR loss stack of ``cfg.loss``.

    Args:
        cfg: the run's typed :class:`~rankwise.recipes.config.Config`.
        input_dim: tabular input width (``RegressionData.input_dim``).
        bin_width: label bin width (LDS/FDS buckets).
        train_labels: the FULL training labels (LDS weight table, FDS label range); the weight
            table is a buffer of the state dict.
        meta: ``RegressionData.meta`` (extra backbone options).
        freeze_backbone: train only the head (RRT, RnC linear probe); the backbone stays in eval mode.
    """

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
        super().__init__()
        self.hparams.update({"input_dim": input_dim, "bin_width": float(bin_width), "freeze_backbone": freeze_backbone})
        self.cfg = cfg
        self.bin_width = float(bin_width)
        self.backbone, self.feature_dim = build_backbone(cfg.model, meta=meta, input_dim=input_dim)
        self.head = nn.Linear(self.feature_dim, 1)
        self._label_mean = float(np.mean(train_labels)) if train_labels is not None and len(train_labels) else 0.0
        with torch.no_grad():  # start from the mean label: the regressor need not learn the offset first
            self.head.bias.fill_(self._label_mean)
        lds = cfg.task.lds
        self.use_weights = lds.reweight != "none"
        bins = torch.zeros(0, dtype=torch.int64)
        table = torch.zeros(0, dtype=torch.float32)
        if self.use_weights:
            if train_labels is None:
                raise ValueError("`train_labels` are required when `task.lds.reweight` is not 'none'")
            b, t = lds_weight_table(
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
        self.fds: nn.Module | None = None
        if cfg.task.fds.enabled:
            lo, hi = (0.0, 1.0) if train_labels is None else (float(np.min(train_labels)), float(np.max(train_labels)))
            self.fds = make_fds(self.feature_dim, cfg.task.fds, bin_width=self.bin_width, label_range=(lo, hi))
        self.freeze_backbone = bool(freeze_backbone)
        if self.freeze_backbone:
            self.backbone.requires_grad_(False)
        #: the task loss from the registry (``loss.name``, or ``regression_<kind>`` for ``loss.kind``)
        labels = None if train_labels is None else torch.as_tensor(np.asarray(train_labels, dtype=np.float64))
        self.task_loss = build_task_loss(cfg.loss, train_labels=labels)
        self.regularizers = build_regularizers(cfg.loss.regularizers, train_labels=labels)
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

    def param_groups(self) -> list[dict[str, Any]]:
        """Trainable parameters; a task loss with parameters gets its own group (lr ``loss.lr``)."""
        loss_params = [p for p in self.task_loss.parameters() if p.requires_grad]
        ids = {id(p) for p in loss_params}
        groups: list[dict[str, Any]] = [
            {"params": [p for p in self.parameters() if p.requires_grad and id(p) not in ids]}
        ]
        if loss_params:
            group: dict[str, Any] = {"params": loss_params}
            if self.cfg.loss.lr is not None:
                group["lr"] = self.cfg.loss.lr
            groups.append(group)
        return groups

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
        pred = self.head(feats).squeeze(-1)
        w = self.sample_weights(y)
        # regularizers on the features (RankSim, ConR) see the ENCODER output, before FDS smoothing, as
        # in RankSim's reference (agedb-dir/train.py: the regularizer takes the encoding, FDS then smooths
        # it for the regressor); the head and the task loss see the smoothed features
        tensors = {"features": encoded, "predictions": pred, "targets": y, "weights": w}
        task = self.task_loss(tensors)
        total = task
        logs = {"train/task_loss": task.detach()}
        for term in self.regularizers:
            value = term(tensors)
            total = total + term.weight * value
            logs[f"train/{term.name}"] = value.detach()
        check_finite(
            total,
            self,
            "training",
            f"task loss {task.detach().item():.4g}; try a smaller learning rate or regularizer weight",
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
            # sync: per-bin sums are all-reduced over the ranks of a DDP run (no-op in a single process)
            self.fds.update(feats, labels, self.current_epoch, sync=True)  # type: ignore[operator]
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
        return configure(self, self.cfg.optimizer, self.cfg.schedule)


def regression_loaders(data: Any, cfg: Config) -> tuple[Any, Any, Any]:
    """Train (seeded per-epoch shuffle), val and test loaders of a ``RegressionData``."""
    from torch.utils.data import DataLoader

    collate = data.meta.get("collate_fn")
    n = len(data.train)
    bs = cfg.data.batch_size
    kw: dict[str, Any] = {
        "num_workers": cfg.data.num_workers,
        "collate_fn": collate,
        "persistent_workers": cfg.data.num_workers > 0,
    }
    train_dl = DataLoader(
        data.train, batch_size=bs, sampler=EpochShuffleSampler(n, cfg.run.seed), drop_last=n > bs, **kw
    )
    val_dl = DataLoader(data.val, batch_size=cfg.data.eval_batch_size, shuffle=False, **kw)
    test_dl = DataLoader(data.test, batch_size=cfg.data.eval_batch_size, shuffle=False, **kw)
    return train_dl, val_dl, test_dl


def build_regressor(run: Run, *, freeze_backbone: bool = False) -> DIRRegressor:
    d = run.data
    return DIRRegressor(
        run.cfg,
        input_dim=d.input_dim,
        bin_width=d.bin_width,
        train_labels=d.train_labels,
        meta=d.meta,
        freeze_backbone=freeze_backbone,
    )


def _predict(module: Any, loader: Any, trainer: Any) -> dict[str, np.ndarray]:
    outs = trainer.predict(module, loader)
    return {k: torch.cat([o[k] for o in outs]).cpu().numpy() for k in ("pred", "label", "features")}


def run_shot_thresholds(cfg: Config, data: Any) -> tuple[float, float]:
    """``(many_shot, few_shot)`` of a run: ``run.many_shot`` / ``run.few_shot``, else the dataset's own."""
    from rankwise.recipes.own_data import shot_thresholds

    many, few = shot_thresholds(data)
    r = cfg.report
    return (many if r.many_shot is None else r.many_shot), (few if r.few_shot is None else r.few_shot)


def _metrics(preds: np.ndarray, labels: np.ndarray, data: Any, cfg: Config) -> dict[str, Any]:
    from rankwise.imbalanced import regression_metrics

    many, few = run_shot_thresholds(cfg, data)
    out = regression_metrics(
        torch.as_tensor(preds),
        torch.as_tensor(labels),
        np.asarray(data.train_labels),
        many_shot=many,
        few_shot=few,
        bin_width=data.bin_width,
    )
    return to_builtin(out)


#: the plots of :func:`evaluate_regressor` (functions of the test predictions and training labels only)
_PLOTS = ("label_histogram.png", "per_label_mae.png", "similarity.png", "tsne.png")


def _same_predictions(path: Path, test: dict[str, np.ndarray], data: Any) -> bool:
    """Whether ``predictions.npz`` at ``path`` holds exactly these test predictions, labels and training labels."""
    try:
        with np.load(path, allow_pickle=False) as old:
            return (
                np.array_equal(old["pred"], test["pred"])
                and np.array_equal(old["label"], test["label"])
                and np.array_equal(old["train_labels"], np.asarray(data.train_labels, dtype=np.float64))
                and float(old["bin_width"]) == float(data.bin_width)
            )
    except (OSError, KeyError, ValueError):
        return False


def evaluate_regressor(run: Run, module: DIRRegressor, checkpoint: str) -> dict[str, Any]:
    """Load ``checkpoints/<checkpoint>.ckpt`` into ``module``; val/test shot metrics, predictions.npz, plots."""
    from rankwise.recipes import reports

    cfg, data = run.cfg, run.data
    ckpt = run.checkpoint(checkpoint)
    load_weights(module, ckpt)
    module.eval()
    _, val_dl, test_dl = regression_loaders(data, cfg)
    trainer = run.local_trainer()
    test = _predict(module, test_dl, trainer)
    val = _predict(module, val_dl, trainer)
    metrics = {
        "test": _metrics(test["pred"], test["label"], data, cfg),
        "val": _metrics(val["pred"], val["label"], data, cfg),
        "checkpoint": str(ckpt.relative_to(run.dir)),
        "shot_thresholds": dict(zip(("many", "few"), run_shot_thresholds(cfg, data))),
    }
    r = cfg.report
    rng = np.random.default_rng(0)
    n = len(test["label"])
    sample = np.sort(rng.choice(n, size=min(n, r.plot_samples), replace=False)) if n else np.zeros(0, dtype=int)
    unchanged = _same_predictions(run.dir / "predictions.npz", test, data)
    np.savez_compressed(
        run.dir / "predictions.npz",
        pred=test["pred"],
        label=test["label"],
        train_labels=np.asarray(data.train_labels, dtype=np.float64),
        bin_width=data.bin_width,
        label_axis=getattr(data, "label_axis", "label"),
        sample=sample,
        features=test["features"][sample],
    )
    pdir = run.plots_dir
    if pdir is not None and unchanged and all((pdir / f).is_file() for f in _PLOTS[: 4 if r.tsne else 3]):
        pdir = None  # the plots are functions of these predictions: those on disk are up to date
    if pdir is not None:
        title = f"{cfg.run.name} (seed {cfg.run.seed})"
        label = getattr(data, "label_axis", "label")
        reports.plot_label_histogram(
            data.train_labels,
            data.bin_width,
            pdir / "label_histogram.png",
            many_shot=run_shot_thresholds(cfg, data)[0],
            few_shot=run_shot_thresholds(cfg, data)[1],
            test_labels=data.test_labels,
            label=label,
        )
        reports.plot_per_label_mae(
            test["pred"],
            test["label"],
            data.train_labels,
            data.bin_width,
            pdir / "per_label_mae.png",
            title=f"per-label test MAE: {title}",
            label=label,
        )
        feats, labs = test["features"][sample], test["label"][sample]
        reports.plot_similarity_heatmap(
            feats, labs, pdir / "similarity.png", title=f"feature similarity: {title}", label=label
        )
        if r.tsne:
            reports.plot_tsne(feats, labs, pdir / "tsne.png", seed=cfg.run.seed, title=f"t-SNE: {title}", label=label)
    return metrics


def fit_regressor(run: Run, module: DIRRegressor) -> dict[str, Any]:
    """Train ``module`` (main stage, best = lowest val MAE) and evaluate its best checkpoint on rank 0."""
    import warnings

    from rankwise.recipes.own_data import DataDefaultsWarning, empty_group_message

    note = empty_group_message(run.data, *run_shot_thresholds(run.cfg, run.data))
    if note is not None:
        warnings.warn(note, DataDefaultsWarning, stacklevel=2)
    train_dl, val_dl, _ = regression_loaders(run.data, run.cfg)
    trainer = run.trainer(max_epochs=run.cfg.trainer.max_epochs, monitor="val/mae")
    run.fit(trainer, module, train_dl, val_dl)
    if run.global_rank != 0:
        return {}
    return evaluate_regressor(run, module, "best")


# ------------------------------------------------------------------------------------------ recipes


class DIRRecipe(RegressionRecipe):
    """Deep imbalanced regression: regression loss + LDS + FDS + registry regularizers."""

    name = "dir"
    description = "deep imbalanced regression: task loss + LDS + FDS + regularizers from the loss registry"
    options: type = DIROptions

    def check(self, cfg: Config) -> None:
        check_loss_config(cfg.loss)
        check_lds_fds(cfg.task.lds, cfg.task.fds)

    def fit(self, run: Run) -> dict[str, Any]:
        return fit_regressor(run, build_regressor(run))

    def evaluate(self, run: Run, checkpoint: str | None) -> dict[str, Any]:
        return evaluate_regressor(run, build_regressor(run, freeze_backbone=self.name != "dir"), checkpoint or "best")


def resolve_checkpoint(source: str, key: str = "task.init_checkpoint") -> Path:
    """A ``.ckpt`` file, or a run directory's ``checkpoints/best.ckpt`` (else ``last.ckpt``)."""
    p = Path(source)
    if p.is_dir():
        for cand in (p / "checkpoints" / "best.ckpt", p / "checkpoints" / "last.ckpt"):
            if cand.is_file():
                return cand
        raise ConfigError(f"`{key}`: no checkpoints/best.ckpt or last.ckpt under {p}")
    if not p.is_file():
        raise ConfigError(f"`{key}`: {p} does not exist")
    return p


class RRTRecipe(DIRRecipe):
    """Regressor re-training: a trained run's encoder frozen, the head re-trained with this config's loss."""

    name = "rrt"
    description = "re-train only the head of a trained run (task.init_checkpoint) with this config's loss"
    options: type = RRTOptions

    def check(self, cfg: Config) -> None:
        super().check(cfg)
        if not cfg.task.init_checkpoint:
            raise ConfigError("`task.init_checkpoint` is required by recipe 'rrt' (a run directory or .ckpt)")

    def fit(self, run: Run) -> dict[str, Any]:
        module = build_regressor(run, freeze_backbone=True)
        t: RRTOptions = run.cfg.task
        state = load_state_dict(resolve_checkpoint(str(t.init_checkpoint)))
        module.load_state_dict({k: v for k, v in state.items() if not k.startswith("lds_")}, strict=False)
        if t.reset_head:
            torch.manual_seed(run.cfg.run.seed)
            module.reset_head()
        return fit_regressor(run, module)


register_recipe(DIRRecipe())
register_recipe(RRTRecipe())
