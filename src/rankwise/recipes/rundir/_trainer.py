"""Lightning for a run: quiet logs, the epoch line, :class:`Run` (stages, checkpoints, resume, Trainer)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rankwise.recipes import stages as _stages
from rankwise.recipes.config import Config, ConfigError
from rankwise.recipes.rundir._directory import is_launched_worker, unfinished_note
from rankwise.recipes.rundir._files import (
    AtomicCheckpointIO,
    CheckpointError,
    UnfinishedRunWarning,
    check_resume_checkpoint,
    check_state_matches,
    load_state_dict,
    load_weights,
)

log = logging.getLogger("rankwise")

# ------------------------------------------------------------------------------------------ Lightning


def quiet_lightning() -> None:
    """Silence what is not the user's concern: Lightning's info lines and tips, and known warnings."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for pattern in (
        ".*does not have many workers.*",
        ".*Experiment logs directory.*",
        ".*Checkpoint directory.*exists and is not empty.*",
        ".*number of training batches.*",
        ".*LeafSpec.*",
        ".*isinstance.*treespec.*",
        ".*is_leaf.*",
        ".*You are using a CUDA device.*",
        ".*GPU available but not used.*",
    ):
        warnings.filterwarnings("ignore", message=pattern)
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.utils\._pytree")


def _last_checkpoint_class() -> Any:
    from lightning.pytorch.callbacks import ModelCheckpoint

    class LastCheckpoint(ModelCheckpoint):
        """``last.ckpt`` after every epoch (its own class, so its state key differs from the best one's)."""

    return LastCheckpoint


def _epoch_printer(emit: Callable[[str], None]) -> Any:
    import lightning as L

    class EpochLine(L.Callback):
        """One line per epoch (``--no-progress``): epoch metrics and elapsed time."""

        def __init__(self) -> None:
            self.t0 = time.perf_counter()

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            if not trainer.is_global_zero or trainer.sanity_checking:
                return
            metrics = trainer.callback_metrics
            parts = []
            for k, v in sorted(metrics.items()):
                if k.endswith("_step") or f"{k}_epoch" in metrics or not isinstance(v, torch.Tensor) or v.numel() != 1:
                    continue
                parts.append(f"{k.removesuffix('_epoch')} {float(v):.4g}")
            total = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else "?"
            emit(
                f"epoch {trainer.current_epoch + 1}/{total}: {', '.join(parts)} ({time.perf_counter() - self.t0:.1f} s)"
            )

    return EpochLine()


@dataclass
class Run:
    """What a recipe's ``fit``/``evaluate`` gets: the typed config, the data and the run directory.

    Recipes train their stages with :meth:`run_stage` / :meth:`run_stages` (folders, ``done``
    markers, resume, handed-on weights: :mod:`rankwise.recipes.stages`), test or predict from a
    checkpoint with :meth:`test` / :meth:`predict` (Lightning loads it: ``ckpt_path``), load a
    checkpoint into a module by hand with :meth:`load` (weights handed to another module, a
    Lightning-free evaluation), run rank-0 work with :meth:`rank_zero`; :meth:`local_trainer` is
    their one-device Trainer. :meth:`trainer` / :meth:`fit` are the stage lifecycle's
    Trainer and ``fit`` (which resumes a stage from its ``last.ckpt``).
    """

    cfg: Config
    dir: Path
    data: Any
    resume: bool = False
    progress: bool = False
    plots: bool = True
    callbacks: Sequence[Any] = ()
    log_epoch: Callable[[str], None] | None = None
    #: set by :meth:`fit`: rank of this process in the last fitted Trainer
    global_rank: int = 0
    #: ``rankwise evaluate`` (not training): plots of a redone local stage are drawn only when missing
    evaluating: bool = False
    #: the checkpoints whose run status :meth:`checkpoint` has reported
    _status_told: set[Path] = field(default_factory=set, repr=False)
    #: where an evaluation writes its results (predictions, plots); None: the run directory
    results_dir: Path | None = None

    @property
    def results(self) -> Path:
        """The folder of the evaluation's results: :attr:`results_dir`, else the run directory."""
        return self.dir if self.results_dir is None else self.results_dir

    @property
    def is_global_zero(self) -> bool:
        """Whether this process is rank 0 (the one that evaluates and writes): rank 0 of the last fitted
        Trainer, and not a process a DDP launcher started (also when every stage was skipped as done)."""
        return self.global_rank == 0 and not is_launched_worker()

    def rank_zero(self, fn: Callable[..., dict[str, Any]], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """``fn(*args, **kwargs)`` on rank 0 (evaluation, reports); ``{}`` on the other processes."""
        return fn(*args, **kwargs) if self.is_global_zero else {}

    def load(self, module: torch.nn.Module, name: str = "best", stage: str = "") -> Path:
        """Load ``<stage dir>/<name>.ckpt`` into ``module`` (every key and shape checked); returns its path."""
        path = self.checkpoint(name, stage)
        load_weights(module, path)
        return path

    def checked(self, module: torch.nn.Module, name: str = "best", stage: str = "") -> Path:
        """Path of ``<stage dir>/<name>.ckpt`` once it is known to fit ``module`` (every key and shape
        checked, weights-only; :class:`CheckpointError` naming the file), for Lightning to load it."""
        path = self.checkpoint(name, stage)
        check_state_matches(module, load_state_dict(path), path)
        return path

    def test(
        self,
        module: Any,
        data: Any,
        name: str = "best",
        stage: str = "",
        *,
        trainer: Any = None,
        callbacks: Sequence[Any] = (),
    ) -> tuple[dict[str, float], Path]:
        """``trainer.test(module, datamodule=data, ckpt_path=<stage dir>/<name>.ckpt)``: the test metrics
        of a checkpoint (checked with :meth:`checked`) and its path. ``trainer``: the Trainer to test with
        (default: :meth:`local_trainer` with ``callbacks``)."""
        path = self.checked(module, name, stage)
        trainer = trainer if trainer is not None else self.local_trainer(callbacks=callbacks)
        with _restoring_weights():
            out = trainer.test(module, datamodule=data, ckpt_path=path, weights_only=True, verbose=False)
        return dict(out[0]), path

    def predict(self, module: Any, loaders: Any, name: str = "best", stage: str = "") -> tuple[list[Any], Path]:
        """``trainer.predict(module, loaders, ckpt_path=<stage dir>/<name>.ckpt)`` on one device (the checkpoint
        checked with :meth:`checked`): the outputs and the checkpoint's path. ``loaders``: a
        ``DataLoader`` or a ``LightningDataModule`` (its ``predict_dataloader``)."""
        import lightning as L

        path = self.checked(module, name, stage)
        kw = {"datamodule": loaders} if isinstance(loaders, L.LightningDataModule) else {"dataloaders": loaders}
        with _restoring_weights():
            out = self.local_trainer().predict(module, ckpt_path=path, weights_only=True, **kw)
        return list(out or []), path

    def run_stage(self, stage: _stages.Stage) -> _stages.StageResult:
        """Train one stage of the recipe (see :mod:`rankwise.recipes.stages`)."""
        return _stages.run_stage(self, stage)

    def run_stages(self, stages: Sequence[Any]) -> list[_stages.StageResult]:
        """Train stages in order (see :func:`rankwise.recipes.stages.run_stages`)."""
        return _stages.run_stages(self, stages)

    def ckpt_dir(self, stage: str = "") -> Path:
        """``RUN_DIR/<stage or "checkpoints">``; a stage this evaluation redid in :attr:`results_dir` (a
        ``local`` stage, see :mod:`rankwise.recipes.stages`): that folder."""
        if stage and self.results_dir is not None and (self.results_dir / stage).is_dir():
            return self.results_dir / stage
        return self.dir / (stage or "checkpoints")

    def checkpoint(self, name: str = "last", stage: str = "") -> Path:
        """Path of ``<stage dir>/<name>.ckpt`` (``CheckpointError`` if it does not exist).

        When evaluating or predicting (:attr:`evaluating`) from a run whose training did not finish
        (meta.json's status ``running``: the process was killed; ``failed``), a
        :class:`~rankwise.recipes.rundir.UnfinishedRunWarning` says so and names the checkpoint used,
        once per checkpoint."""
        p = self.ckpt_dir(stage) / f"{name}.ckpt"
        if not p.is_file():
            raise CheckpointError(f"{self.dir} has no {p.relative_to(self.dir)}")
        if self.evaluating and p not in self._status_told:
            self._status_told.add(p)
            note = unfinished_note(self.dir, p)
            if note:
                warnings.warn(note, UnfinishedRunWarning, stacklevel=2)
        return p

    @property
    def plots_dir(self) -> Path | None:
        """``RUN_DIR/plots`` (created) when plots are on, else ``None``."""
        if not self.plots:
            return None
        p = self.results / "plots"
        p.mkdir(exist_ok=True)
        return p

    def trainer(
        self,
        *,
        max_epochs: int,
        stage: str = "",
        monitor: str | None = None,
        mode: str = "min",
        best: bool = True,
        loggers: bool = True,
        callbacks: Sequence[Any] = (),
    ) -> Any:
        """The Trainer of a training stage: devices/strategy/precision from ``trainer``, checkpoints, logs.

        Checkpoints go to ``checkpoints/`` (main stage) or ``<stage>/``: ``last.ckpt`` after every
        epoch and, with ``best``, ``best.ckpt`` (lowest/highest ``monitor``; without a monitor the
        latest epoch, i.e. the checkpoint the recipe evaluates). Logs: ``logs/[stage/]metrics.csv``
        and ``tb/[stage]``. ``callbacks``: this stage's own, after those of the run.
        """
        import lightning as L
        from lightning.pytorch.callbacks import ModelCheckpoint

        t = self.cfg.trainer
        ckpt_dir = self.ckpt_dir(stage)
        cbs: list[Any] = []
        if best:
            cbs.append(
                ModelCheckpoint(
                    dirpath=ckpt_dir,
                    filename="best",
                    monitor=monitor,
                    mode=mode,
                    save_top_k=1,
                    save_last=False,
                    auto_insert_metric_name=False,
                    enable_version_counter=False,
                )
            )
        cbs.append(
            _last_checkpoint_class()(
                dirpath=ckpt_dir, filename="last", monitor=None, save_top_k=1, enable_version_counter=False
            )
        )
        progress = self.progress and t.enable_progress_bar
        if progress:
            from rankwise.recipes._progress import EpochProgressBar

            cbs.append(EpochProgressBar(leave=False))
        elif self.log_epoch is not None:
            cbs.append(_epoch_printer(self.log_epoch))
        cbs.extend(self.callbacks)
        cbs.extend(callbacks)
        logger: Any = False
        if loggers:
            from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

            logger = [
                CSVLogger(self.dir, name="logs", version=stage),
                TensorBoardLogger(self.dir, name="tb", version=stage),
            ]
        kwargs: dict[str, Any] = {
            "default_root_dir": str(self.dir),
            "max_epochs": max_epochs,
            "accelerator": t.accelerator,
            "devices": t.devices,
            "strategy": t.strategy,
            "num_nodes": t.num_nodes,
            "precision": t.precision,
            "deterministic": t.deterministic,
            "gradient_clip_val": t.gradient_clip_val,
            "log_every_n_steps": t.log_every_n_steps,
            "logger": logger,
            "callbacks": cbs,
            "enable_progress_bar": progress,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
            "plugins": [AtomicCheckpointIO()],
        }
        if t.limit_train_batches is not None:
            kwargs["limit_train_batches"] = t.limit_train_batches
        if t.limit_val_batches is not None:
            kwargs["limit_val_batches"] = t.limit_val_batches
        return _make_trainer(L.Trainer, kwargs)

    def fit(self, trainer: Any, module: Any, data: Any, val_dl: Any = None, *, stage: str = "") -> None:
        """``trainer.fit`` on ``data`` (a ``LightningDataModule``, or a training loader and ``val_dl``); with
        ``resume``, the stage continues from its ``last.ckpt`` when there is one."""
        import lightning as L

        ckpt = self._resume_from(module, stage) if self.resume else None
        if isinstance(data, L.LightningDataModule):
            trainer.fit(module, datamodule=data, ckpt_path=ckpt, weights_only=True)
        else:
            trainer.fit(module, data, val_dl, ckpt_path=ckpt, weights_only=True)
        self.global_rank = int(trainer.global_rank)

    def check_last(self, module: Any, stage: str = "") -> int | None:
        """The stage's ``last.ckpt`` is a checkpoint ``--resume`` could continue, as for a stage that
        continues (else :class:`CheckpointError` naming it); returns the epochs it has trained (``None``
        for a stage not started yet)."""
        last = self._last_checkpoint(stage)
        return None if last is None else check_resume_checkpoint(last, module)

    def _resume_from(self, module: Any, stage: str) -> str | None:
        """The ``last.ckpt`` a resumed stage continues from (checked), ``None`` for a stage not started yet."""
        last = self._last_checkpoint(stage)
        if last is None:
            return None
        check_resume_checkpoint(last, module)
        return str(last)

    def _last_checkpoint(self, stage: str) -> Path | None:
        """The stage's ``last.ckpt``, ``None`` for a stage not started yet.

        A stage directory holding other checkpoints (``best.ckpt``) but no usable ``last.ckpt``
        is refused: retraining it from epoch 1 would silently discard the finished epochs.
        """
        last = self.ckpt_dir(stage) / "last.ckpt"
        if not os.path.lexists(last):
            folder = self.ckpt_dir(stage)
            others = sorted(p.name for p in folder.glob("*.ckpt")) if folder.is_dir() else []
            if others:
                raise CheckpointError(
                    f"cannot --resume: {last} is missing (the directory holds {', '.join(others)}); rankwise "
                    "resumes only from last.ckpt: restore it, or start again with --overwrite"
                )
            return None
        return last

    def local_trainer(
        self,
        *,
        max_epochs: int | None = None,
        root: Path | None = None,
        checkpoint: bool = False,
        precision: bool = True,
        callbacks: Sequence[Any] = (),
    ) -> Any:
        """A quiet single-device Trainer on ``trainer.accelerator`` (evaluation, prediction, a local stage).

        With ``root``, its CSV log goes to ``root/logs`` and, with ``checkpoint``, ``root/last.ckpt``.
        """
        import lightning as L

        kw: dict[str, Any] = {
            "accelerator": self.cfg.trainer.accelerator,
            "devices": 1,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "callbacks": list(callbacks),
        }
        if precision:
            kw["precision"] = self.cfg.trainer.precision
        if max_epochs is not None:
            kw["max_epochs"] = max_epochs
        if root is not None:
            from lightning.pytorch.callbacks import ModelCheckpoint
            from lightning.pytorch.loggers import CSVLogger

            kw |= {
                "default_root_dir": str(root),
                "logger": CSVLogger(root, name="logs", version=""),
                "log_every_n_steps": 1,
            }
            if checkpoint:
                kw |= {
                    "enable_checkpointing": True,
                    # a redone stage replaces its last.ckpt (no last-v1.ckpt beside a stale one)
                    "callbacks": [
                        *callbacks,
                        ModelCheckpoint(dirpath=root, save_top_k=0, save_last=True, enable_version_counter=False),
                    ],
                    "plugins": [AtomicCheckpointIO()],
                }
        return _make_trainer(L.Trainer, kw)


@contextlib.contextmanager
def _restoring_weights() -> Iterator[None]:
    """Lightning evaluating from ``ckpt_path`` warns that the training callbacks are absent: only the weights
    are restored there, on purpose."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Be aware that when using `ckpt_path`")
        yield


def _make_trainer(cls: Any, kwargs: dict[str, Any]) -> Any:
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    try:
        return cls(**kwargs)
    except (MisconfigurationException, ValueError, TypeError) as e:  # e.g. an unknown `trainer.strategy`
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"invalid `trainer` settings: {first}") from None
