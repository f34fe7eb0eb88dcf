"""Deep imbalanced regression (``recipe: dir``) and its last-layer re-training (``recipe: rrt``).

:class:`~rankwise.recipes.dir_module.DIRRegressor`: backbone -> features -> linear head. The task loss is
the registered loss ``loss.name`` (``loss.kind: l1`` is shorthand for ``regression_l1``), with
optional per-sample LDS weights from the full training labels; FDS smooths the features;
``loss.regularizers`` add weighted losses from the registry on the features or the predictions
(see :mod:`rankwise.recipes.loss_terms`); feature regularizers (RankSim, ConR) see the encoder
output before FDS smoothing, as in the RankSim paper and code. Validation MAE selects ``checkpoints/best.ckpt``, which
is evaluated on the val and test sets with the many/medium/few-shot metrics
(``metrics.json``: ``test``, ``val``), predictions (``predictions.npz``) and plots.

``rrt`` (Regressor Re-Training, Yang et al. 2021) loads a trained run (``task.init_checkpoint``),
freezes its encoder and re-trains the head (re-initialized with ``task.reset_head``) with the
config's loss (typically LDS weights).

This module imports no Lightning: reading a config and ``rankwise evaluate`` on the CPU rebuild the
plain network (:mod:`rankwise.recipes.dir_net`) and predict without it; training imports
:mod:`rankwise.recipes.dir_module`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from pydantic import Field

from rankwise.recipes.base import RegressionRecipe
from rankwise.recipes.config import Config, ConfigError, FDSConfig, LDSConfig, Options, check_lds_fds
from rankwise.recipes.dir_net import (
    DIRNet,
    concat_predictions,
    lds_weight_table,
    make_fds,
    predict,
    predicts_on_cpu,
    regression_loaders,
    run_shot_thresholds,
    write_evaluation,
)
from rankwise.recipes.loss_terms import check_loss_config
from rankwise.recipes.registry import register_recipe
from rankwise.recipes.rundir import Run, load_state_dict, load_weights

if TYPE_CHECKING:
    from rankwise.recipes.dir_module import DIRRegressor

__all__ = [
    "DIRNet",
    "DIROptions",
    "DIRRecipe",
    "DIRRegressor",
    "RRTOptions",
    "RRTRecipe",
    "evaluate_regressor",
    "lds_weight_table",
    "make_fds",
    "regression_loaders",
    "run_shot_thresholds",
]


def __getattr__(name: str) -> Any:
    if name == "DIRRegressor":  # the Lightning module, imported when first used
        from rankwise.recipes.dir_module import DIRRegressor

        return DIRRegressor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class DIROptions(Options):
    """LDS sample weights and FDS feature smoothing of the regressor (the ``loss`` section: its losses)."""

    lds: LDSConfig = Field(default_factory=LDSConfig, description="label-distribution smoothing / reweighting")
    fds: FDSConfig = Field(default_factory=FDSConfig, description="feature-distribution smoothing")


class RRTOptions(DIROptions):
    """Regressor re-training: a trained run's frozen encoder, a re-trained head."""

    init_checkpoint: str | None = Field(None, description="run directory or .ckpt whose encoder is frozen (required)")
    reset_head: bool = Field(True, description="re-initialize the head before re-training it")


def build_regressor(run: Run, *, freeze_backbone: bool = False) -> DIRRegressor:
    """The run's Lightning regressor (:class:`~rankwise.recipes.dir_module.DIRRegressor`)."""
    from rankwise.recipes.dir_module import DIRRegressor

    return DIRRegressor(**_net_args(run, freeze_backbone))


def build_net(run: Run, *, freeze_backbone: bool = False) -> DIRNet:
    """The run's regressor as a plain :class:`~rankwise.recipes.dir_net.DIRNet` (the same state dict, no Lightning)."""
    return DIRNet(**_net_args(run, freeze_backbone))


def _net_args(run: Run, freeze_backbone: bool) -> dict[str, Any]:
    d = run.data
    return {
        "cfg": run.cfg,
        "input_dim": d.input_dim,
        "bin_width": d.bin_width,
        "train_labels": d.train_labels,
        "meta": d.meta,
        "freeze_backbone": freeze_backbone,
    }


def _predict(module: Any, loader: Any, trainer: Any) -> dict[str, np.ndarray]:
    return concat_predictions(trainer.predict(module, loader))


def evaluate_regressor(run: Run, module: DIRNet, checkpoint: str) -> dict[str, Any]:
    """Load ``checkpoints/<checkpoint>.ckpt`` into ``module``; val/test shot metrics, predictions.npz, plots.

    A :class:`~rankwise.recipes.dir_module.DIRRegressor` predicts through a Lightning Trainer on
    ``trainer.accelerator``; a plain :class:`~rankwise.recipes.dir_net.DIRNet` with
    :func:`~rankwise.recipes.dir_net.predict` (on the CPU). Both end in
    :func:`~rankwise.recipes.dir_net.write_evaluation`.
    """
    cfg, data = run.cfg, run.data
    ckpt = run.checkpoint(checkpoint)
    load_weights(module, ckpt)
    module.eval()
    _, val_dl, test_dl = regression_loaders(data, cfg)
    if _is_lightning(module):
        trainer = run.local_trainer()
        test, val = _predict(module, test_dl, trainer), _predict(module, val_dl, trainer)
    else:
        test, val = predict(module, test_dl), predict(module, val_dl)
    return write_evaluation(run, test, val, ckpt)


def _is_lightning(module: Any) -> bool:
    lightning = sys.modules.get("lightning")  # not imported: not a LightningModule
    return lightning is not None and isinstance(module, lightning.LightningModule)


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
        """The checkpoint's val/test metrics; on the CPU in float32 (the run's evaluation Trainer would
        predict there) with the plain network and no Lightning, else through a Lightning Trainer."""
        build = build_net if predicts_on_cpu(run.cfg) else build_regressor
        module = build(run, freeze_backbone=self.name != "dir")
        return evaluate_regressor(run, module, checkpoint or "best")


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
