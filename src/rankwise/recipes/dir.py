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

The regressor, its training stage and its evaluation are shared with ``rnc`` in
:mod:`rankwise.recipes.regressor`. This module imports no Lightning: reading a config and
``rankwise evaluate`` on the CPU rebuild the plain network (:mod:`rankwise.recipes.dir_net`) and
predict without it; training imports :mod:`rankwise.recipes.dir_module`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from pydantic import Field

from rankwise.recipes.config import Config, ConfigError
from rankwise.recipes.dir_net import DIRNet, lds_weight_table, make_fds, regression_loaders, run_shot_thresholds
from rankwise.recipes.registry import register_recipe
from rankwise.recipes.regressor import (
    DIROptions,
    DIRRecipe,
    build_net,
    build_regressor,
    evaluate_regressor,
    fit_regressor,
)
from rankwise.recipes.rundir import Run, load_weights

if TYPE_CHECKING:
    from rankwise.recipes.dir_module import DIRRegressor

__all__ = [
    "DIRNet",
    "DIROptions",
    "DIRRecipe",
    "DIRRegressor",
    "RRTOptions",
    "RRTRecipe",
    "build_net",
    "build_regressor",
    "evaluate_regressor",
    "fit_regressor",
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


class RRTOptions(DIROptions):
    """Regressor re-training: a trained run's frozen encoder, a re-trained head."""

    init_checkpoint: str | None = Field(None, description="run directory or .ckpt whose encoder is frozen (required)")
    reset_head: bool = Field(True, description="re-initialize the head before re-training it")


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
    frozen_backbone = True

    def check(self, cfg: Config) -> None:
        super().check(cfg)
        if not cfg.task.init_checkpoint:
            raise ConfigError("`task.init_checkpoint` is required by recipe 'rrt' (a run directory or .ckpt)")

    def fit(self, run: Run) -> dict[str, Any]:
        module = build_regressor(run, freeze_backbone=True)
        t: RRTOptions = run.cfg.task
        # the source run's weights but its LDS table (this run's loss has its own); a run's head may differ
        load_weights(module, resolve_checkpoint(str(t.init_checkpoint)), strict=False, skip=("lds_",))
        if t.reset_head:
            torch.manual_seed(run.cfg.run.seed)
            module.reset_head()
        return fit_regressor(run, module)


register_recipe(DIRRecipe())
register_recipe(RRTRecipe())
