"""The deep-imbalanced-regression regressor shared by the recipes ``dir``, ``rrt`` and ``rnc``.

:class:`DIRRecipe` (``recipe: dir``, registered by :mod:`rankwise.recipes.dir`) trains
:class:`~rankwise.recipes.dir_module.DIRRegressor` as one main stage (:func:`fit_regressor`: best =
lowest validation MAE) and evaluates it (:func:`evaluate_regressor`); the recipes that re-train
its head (``rrt``) or pretrain its backbone first (``rnc``) subclass it, with
``frozen_backbone = True``. Like :mod:`rankwise.recipes.dir`, this module imports no Lightning:
reading a config and ``rankwise evaluate`` on the CPU rebuild the plain network
(:mod:`rankwise.recipes.dir_net`) and predict without it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import Field

from rankwise.recipes.base import RegressionRecipe
from rankwise.recipes.config import Config, FDSConfig, LDSConfig, Options, check_lds_fds
from rankwise.recipes.dir_net import (
    DIRNet,
    concat_predictions,
    eval_loader,
    note_label_classes,
    predict,
    predicts_on_cpu,
    regression_loaders,
    run_shot_thresholds,
    write_evaluation,
)
from rankwise.recipes.loss_terms import check_loss_config
from rankwise.recipes.rundir import Run
from rankwise.recipes.stages import Stage

if TYPE_CHECKING:
    from rankwise.recipes.dir_module import DIRRegressor

__all__ = [
    "DIROptions",
    "DIRRecipe",
    "build_net",
    "build_regressor",
    "evaluate_regressor",
    "fit_regressor",
    "predict_regressor",
]


class DIROptions(Options):
    """LDS sample weights and FDS feature smoothing of the regressor (the ``loss`` section: its losses)."""

    lds: LDSConfig = Field(default_factory=LDSConfig, description="label-distribution smoothing / reweighting")
    fds: FDSConfig = Field(default_factory=FDSConfig, description="feature-distribution smoothing")


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


def evaluate_regressor(run: Run, module: DIRNet, checkpoint: str, data: Any = None) -> dict[str, Any]:
    """Val/test shot metrics of ``checkpoints/<checkpoint>.ckpt``, predictions.npz, plots.

    A :class:`~rankwise.recipes.dir_module.DIRRegressor` predicts through a Lightning Trainer on
    ``trainer.accelerator``, which loads the checkpoint (``ckpt_path``); a plain
    :class:`~rankwise.recipes.dir_net.DIRNet` gets it loaded by :meth:`Run.load` and predicts with
    :func:`~rankwise.recipes.dir_net.predict` (on the CPU). Both end in
    :func:`~rankwise.recipes.dir_net.write_evaluation`. ``data``: the training stage's
    ``LightningDataModule`` (its val and test loaders), else the loaders are built here.
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
    loader, and the checkpoint's path: through a Lightning Trainer for a
    :class:`~rankwise.recipes.dir_module.DIRRegressor` (it loads the checkpoint), with
    :func:`~rankwise.recipes.dir_net.predict` on the CPU for a plain :class:`~rankwise.recipes.dir_net.DIRNet`."""
    if _is_lightning(module):
        outs = [run.predict(module, dl, checkpoint) for dl in loaders]
        return [concat_predictions(o) for o, _ in outs], outs[0][1]
    ckpt = run.load(module, checkpoint)
    module.eval()
    return [predict(module, dl) for dl in loaders], ckpt


def _is_lightning(module: Any) -> bool:
    lightning = sys.modules.get("lightning")  # not imported: not a LightningModule
    return lightning is not None and isinstance(module, lightning.LightningModule)


def fit_regressor(run: Run, module: DIRRegressor) -> dict[str, Any]:
    """Train ``module`` (main stage, best = lowest val MAE) and evaluate its best checkpoint on rank 0
    (Lightning loads it: :func:`evaluate_regressor`)."""
    import warnings

    from rankwise.recipes.datamodules import LoaderData
    from rankwise.recipes.own_data import DataDefaultsWarning, empty_group_message

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
        """On the CPU in float32 (where the run's evaluation Trainer would predict) the plain network, no
        Lightning; else the Lightning module, predicting through a Trainer."""
        build = build_net if predicts_on_cpu(run.cfg) else build_regressor
        return build(run, freeze_backbone=self.frozen_backbone)

    def evaluate(self, run: Run, checkpoint: str | None) -> dict[str, Any]:
        """The checkpoint's val/test metrics (the network of :meth:`_module`)."""
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
