"""Lightning for a run: quiet logs, the epoch line, :class:`Run` (stages, checkpoints, resume, Trainer)."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rankwise._fileio import atomic_open
from rankwise._lightning import quiet_lightning as quiet_lightning
from rankwise.recipes import stages as _stages
from rankwise.recipes.config import Config, ConfigError, config_changes, config_to_dict
from rankwise.recipes.rundir._directory import is_launched_worker, unfinished_note
from rankwise.recipes.rundir._files import (
    AtomicCheckpointIO,
    CheckpointError,
    UnfinishedRunWarning,
    check_state_matches,
    load_checkpoint,
    load_resume_checkpoint,
    load_state_dict,
    load_weights,
)

log = logging.getLogger("rankwise")

# ------------------------------------------------------------------------------------------ Lightning


def _one_process(t: Any) -> bool:
    """Whether the Trainer of ``t`` (the trainer section) trains in this process alone: then a stage's
    checkpoints may be written in the background. Under DDP the other ranks read rank 0's checkpoints
    when a stage ends, so there every write is finished before the save returns."""
    if os.environ.get("WORLD_SIZE", "1") != "1" or t.num_nodes != 1 or t.strategy not in ("auto", "single_device"):
        return False
    if t.devices in (1, "1", [0]) or (t.accelerator == "cpu" and t.devices == "auto"):
        return True
    return t.devices == "auto" and not _many_accelerators()


def _many_accelerators() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 1


@functools.cache
def _epoch_checkpoint_class() -> Any:
    """Lightning's ``ModelCheckpoint`` saving at epoch ends, with two per-step costs taken out that change
    nothing: the batch-end hook returns at once when no step or time interval is set (Lightning's own check
    then always skips), and the state key (a ``repr`` of the trigger settings, which Lightning computes at
    every hook of every step to name its profiler span) is computed once."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    class EpochCheckpoint(ModelCheckpoint):
        @property
        def state_key(self) -> str:
            key = self.__dict__.get("_rankwise_state_key")
            if key is None:
                key = self.__dict__["_rankwise_state_key"] = super().state_key
            return str(key)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if self._every_n_train_steps >= 1 or self._train_time_interval is not None:
                super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    return EpochCheckpoint


@functools.cache
def _best_checkpoint_class() -> Any:
    class BestCheckpoint(_epoch_checkpoint_class()):  # type: ignore[misc]
        """``best.ckpt``; its state key is ``ModelCheckpoint{...}``, as Lightning's own class."""

    BestCheckpoint.__qualname__ = "ModelCheckpoint"
    return BestCheckpoint


@functools.cache
def _last_checkpoint_class() -> Any:
    class LastCheckpoint(_epoch_checkpoint_class()):  # type: ignore[misc]
        """``last.ckpt`` after every epoch (its own class, so its state key differs from the best one's)."""

    return LastCheckpoint


def _csv_logger(root: Path, name: str, version: str) -> Any:
    """Lightning's ``CSVLogger`` at ``root/name/version/metrics.csv``, keeping the rows already there.

    Lightning's own logger deletes an existing ``metrics.csv`` when it starts: a resumed stage would
    lose the rows of the epochs before its checkpoint (and a resume that fails at once, the whole
    file). This one writes every logged row at once (``flush_logs_every_n_steps=1``: the rows of
    every finished epoch are on disk by its checkpoint) and, at its first write, keeps the file's
    rows of the epochs before the first one it logs: a stage continued from ``last.ckpt`` at epoch
    ``e`` drops only the rows of ``e`` onwards (those of the interrupted epoch, logged again), a stage
    redone from epoch 0 replaces its log. Every rewrite of the file is atomic
    (:func:`rankwise._fileio.atomic_open`); nothing is written until a row is logged.
    """
    import csv

    from lightning.fabric.loggers.logger import rank_zero_experiment
    from lightning.pytorch.loggers import CSVLogger
    from lightning.pytorch.loggers.csv_logs import ExperimentWriter

    def write_rows(path: str, keys: list[str], rows: Sequence[dict[str, Any]]) -> None:
        with atomic_open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            writer.writerows(rows)

    def epoch_of(row: dict[str, Any]) -> float | None:
        try:
            return float(row.get("epoch"))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None

    class AppendingWriter(ExperimentWriter):
        def __init__(self, log_dir: str) -> None:
            super().__init__(log_dir)
            self._merged = False

        def _check_log_dir_exists(self) -> None:  # Lightning's: deletes metrics.csv
            pass

        def save(self) -> None:
            if self._merged or not self.metrics:
                super().save()
                return
            rows: list[dict[str, Any]] = []
            keys: set[str] = set().union(*self.metrics)
            if os.path.isfile(self.metrics_file_path):
                with open(self.metrics_file_path, newline="") as f:
                    reader = csv.DictReader(f)
                    old = list(reader)
                    keys |= set(reader.fieldnames or ())
                starts = [e for e in map(epoch_of, self.metrics) if e is not None]
                first = min(starts) if starts else None
                rows = [r for r in old if first is None or (e := epoch_of(r)) is None or e < first]
            self.metrics_keys = sorted(keys)
            write_rows(self.metrics_file_path, self.metrics_keys, [*rows, *self.metrics])
            self.metrics, self._merged = [], True

        def _rewrite_with_new_header(self, fieldnames: list[str]) -> None:
            with open(self.metrics_file_path, newline="") as f:
                rows = list(csv.DictReader(f))
            write_rows(self.metrics_file_path, fieldnames, rows)

    class AppendingCSVLogger(CSVLogger):
        @property
        @rank_zero_experiment
        def experiment(self) -> Any:
            if self._experiment is None:
                self._fs.makedirs(self.root_dir, exist_ok=True)
                self._experiment = AppendingWriter(log_dir=self.log_dir)
            return self._experiment

    return AppendingCSVLogger(root, name=name, version=version, flush_logs_every_n_steps=1)


#: the key of a training checkpoint that records the run's config (:func:`_config_record`)
CONFIG_KEY = "rankwise_config"

#: config keys a resume honours when they differ from the checkpoint's: hardware, logging, the run's
#: name and folder, evaluation and reports; epoch counts (``*max_epochs``, ``*_epochs``) too, raised
#: (lowered below what a stage has trained: refused by :meth:`Run.check_last`). ``data.options``: the
#: run's data record checks them.
RESUME_HONOURS = (
    "description",
    "expected_time",
    "run.name",
    "run.out_dir",
    "trainer.accelerator",
    "trainer.devices",
    "trainer.strategy",
    "trainer.num_nodes",
    "trainer.num_threads",
    "trainer.memory_check",
    "trainer.enable_progress_bar",
    "trainer.log_every_n_steps",
    "data.num_workers",
    "data.eval_batch_size",
    "report.",
    "data.options.",
)


def _is_epochs_key(key: str) -> bool:
    last = key.rsplit(".", 1)[-1]
    return last == "max_epochs" or last.endswith("_epochs")


def _honoured(key: str) -> bool:
    return _is_epochs_key(key) or any(key == h or (h.endswith(".") and key.startswith(h)) for h in RESUME_HONOURS)


#: the key of a training checkpoint that records the global random state when it was written
RNG_KEY = "rankwise_rng"


def rng_state() -> dict[str, Any]:
    """The global random state (``random``, NumPy's legacy RNG, torch on the CPU) as weights-only data."""
    import random

    import numpy as np

    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # noqa: NPY002 - the global RNG
    version, internal, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": [
            str(name),
            torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            int(pos),
            int(has_gauss),
            float(cached),
        ],
        "python": [int(version), torch.tensor(internal, dtype=torch.int64), gauss_next],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Set the global random state to one of :func:`rng_state`."""
    import random

    import numpy as np

    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))  # noqa: NPY002
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(int(v) for v in internal.tolist()), gauss_next))


def _run_record(cfg: Config) -> Any:
    import lightning as L

    record = config_to_dict(cfg)

    class RunRecord(L.Callback):
        """Writes into every checkpoint the run's config (``CONFIG_KEY``: what a resume compares its own
        with) and the global random state (``RNG_KEY``: what :meth:`Run.restore_rng` sets after the stage)."""

        def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
            checkpoint[CONFIG_KEY] = record
            checkpoint[RNG_KEY] = rng_state()

    return RunRecord()


def _edit_text(key: str, old: Any, new: Any) -> str:
    return f"`{key}` is {new!r} now, but was {old!r}"


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

    Recipes train their stages with :meth:`run_stage` / :meth:`run_stages`, the one stage loop
    (folders, ``done`` markers, resume, handed-on weights: :mod:`rankwise.recipes.stages`), test or
    predict from a checkpoint with :meth:`test` / :meth:`predict` (Lightning loads it: ``ckpt_path``),
    load a checkpoint into a module by hand with :meth:`load` (weights handed to another module, a
    Lightning-free evaluation), run rank-0 work with :meth:`rank_zero`; :meth:`local_trainer` is
    their one-device Trainer. :meth:`trainer` / :meth:`fit` are the Trainer of a stage and its ``fit``
    (which resumes a stage from its ``last.ckpt``), what the stage loop calls.
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
    #: the training data as the run's ``data.json`` records them (label bins, classes, input size), where
    #: :attr:`data` changed since training (``rankwise evaluate --allow-changed-data``); None: :attr:`data`
    trained_data: Any = None

    @property
    def results(self) -> Path:
        """The folder of the evaluation's results: :attr:`results_dir`, else the run directory."""
        return self.dir if self.results_dir is None else self.results_dir

    @property
    def model_data(self) -> Any:
        """The data a recipe builds the run's model from (the training labels' bins and classes, the input
        size): :attr:`trained_data`, else :attr:`data`. The model then has the shapes it was trained with,
        also where it is evaluated on data that changed since."""
        return self.data if self.trained_data is None else self.trained_data

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
        """Train ``stage`` (skipped when done), load the weights it hands on and restore the random state at
        the end of its training: the one stage loop of the run (see :mod:`rankwise.recipes.stages`).

        A stage with a ``done`` marker is skipped; under ``--resume`` its ``last.ckpt`` is checked first
        (:meth:`check_last`), and one that has trained fewer epochs than the stage now asks for continues.
        A stage that trains gets :meth:`trainer`, :meth:`fit` (from ``last.ckpt`` under ``--resume``), its
        ``done`` marker (rank 0) and its curves; then the ``hand_on`` checkpoint is loaded into its module
        and the random state its ``last.ckpt`` recorded is restored (:meth:`restore_rng`).
        """
        _check_stage_data(stage)
        if stage.local:
            return self._run_local_stage(stage)
        done = self.ckpt_dir(stage.name) / _stages.DONE
        secs = _stages.read_done(done)
        if secs is not None and self.resume:  # not retrained, but resumed only from sound checkpoints
            trained = self.check_last(stage.module, stage.name, stage.epochs)
            if (trained or stage.epochs) < stage.epochs:
                secs = None  # finished, but its config.yaml now asks for more epochs: it continues from last.ckpt
        result = _stages.StageResult(stage, skipped=secs is not None)
        if secs is None:
            timer = _epoch_timer()
            trainer = self.trainer(
                max_epochs=stage.epochs,
                stage=stage.name,
                monitor=stage.monitor,
                mode=stage.mode,
                best=stage.best,
                callbacks=[timer, *stage.callbacks],
            )
            with _quiet(stage.quiet):
                self.fit(trainer, stage.module, stage.data, stage=stage.name)
            if self.is_global_zero:
                _stages.write_done(done, timer.seconds)
            result.trainer, result.epoch_seconds = trainer, list(timer.seconds)
            if stage.curves:
                _stages.plot_stage_curves(self, _stages.stage_log(self, stage.name), stage.name, stage.curves)
        else:
            result.epoch_seconds = secs
        if stage.hand_on is not None:
            self.load(stage.module, stage.hand_on, stage.name)
        self.restore_rng(stage.name)
        return result

    def _run_local_stage(self, stage: _stages.Stage) -> _stages.StageResult:
        """A ``local`` stage: one device, rank 0 only, redone every time (no ``done`` marker)."""
        result = _stages.StageResult(stage)
        if not self.is_global_zero:
            return result
        root = self.results / stage.name  # redone by every evaluation: one on changed data writes elsewhere
        timer = _epoch_timer()
        trainer = self.local_trainer(
            max_epochs=stage.epochs, root=root, checkpoint=True, precision=stage.precision, callbacks=[timer]
        )
        with _quiet(stage.quiet):
            trainer.fit(stage.module, datamodule=stage.data)
        result.trainer, result.epoch_seconds = trainer, list(timer.seconds)
        drawn = (self.results / "plots" / f"{stage.name}_curves.png").is_file()
        if stage.curves and not (self.evaluating and drawn):  # an evaluation draws them if missing
            _stages.plot_stage_curves(self, root / "logs" / "metrics.csv", stage.name, stage.curves)
        if stage.hand_on is not None:
            self.load(stage.module, stage.hand_on, stage.name)
        return result

    def run_stages(
        self, stages: Sequence[_stages.Stage | Callable[[list[_stages.StageResult]], _stages.Stage]]
    ) -> list[_stages.StageResult]:
        """Run ``stages`` in order (:meth:`run_stage`); a callable entry builds its stage from the results
        before it (so a stage's module is built after the stages it starts from have trained and handed
        on their weights)."""
        results: list[_stages.StageResult] = []
        for s in stages:
            stage = s if isinstance(s, _stages.Stage) else s(results)
            results.append(self.run_stage(stage))
        return results

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

        t = self.cfg.trainer
        ckpt_dir = self.ckpt_dir(stage)
        cbs: list[Any] = []
        if best:
            cbs.append(
                _best_checkpoint_class()(
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
        cbs.append(_run_record(self.cfg))
        logger: Any = False
        if loggers:
            from lightning.pytorch.loggers import TensorBoardLogger

            logger = [
                _csv_logger(self.dir, "logs", stage),
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
            "plugins": [AtomicCheckpointIO(background=_one_process(t))],
        }
        if t.limit_train_batches is not None:
            kwargs["limit_train_batches"] = t.limit_train_batches
        if t.limit_val_batches is not None:
            kwargs["limit_val_batches"] = t.limit_val_batches
        return _make_trainer(L.Trainer, kwargs)

    def fit(self, trainer: Any, module: Any, data: Any, val_dl: Any = None, *, stage: str = "") -> None:
        """``trainer.fit`` on ``data`` (a ``LightningDataModule``, or a training loader and ``val_dl``); with
        ``resume``, the stage continues from its ``last.ckpt`` when there is one (checked by :meth:`check_last`
        against ``trainer.max_epochs``)."""
        import lightning as L

        ckpt = None
        if self.resume:
            self.check_last(module, stage, trainer.max_epochs)
            last = self._last_checkpoint(stage)
            ckpt = None if last is None else str(last)
        if isinstance(data, L.LightningDataModule):
            trainer.fit(module, datamodule=data, ckpt_path=ckpt, weights_only=True)
        else:
            trainer.fit(module, data, val_dl, ckpt_path=ckpt, weights_only=True)
        self.global_rank = int(trainer.global_rank)

    def restore_rng(self, stage: str = "") -> None:
        """Set the global random state to the one the stage's ``last.ckpt`` recorded (the end of its last
        epoch): what follows the stage draws the same numbers whether this process trained it or a resumed
        one skipped it. A checkpoint without the record (written by an older rankwise) changes nothing."""
        last = self.ckpt_dir(stage) / "last.ckpt"
        if not last.is_file():
            return
        state = load_checkpoint(last).get(RNG_KEY)
        if isinstance(state, dict):
            set_rng_state(state)

    def check_last(self, module: Any, stage: str = "", epochs: int | None = None) -> int | None:
        """The stage's ``last.ckpt`` is a checkpoint ``--resume`` can continue (else :class:`CheckpointError`
        naming it); returns the epochs it has trained (``None`` for a stage not started yet).

        Beside the file itself (:func:`~rankwise.recipes.rundir.check_resume_checkpoint`), the run's config
        is compared with the one the checkpoint records: a key a resume cannot honour (one outside
        :data:`RESUME_HONOURS`: the optimizer's learning rate, whose restored state would win, the
        precision, the loss, the model) that differs is a :class:`ConfigError` naming it, and so is a
        stage whose ``epochs`` are fewer than the checkpoint has trained.
        """
        last = self._last_checkpoint(stage)
        if last is None:
            return None
        ckpt, trained = load_resume_checkpoint(last, module)
        record = ckpt.get(CONFIG_KEY)
        edits = config_changes(record, config_to_dict(self.cfg)) if isinstance(record, dict) else {}
        refused = {k: v for k, v in edits.items() if not _honoured(k)}
        where = f"cannot --resume {self.dir}"
        if refused:
            shown = "; ".join(_edit_text(k, *v) for k, v in list(refused.items())[:3])
            more = f" (and {len(refused) - 3} more)" if len(refused) > 3 else ""
            raise ConfigError(
                f"{where}: {shown}{more} when {last.relative_to(self.dir)} was written (config.yaml or the "
                "command line); a resume continues the same training, whose checkpointed state would win: "
                "set it back, or train a new run (another --out, or --overwrite)"
            )
        if epochs is not None and trained is not None and trained > epochs:
            lowered = [k for k, (old, new) in edits.items() if _is_epochs_key(k) and new == epochs]
            what = f"`{lowered[0]}` is {epochs} now" if lowered else f"stage {stage!r} asks for {epochs} epochs"
            raise ConfigError(
                f"{where}: {what}, but {last.relative_to(self.dir)} has trained {trained} epochs already; set it to "
                f"at least {trained}, or train a new run (another --out, or --overwrite)"
            )
        return trained

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

            kw |= {
                "default_root_dir": str(root),
                "logger": _csv_logger(root, "logs", ""),
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


def _check_stage_data(stage: _stages.Stage) -> None:
    import lightning as L

    if not isinstance(stage.data, L.LightningDataModule):
        raise TypeError(
            f"`data` of stage {stage.name!r} must be a lightning.LightningDataModule "
            f"(e.g. rankwise.recipes.datamodules.LoaderData), got {type(stage.data).__name__}"
        )


def _epoch_timer() -> Any:
    import lightning as L

    class EpochTimer(L.Callback):
        """Wall seconds of every training epoch (``seconds``)."""

        def __init__(self) -> None:
            self.seconds: list[float] = []
            self._t0 = 0.0

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            self._t0 = time.perf_counter()

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            self.seconds.append(time.perf_counter() - self._t0)

    return EpochTimer()


@contextlib.contextmanager
def _quiet(patterns: Sequence[str]) -> Iterator[None]:
    if not patterns:
        yield
        return
    with warnings.catch_warnings():
        for p in patterns:
            warnings.filterwarnings("ignore", message=p)
        yield


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
