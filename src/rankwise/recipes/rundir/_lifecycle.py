"""The lifecycle of ``rankwise train`` / ``evaluate`` / ``predict``: data checks, signals, :func:`run_recipe`,
:func:`evaluate_run`, :func:`predict_run`."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rankwise.recipes import stages as _stages
from rankwise.recipes.config import Config, ConfigError
from rankwise.recipes.rundir import _record
from rankwise.recipes.rundir._directory import RunDir, is_launched_worker
from rankwise.recipes.rundir._files import ModelMismatchError, RunTerminated, git_hash, write_json
from rankwise.recipes.rundir._trainer import Run, quiet_lightning

log = logging.getLogger("rankwise")

# ------------------------------------------------------------------------------------------ lifecycle


def load_data(cfg: Config, recipe: Any) -> Any:
    """Load ``cfg.data`` (through ``recipe.load_data`` where the recipe has one: see
    :meth:`~rankwise.recipes.Recipe.load_data`) and check it suits ``recipe`` (its
    ``learns``, non-empty splits)."""
    return _load_data_files(cfg, recipe)[0]


def _load_data_files(cfg: Config, recipe: Any) -> tuple[Any, list[Path]]:
    """:func:`load_data` and the files its loader read (:func:`rankwise.data._files.recording_reads`)."""
    from rankwise.data import DataFormatError
    from rankwise.data._files import recording_reads

    try:
        with recording_reads() as read:
            data = recipe.load_data(cfg)  # a recipe may read its data its own way
    except (DataFormatError, ConfigError):  # they name the file or the key themselves
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(f"cannot load dataset `data.name` {cfg.data.name!r} with `data.options`: {e}") from None
    check_data(cfg, recipe, data)
    return data, read


def load_checked_data(
    cfg: Config,
    recipe: Any,
    run_dir: Path,
    *,
    action: str,
    allow_changed: bool = False,
    data: Any = None,
    check_config: bool = True,
) -> tuple[Any, bool]:
    """The data of the existing run ``run_dir`` read again (``data``: given by the caller, not read) after
    the checks of its ``data.json`` (:mod:`rankwise.recipes.rundir._record`: the data section of
    config.yaml, the files' fingerprints, then the split): one
    :class:`~rankwise.recipes.rundir._record.DataChangedError` naming the key or file, unless
    ``allow_changed`` (warnings then). Returns the data and whether they differ from the trained ones."""
    record = _record.read_record(run_dir)
    changed = False
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", _record.ChangedDataWarning)
        if record is not None:
            if check_config:
                _record.check_options(record, cfg, allow_changed=allow_changed, action=action)
            if data is None:
                _record.check_files(record, allow_changed=allow_changed, action=action)
        if data is None:
            data = load_data(cfg, recipe)
        else:
            check_data(cfg, recipe, data)
        if record is not None:
            _record.check_split(record, data, allow_changed=allow_changed, action=action)
    for w in seen:  # shown again, outside the recording
        changed = changed or issubclass(w.category, _record.ChangedDataWarning)
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return data, changed


def record_resolved_options(cfg: Config, data: Any) -> None:
    """Write into ``cfg.data.options`` the loader options that ``data`` resolved from its files.

    A loader that derives an option from the data (``letor``: ``num_features``) lists the values it
    used in ``data.meta["resolved_options"]``; the run's ``config.yaml`` then records them, and a
    resumed or re-evaluated run reads the same.
    """
    meta = getattr(data, "meta", None)
    resolved = meta.get("resolved_options") if isinstance(meta, dict) else None
    if isinstance(resolved, dict):
        cfg.data.options.update(resolved)


def check_data(cfg: Config, recipe: Any, data: Any) -> None:
    """The dataset's task (from its spec's modality, :func:`rankwise.data.task_of`) is the recipe's
    ``learns`` and no split it uses is empty."""
    from rankwise.data import task_of

    try:
        task = task_of(cfg.data.name, data)
    except TypeError as e:
        raise ConfigError(f"dataset `{cfg.data.name}`: {e}") from None
    regression = task == "regression"
    ranking = task == "ranking"
    if (recipe.learns == "ranking") != ranking:
        what = "a ranking (query-list) dataset such as letor or ltr_synthetic" if ranking else "not a ranking dataset"
        need = (
            "a ranking dataset (letor, ltr_synthetic)" if recipe.learns == "ranking" else f"a {recipe.learns} dataset"
        )
        raise ConfigError(
            f"dataset `{cfg.data.name}` is {what}; recipe {recipe.name!r} needs {need} (see `rankwise data list`)"
        )
    if recipe.learns == "regression" and not regression:
        raise ConfigError(
            f"dataset `{cfg.data.name}` is a classification dataset; recipe {recipe.name!r} needs a regression "
            "dataset (see `rankwise data list`)"
        )
    if recipe.learns == "classification" and task != "classification":
        raise ConfigError(
            f"recipe {recipe.name!r} needs a classification dataset, got the regression dataset `{cfg.data.name}`"
        )
    splits = ("train", "val", "test") if regression or ranking else ("train", "test")
    for s in splits:
        split = getattr(data, s, None)
        if split is None or len(split) == 0:
            raise ConfigError(
                f"dataset `{cfg.data.name}` (options {cfg.data.options}) has an empty {s} split; it needs at least "
                f"one example in each of {', '.join(splits)} (more rows, or other `data.options`)"
            )
    if regression:
        _check_target_range(cfg, data)


def target_limit(precision: str) -> float:
    """The largest ``|target|`` a regression run trains on at ``trainer.precision``.

    float32 (and bfloat16, same range): ``sqrt(float32 max) / 2`` (about 9.2e18), so that the
    squared error of a prediction within the target range stays finite; ``16-true``: a quarter of
    the float16 maximum (16,376); ``64-true``: the float64 counterpart.
    """
    if precision in ("64-true", "64"):
        return math.sqrt(float(np.finfo(np.float64).max)) / 2
    if precision == "16-true":
        return float(np.finfo(np.float16).max) / 4
    return math.sqrt(float(np.finfo(np.float32).max)) / 2


def _check_target_range(cfg: Config, data: Any) -> None:
    """Refuse targets whose losses overflow the training dtype (the run would stop at its first step)."""
    limit = target_limit(str(cfg.trainer.precision))
    for split in ("train", "val", "test"):
        y = np.asarray(getattr(data, f"{split}_labels", []))
        if y.size == 0 or not np.issubdtype(y.dtype, np.number):
            continue
        top = float(np.max(np.abs(y)))
        if not top <= limit:
            raise ConfigError(
                f"dataset `{cfg.data.name}`: {split} targets reach |y| = {top:.3g}, beyond {limit:.3g}, the largest "
                f"target whose squared error stays finite at `trainer.precision` {cfg.trainer.precision!r}; "
                "rescale the target column (e.g. divide it by a power of ten)"
            )


#: the signals that stop a run (:class:`RunTerminated`)
_STOP_SIGNALS = [signal.SIGTERM, signal.SIGINT] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """Turn SIGTERM / SIGHUP / SIGINT into :class:`RunTerminated` in the main thread for the duration of a run.

    SIGINT (Ctrl-C) too: Lightning turns a ``KeyboardInterrupt`` into ``exit(1)`` without a word,
    whereas the CLI promises exit status 130 and an "interrupted" line.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if hasattr(signal, "SIGCHLD"):  # the DataLoader's workers die of the same signal: no second error
            # a Python handler that does nothing, not SIG_DFL: a SIGCHLD already received (a worker killed
            # at the same moment) is handled after this one, and Python reports one whose handler became
            # SIG_DFL meanwhile as "OSError: Signal 17 ignored due to race condition"
            signal.signal(signal.SIGCHLD, _ignore_signal)
        raise RunTerminated(signum)

    old = {s: signal.signal(s, handler) for s in _STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _ignore_signal(signum: int, frame: Any) -> None:
    """The SIGCHLD handler of a run that a signal stops: the workers' exit is expected."""


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


def _common_metrics(recipe: Any, cfg: Config) -> dict[str, Any]:
    return {
        "recipe": recipe.name,
        "method": recipe.method(cfg),
        "dataset": cfg.data.name,
        "run": cfg.run.name,
        "seed": cfg.run.seed,
    }


def run_recipe(
    recipe: Any,
    cfg: Config,
    run_dir: Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    plots: bool | None = None,
    data: Any = None,
    callbacks: Sequence[Any] = (),
    log_epoch: Callable[[str], None] | None = None,
    fit_to_data: Callable[[Config, Any], Any] | None = None,
) -> dict[str, Any]:
    """Train ``cfg`` with ``recipe`` in ``run_dir`` (the lifecycle of the module doc); returns metrics.json.

    ``fit_to_data(cfg, data)``: a new run's settings that its data decide, written into ``cfg``
    before config.yaml is; called first with ``data=None`` (before the data are read), then with the
    data (:func:`rankwise.recipes.own_data.apply_data_defaults`).

    Rank > 0 of a distributed run returns ``{}`` (rank 0 owns the directory, evaluates and reports).
    """
    import lightning as L

    quiet_lightning()
    worker = is_launched_worker()
    if not resume and fit_to_data is not None:  # what needs no data is said first
        fit_to_data(cfg, None)
    if not worker:  # an unusable run directory is refused before the data are read
        RunDir.check(run_dir, resume=resume, overwrite=overwrite)
    read: list[Path] = []
    if resume:  # the data it started on: the checks of its data.json
        data, _ = load_checked_data(cfg, recipe, Path(run_dir), action="resume", data=data)
    else:
        _record.absolute_data_paths(cfg)
        if data is None:
            data, read = _load_data_files(cfg, recipe)
        else:
            check_data(cfg, recipe, data)
        if fit_to_data is not None:  # e.g. the bins, shot groups, batch and epochs of the data
            fit_to_data(cfg, data)
    record_resolved_options(cfg, data)
    rd = None if worker else RunDir.open(run_dir, resume=resume, overwrite=overwrite)
    try:
        with _signals_raise():
            if rd is not None:
                from rankwise import __version__

                if not resume:
                    rd.write_config(cfg)
                    _record.record_data(rd.path, cfg, data, read)
                    rd.update_meta(
                        rankwise_version=__version__,
                        git_hash=git_hash(),
                        command=" ".join(sys.argv),
                        torch_version=torch.__version__,
                        started=_now(),
                        threads=cfg.trainer.num_threads or torch.get_num_threads(),
                    )
                rd.update_meta(status="running", error=None, pid=os.getpid())
            if cfg.trainer.num_threads:
                torch.set_num_threads(cfg.trainer.num_threads)
            L.seed_everything(cfg.run.seed, workers=True, verbose=False)
            run = Run(
                cfg,
                Path(run_dir),
                data,
                resume=resume,
                progress=progress,
                plots=cfg.report.plots if plots is None else plots,
                callbacks=list(callbacks),
                log_epoch=log_epoch,
            )
            t0 = time.perf_counter()
            result = recipe.fit(run)
            if not run.is_global_zero or worker:
                return {}
            seconds = round(time.perf_counter() - t0, 2)
            metrics = {**_common_metrics(recipe, cfg), **result, "train_seconds": seconds}
            write_json(run.dir / "metrics.json", metrics)
            _plot_curves(run)
            if rd is not None:
                rd.update_meta(status="completed", train_seconds=seconds, finished=_now())
            return metrics
    except BaseException as e:
        stopped = None if isinstance(e, RunTerminated) else termination_of(e)
        if rd is not None:
            err = stopped or e
            with contextlib.suppress(OSError):  # e.g. a full disk: keep the original error
                rd.update_meta(status="failed", failure=type(err).__name__, error=str(err), finished=_now())
        if stopped is not None:
            raise stopped from None
        raise
    finally:
        if rd is not None:
            rd.close()


def termination_of(e: BaseException) -> RunTerminated | None:
    """The :class:`RunTerminated` that ``e`` stands for, else ``None``: ``e`` itself, or a DataLoader's
    report that a worker was killed by SIGTERM, SIGINT or SIGHUP (``e`` or an exception it was raised
    while handling).

    A scheduler's time limit (SLURM), ``timeout`` or Ctrl-C signal the whole process group: the workers
    die of the signal, and the DataLoader's child handler may raise its ``RuntimeError`` before, or
    while unwinding, the main process's :class:`RunTerminated`; the run was terminated all the same
    (exit status ``128 + signum``, "continue it with --resume"), not broken.
    """
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, RunTerminated):
            return cur
        if isinstance(cur, RuntimeError) and "DataLoader worker" in str(cur):
            for sig in _STOP_SIGNALS:
                name = signal.strsignal(sig)
                if name and f"killed by signal: {name}" in str(cur):
                    return RunTerminated(sig)
        cur = cur.__context__
    return None


def _plot_curves(run: Run, *, only_missing: bool = False) -> None:
    """``plots/training_curves.png`` from the run's CSV log (a stage's own curves: its ``Stage.curves``).

    ``only_missing``: keep curves already drawn (an evaluation does not change the training logs)."""
    pdir = run.plots_dir
    if pdir is None:
        return
    if only_missing and (pdir / "training_curves.png").is_file():
        return
    from rankwise.recipes import reports

    name = f"{run.cfg.run.name} (seed {run.cfg.run.seed})"
    csv = _stages.stage_log(run, "")
    if csv.is_file():
        reports.plot_training_curves(csv, pdir / "training_curves.png", title=name)


def evaluate_run(
    recipe: Any,
    cfg: Config,
    run_dir: Path,
    *,
    checkpoint: str | None = None,
    plots: bool | None = None,
    data: Any = None,
    allow_changed_data: bool = False,
) -> dict[str, Any]:
    """Re-evaluate a finished run from its checkpoint (``best``, ``last`` or None: the recipe's choice; see
    :func:`rankwise.recipes.runner.check_checkpoint_name`); rewrites metrics.json (keeping the training
    time) and plots.

    The run's data are read again through the checks of its ``data.json`` (:func:`load_checked_data`):
    data that changed since training are refused, or with ``allow_changed_data`` evaluated with a
    warning, the metrics, predictions and plots then written to ``RUN_DIR/changed_data/`` (metrics.json
    and the run's own results stay as they are)."""
    quiet_lightning()
    run_dir = Path(run_dir)
    data, changed = load_checked_data(
        cfg, recipe, run_dir, action="evaluate", allow_changed=allow_changed_data, data=data
    )
    trained = _trained_data(run_dir, data) if changed else None
    rd = RunDir.lock_existing(run_dir)  # not while a training process writes the directory
    results = run_dir / _record.CHANGED_DATA_DIR if changed else None
    made = results is not None and not results.exists()
    try:
        if results is not None:
            results.mkdir(exist_ok=True)
        run = Run(
            cfg,
            run_dir,
            data,
            plots=cfg.report.plots if plots is None else plots,
            evaluating=True,
            results_dir=results,
            trained_data=trained,
        )
        if cfg.trainer.num_threads:
            torch.set_num_threads(cfg.trainer.num_threads)
        if trained is None:
            result = recipe.evaluate(run, checkpoint)
        else:
            result = _evaluate_changed(recipe, run, checkpoint)
        old = {}
        with contextlib.suppress(OSError, ValueError):
            old = json.loads((run.dir / "metrics.json").read_text())
        metrics = {**_common_metrics(recipe, cfg), **result}
        if isinstance(old, dict) and "train_seconds" in old:
            metrics["train_seconds"] = old["train_seconds"]
        if results is not None:
            metrics["changed_data"] = True
        write_json(run.results / "metrics.json", metrics)
        if results is None:
            _plot_curves(run, only_missing=True)
        return metrics
    except BaseException:
        if made and results is not None:  # this command's folder, with whatever it had written
            shutil.rmtree(results, ignore_errors=True)
        raise
    finally:
        rd.close()


def _trained_data(run_dir: Path, data: Any) -> Any:
    """What the run was trained on as its ``data.json`` summary holds it
    (:class:`~rankwise.recipes.rundir._record.RecordedData`), for an evaluation on ``data`` that changed
    since: the model is built from it (:attr:`Run.model_data`). None for a record without a summary.
    Data whose input size differs from the trained one are one :class:`DataChangedError`."""
    record = _record.read_record(run_dir)
    if record is None or not isinstance(record.get("summary"), dict):
        return None
    trained = _record.RecordedData(record["summary"])
    for name in ("input_dim", "num_features", "image_shape"):
        try:
            then = getattr(trained, name)
        except _record.RecordLacks:
            continue
        now = getattr(data, name, None)
        if now is not None and _record.jsonable(now) != _record.jsonable(then):
            raise _record.DataChangedError(
                f"the run's data changed since training: `{name}` is {now!r} now, the model was trained with "
                f"{then!r}; train a new run on the new data"
            )
    return trained


def _evaluate_changed(recipe: Any, run: Run, checkpoint: str | None) -> dict[str, Any]:
    """``recipe.evaluate`` of a run whose data changed since training (its model built from
    :attr:`Run.trained_data`): a checkpoint that does not fit that model, or a model that needs what the
    record lacks, is one :class:`DataChangedError` saying that the data changed."""
    try:
        return dict(recipe.evaluate(run, checkpoint))
    except (ModelMismatchError, _record.RecordLacks) as e:
        what = f"the run's data.json lacks {e}" if isinstance(e, _record.RecordLacks) else str(e)
        raise _record.DataChangedError(
            f"the run's data changed since training and its model cannot be rebuilt as trained ({what}); "
            "train a new run on the new data"
        ) from None


def predict_run(
    recipe: Any,
    cfg: Config,
    run_dir: Path,
    path: Path,
    *,
    checkpoint: str | None = None,
    allow_changed_data: bool = False,
) -> dict[str, Any]:
    """The predictions of a trained run for the rows of the file ``path`` (``recipe.predict_file``): its
    columns, name -> values.

    The model's inputs are built from the run's ``data.json`` (:class:`~rankwise.recipes.rundir._record.RecordedData`:
    the training statistics, feature names, label bins, LETOR feature count, ...), no training file
    read; config.yaml's data section must be the one trained (else one error line naming the key,
    unless ``allow_changed_data``). A recipe that needs more (the training images of a retrieval
    gallery, a brain-age run's validation volumes), or a run without ``data.json``, reads its data
    as :func:`evaluate_run` does, through the same checks. The run directory is locked meanwhile (its
    ``.lock`` file); nothing else in it is written. A file that does not exist is refused before the
    data are loaded (larger than its reader's limit: ``MAX_LETOR_BYTES`` for a ranking run's LETOR
    file, else ``MAX_DATA_BYTES``, :mod:`rankwise.data._files`).
    """
    from rankwise.data import DataFormatError, check_file
    from rankwise.data._files import MAX_DATA_BYTES, MAX_LETOR_BYTES

    check_file(path, max_bytes=MAX_LETOR_BYTES if recipe.learns == "ranking" else MAX_DATA_BYTES)
    quiet_lightning()
    run_dir = Path(run_dir)
    record = _record.read_record(run_dir)
    if record is not None:
        _record.check_options(record, cfg, allow_changed=allow_changed_data, action="predict")
    if record is not None and isinstance(record.get("summary"), dict) and not recipe.predict_reads_data:
        try:
            return _predict(recipe, cfg, run_dir, _record.RecordedData(record["summary"]), path, checkpoint)
        except _record.RecordLacks:  # the recipe needs the data themselves
            pass
    try:
        data, changed = load_checked_data(
            cfg, recipe, run_dir, action="predict", allow_changed=allow_changed_data, check_config=False
        )
    except DataFormatError as e:  # e.g. a training file moved since: say whose file it is
        raise type(e)(f"cannot read the run's training data (the predictions use its statistics): {e}") from None
    trained = _trained_data(run_dir, data) if changed else None
    return _predict(recipe, cfg, run_dir, data, path, checkpoint, trained)


def predict_run_blocks(
    recipe: Any,
    cfg: Config,
    run_dir: Path,
    path: Path,
    *,
    block_rows: int,
    checkpoint: str | None = None,
    allow_changed_data: bool = False,
) -> Iterator[dict[str, Any]] | None:
    """:func:`predict_run` in blocks of at most ``block_rows`` rows, the file read block by block, for a
    recipe whose ``predict_file_blocks`` reads the run's dataset so (a regression run on a ``csv`` table):
    the blocks' columns, in order, are those of :func:`predict_run`, and no file size limit applies (memory
    is bounded by a block). None where the recipe reads the file whole (then :func:`predict_run`).

    The run directory is locked until the iterator is exhausted or closed; the first block is read
    before this returns, so that the run's checks and the file's first errors come from this call.
    """
    from rankwise.data import check_file

    if not recipe.predicts_in_blocks():
        return None
    check_file(path)
    quiet_lightning()
    run_dir = Path(run_dir)
    record = _record.read_record(run_dir)
    if record is None or not isinstance(record.get("summary"), dict):
        return None
    _record.check_options(record, cfg, allow_changed=allow_changed_data, action="predict")
    rd = RunDir.lock_existing(run_dir)
    try:
        run = Run(cfg, run_dir, _record.RecordedData(record["summary"]), plots=False, evaluating=True)
        if cfg.trainer.num_threads:
            torch.set_num_threads(cfg.trainer.num_threads)
        blocks = recipe.predict_file_blocks(run, Path(path), checkpoint, block_rows)
        first = None if blocks is None else next(blocks, None)
    except _record.RecordLacks:  # the recipe needs the data themselves: predict_run reads them
        rd.close()
        return None
    except BaseException:
        rd.close()
        raise
    if blocks is None:
        rd.close()
        return None
    return _LockedBlocks(rd, first, blocks)


class _LockedBlocks:
    """The blocks of a prediction, the run directory locked until they are exhausted, fail, or the iterator
    is closed or collected (an iterator never started releases it too, unlike a generator)."""

    def __init__(self, rd: RunDir, first: Any, blocks: Iterator[dict[str, Any]]) -> None:
        self._rd: RunDir | None = rd
        self._first, self._blocks = first, blocks

    def __iter__(self) -> _LockedBlocks:
        return self

    def __next__(self) -> dict[str, Any]:
        if self._rd is None:
            raise StopIteration
        try:
            if self._first is not None:
                block, self._first = self._first, None
            else:
                block = next(self._blocks)
        except BaseException:
            self.close()
            raise
        return dict(block)

    def close(self) -> None:
        if self._rd is not None:
            rd, self._rd = self._rd, None
            close = getattr(self._blocks, "close", None)
            try:
                if close is not None:
                    close()
            finally:
                rd.close()

    def __del__(self) -> None:
        self.close()


def _predict(
    recipe: Any, cfg: Config, run_dir: Path, data: Any, path: Path, checkpoint: str | None, trained: Any = None
) -> dict[str, Any]:
    rd = RunDir.lock_existing(run_dir)  # not while a training process writes the directory
    try:
        run = Run(cfg, run_dir, data, plots=False, evaluating=True, trained_data=trained)
        if cfg.trainer.num_threads:
            torch.set_num_threads(cfg.trainer.num_threads)
        return dict(recipe.predict_file(run, Path(path), checkpoint))
    finally:
        rd.close()
