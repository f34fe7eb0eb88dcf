"""The deep-imbalanced-regression recipes' classes and their training and evaluation stages.

:class:`DIRRecipe` (``recipe: dir``) trains :class:`~rankwise.recipes.regression.module.DIRRegressor`
as one main stage (:func:`fit_regressor`: best = lowest validation MAE) and evaluates it
(:func:`evaluate_regressor`); :class:`RRTRecipe` (``recipe: rrt``) re-trains the head of a trained
run, and :class:`~rankwise.recipes.regression.rnc.RnCRecipe` (``recipe: rnc``) pretrains the
backbone first: both subclass it with ``frozen_backbone = True``. The recipes are registered by
:mod:`rankwise.recipes.regression.dir` and :mod:`rankwise.recipes.regression.rnc`.

This module imports no Lightning: reading a config, evaluation and prediction rebuild the plain
network (:class:`~rankwise.recipes.regression.net.DIRNet`), load a checkpoint into it with
:meth:`Run.load <rankwise.recipes.rundir.Run.load>` and predict with
:func:`rankwise.recipes.regression.predict.predict`; only training imports the Lightning module.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from pydantic import Field

from rankwise.recipes.base import RegressionRecipe
from rankwise.recipes.common import eval_loader, regression_loaders
from rankwise.recipes.config import Config, ConfigError, FDSConfig, LDSConfig, Options, check_lds_fds
from rankwise.recipes.loss_terms import check_loss_config
from rankwise.recipes.regression.net import DIRNet, note_label_classes, run_shot_thresholds, write_evaluation
from rankwise.recipes.regression.predict import placement, predict
from rankwise.recipes.rundir import Run, load_weights
from rankwise.recipes.stages import Stage

if TYPE_CHECKING:
    from rankwise.recipes.regression.module import DIRRegressor

__all__ = [
    "DIROptions",
    "DIRRecipe",
    "RRTOptions",
    "RRTRecipe",
    "build_net",
    "build_regressor",
    "evaluate_regressor",
    "fit_regressor",
    "predict_regressor",
    "resolve_checkpoint",
]


class DIROptions(Options):
    """LDS sample weights and FDS feature smoothing of the regressor (the ``loss`` section: its losses)."""

    lds: LDSConfig = Field(default_factory=LDSConfig, description="label-distribution smoothing / reweighting")
    fds: FDSConfig = Field(default_factory=FDSConfig, description="feature-distribution smoothing")


def build_regressor(run: Run, *, freeze_backbone: bool = False) -> DIRRegressor:
    """The run's Lightning regressor (:class:`~rankwise.recipes.regression.module.DIRRegressor`), for training."""
    from rankwise.recipes.regression.module import DIRRegressor

    return DIRRegressor(**_net_args(run, freeze_backbone))


def build_net(run: Run, *, freeze_backbone: bool = False) -> DIRNet:
    """The run's regressor as a plain :class:`~rankwise.recipes.regression.net.DIRNet` (the same state dict, no
    Lightning): what evaluation and prediction load a checkpoint into."""
    return DIRNet(**_net_args(run, freeze_backbone))


def _net_args(run: Run, freeze_backbone: bool) -> dict[str, Any]:
    d = run.model_data  # the trained label bins / classes, also on data changed since training
    return {
        "cfg": run.cfg,
        "input_dim": d.input_dim,
        "bin_width": d.bin_width,
        "train_labels": d.train_labels,
        "meta": d.meta,
        "freeze_backbone": freeze_backbone,
    }


def evaluate_regressor(run: Run, module: DIRNet, checkpoint: str, data: Any = None) -> dict[str, Any]:
    """Val/test shot metrics of ``checkpoints/<checkpoint>.ckpt``, predictions.npz, plots.

    ``module`` (a :class:`~rankwise.recipes.regression.net.DIRNet`: the plain network, or the trained
    Lightning module, which is one) gets the checkpoint and predicts with :func:`predict_regressor`;
    :func:`~rankwise.recipes.regression.net.write_evaluation` writes the results. ``data``: the training
    stage's ``LightningDataModule`` (its val and test loaders), else the loaders are built here.
    """
    cfg = run.cfg
    if data is not None:
        val_dl, test_dl = data.val_dataloader(), data.test_dataloader()
    else:
        _, val_dl, test_dl = regression_loaders(run.data, cfg)
    (test, val), ckpt = predict_regressor(run, module, [test_dl, val_dl], checkpoint)
    return write_evaluation(run, test, val, ckpt)


def predict_regressor(
    run: Run, module: DIRNet, loaders: Sequence[Any], checkpoint: str
) -> tuple[list[dict[str, np.ndarray]], Path]:
    """The predictions (``pred``, ``label``, ``features``) of ``checkpoints/<checkpoint>.ckpt`` over each
    loader, and the checkpoint's path: ``module`` takes the precision's dtype
    (:func:`~rankwise.recipes.regression.predict.placement` of the run's config), the checkpoint is loaded
    into it by :meth:`Run.load <rankwise.recipes.rundir.Run.load>` (every key and shape checked) and
    :func:`~rankwise.recipes.regression.predict.predict` runs it on the device and at the precision of the
    run's prediction Trainer."""
    where = placement(run.cfg)
    where.convert_module(module)
    ckpt = run.load(module, checkpoint)
    return predict(module, loaders, where), ckpt


def fit_regressor(run: Run, module: DIRRegressor) -> dict[str, Any]:
    """Train ``module`` (main stage, best = lowest val MAE) and evaluate its best checkpoint on rank 0
    (:func:`evaluate_regressor`: the checkpoint loaded into ``module``, predicted without a Trainer)."""
    import warnings

    from rankwise.recipes.common import DataDefaultsWarning, empty_group_message
    from rankwise.recipes.datamodules import LoaderData

    note = empty_group_message(run.data, *run_shot_thresholds(run.cfg, run.data))
    if note is not None:
        warnings.warn(note, DataDefaultsWarning, stacklevel=2)
    note_label_classes(run, run.cfg.loss.name, module.label_classes)
    data = LoaderData(*regression_loaders(run.data, run.cfg))
    stage = Stage("", module, data, epochs=run.cfg.trainer.max_epochs, monitor="val/mae", hand_on=None)
    run.run_stage(stage)
    return run.rank_zero(evaluate_regressor, run, module, "best", data)


class DIRRecipe(RegressionRecipe):
    """Deep imbalanced regression: regression loss + LDS + FDS + registry regularizers."""

    name = "dir"
    description = "deep imbalanced regression: task loss + LDS + FDS + regularizers from the loss registry"
    options: type = DIROptions
    #: the backbone is trained elsewhere (a pretraining stage, another run) and frozen here
    frozen_backbone: bool = False

    def check(self, cfg: Config) -> None:
        check_loss_config(cfg.loss)
        check_lds_fds(cfg.task.lds, cfg.task.fds)

    def fit(self, run: Run) -> dict[str, Any]:
        return fit_regressor(run, build_regressor(run, freeze_backbone=self.frozen_backbone))

    def _module(self, run: Run) -> DIRNet:
        """The plain network of the run (no Lightning), for evaluation and prediction."""
        return build_net(run, freeze_backbone=self.frozen_backbone)

    def evaluate(self, run: Run, checkpoint: str | None) -> dict[str, Any]:
        """The checkpoint's val/test metrics (the plain network of :meth:`_module`)."""
        return evaluate_regressor(run, self._module(run), checkpoint or "best")

    def predict_file(self, run: Run, path: Path, checkpoint: str | None) -> dict[str, Any]:
        """The checkpoint's (default ``best``, as :meth:`evaluate`) predictions for the rows of ``path``:
        the file's columns then ``prediction``, in the target's units (runs on the datasets of
        :data:`~rankwise.recipes.predict_data.PREDICTION_READERS`:
        :func:`~rankwise.recipes.predict_data.prediction_rows`)."""
        from rankwise.recipes.predict_data import (
            check_predictable,
            prediction_columns,
            prediction_rows,
            require_checkpoint,
        )

        check_predictable(run.cfg)
        name = checkpoint or "best"
        require_checkpoint(run, name)
        header, rows, dataset = prediction_rows(run, path)
        if len(dataset) == 0:
            return prediction_columns(header, rows, np.zeros(0, dtype=np.float32))
        (out,), _ = predict_regressor(run, self._module(run), [eval_loader(dataset, run.data, run.cfg)], name)
        return prediction_columns(header, rows, out["pred"])

    def predict_file_blocks(
        self, run: Run, path: Path, checkpoint: str | None, block_rows: int
    ) -> Iterator[dict[str, Any]] | None:
        """:meth:`predict_file` in blocks of at most ``block_rows`` rows, the file read block by block (a
        ``csv`` table: :func:`~rankwise.recipes.predict_data.prediction_row_blocks`); the blocks' columns,
        in order, are those of :meth:`predict_file`. None for a dataset whose file is read whole."""
        from rankwise.recipes.predict_data import check_predictable, prediction_row_blocks, require_checkpoint

        check_predictable(run.cfg)
        name = checkpoint or "best"
        require_checkpoint(run, name)
        blocks = prediction_row_blocks(run, path, block_rows)
        return None if blocks is None else self._predicted_blocks(run, blocks, name)

    def _predicted_blocks(self, run: Run, blocks: Iterator[Any], name: str) -> Iterator[dict[str, Any]]:
        from rankwise.recipes.predict_data import prediction_columns

        module = None
        for header, rows, dataset in blocks:
            if len(dataset) == 0:
                yield prediction_columns(header, rows, np.zeros(0, dtype=np.float32))
                continue
            module = self._module(run) if module is None else module
            (out,), _ = predict_regressor(run, module, [eval_loader(dataset, run.data, run.cfg)], name)
            yield prediction_columns(header, rows, out["pred"])


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
