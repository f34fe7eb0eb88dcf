"""``train`` / ``evaluate`` / ``predict`` / ``compare``: the public entry points, dispatching through the
recipe registry.

Each looks up the recipe named by the config (``recipe:``; for a run directory, its saved
``config.yaml``) with :func:`~rankwise.recipes.registry.get_recipe` and runs it through the run
lifecycle of :mod:`rankwise.recipes.rundir` (see there for the run directory layout).
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rankwise._fileio import atomic_open
from rankwise.recipes import load_config, rundir
from rankwise.recipes.config import Config, ConfigError, UserError, load_raw
from rankwise.recipes.registry import Recipe, can_predict, cannot_predict, get_recipe

__all__ = [
    "CompareResult",
    "RunResult",
    "check_checkpoint_name",
    "check_predictions_path",
    "check_resumes_same_run",
    "compare",
    "default_predictions_path",
    "evaluate",
    "load_run_config",
    "named_run",
    "predict",
    "predict_blocks",
    "predictions_mae",
    "train",
    "write_prediction_blocks",
    "write_predictions",
]


@dataclass
class RunResult:
    run_dir: Path
    metrics: dict[str, Any]
    config: Config


@dataclass
class CompareResult:
    out_dir: Path
    report: Path
    results: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    run_dirs: dict[str, list[Path]] = field(default_factory=dict)
    #: the recipe whose report and tables were used
    recipe: Recipe | None = None


def load_run_config(
    run_dir: str | Path,
    overrides: Sequence[str] = (),
    *,
    trainer: Mapping[str, Any] | None = None,
    resume: bool = False,
) -> Config:
    """The typed config saved in ``RUN_DIR/config.yaml`` (``overrides``: ``--set`` strings applied on top;
    ``trainer``: ``trainer`` options set last, e.g. the hardware of a resumed run). Not a run directory:
    :class:`~rankwise.recipes.rundir.RunDirError` (``resume``: saying that ``--resume`` needs one)."""
    raw = load_raw(rundir.saved_config(run_dir, resume=resume))
    if trainer:
        section = raw.get("trainer")
        raw["trainer"] = {**(section if isinstance(section, dict) else {}), **trainer}
    return load_config(raw, list(overrides))


def check_resumes_same_run(run_dir: str | Path, recipe: str, dataset: str, named: str) -> None:
    """``--resume`` of ``run_dir`` named with a config (``named``: a preset or file) of ``recipe`` on ``dataset``:
    the run directory must hold a run of that recipe and dataset (else a :class:`ConfigError`: the resume
    would continue another run than the one named)."""
    saved = load_raw(rundir.saved_config(run_dir, resume=True))
    data = saved.get("data")
    has = (str(saved.get("recipe", _default("recipe"))), str((data if isinstance(data, dict) else {}).get("name", "")))
    if has[1] == "":
        has = (has[0], dataset)
    if has != (recipe, dataset):
        run = saved.get("run")
        name = run.get("name") if isinstance(run, dict) else None
        raise ConfigError(
            f"cannot --resume {run_dir} as {named}: it holds a run of recipe {has[0]!r} on dataset {has[1]!r}"
            f"{f' ({name})' if name else ''}, not of recipe {recipe!r} on {dataset!r}; name the config it was "
            "trained with, or choose another --out"
        )


def _default(key: str) -> Any:
    return Config.model_fields[key].default


def named_run(source: str) -> tuple[str, str]:
    """The recipe and dataset a config file or preset names (defaults where it names none)."""
    from rankwise.recipes.config import DataConfig

    raw = load_raw(source)
    data = raw.get("data")
    name = (data if isinstance(data, dict) else {}).get("name", DataConfig.model_fields["name"].default)
    return str(raw.get("recipe", _default("recipe"))), str(name)


def check_checkpoint_name(checkpoint: str | None) -> None:
    """``--checkpoint``: None (the recipe's choice), ``"best"`` or ``"last"``, else a ConfigError."""
    if checkpoint not in (None, "best", "last"):
        raise ConfigError(f"--checkpoint must be 'best' or 'last', got {checkpoint!r}")


def train(
    cfg: Config | None,
    *,
    out: str | Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    plots: bool | None = None,
    data: Any = None,
    verbose: bool = True,
    trainer_overrides: Mapping[str, Any] | None = None,
    callbacks: Sequence[Any] = (),
    log_epoch: Callable[[str], None] | None = None,
) -> RunResult:
    """Train one run of ``cfg`` with its recipe, then evaluate it; returns the run directory and metrics.

    ``out``: the run directory (default ``{run.out_dir}/{run.name}``). ``resume=True`` continues it
    from its last checkpoint with the config saved there, read once (``cfg`` may then be None when
    ``out`` names the directory; ``trainer_overrides`` -- hardware options such as ``devices``,
    ``strategy``, ``num_nodes``, ``accelerator`` -- applied on top, so a DDP run can be resumed on
    one process and vice versa; ``precision`` there must be the run's own; a new run takes them from
    ``cfg``; a ``cfg`` given with ``resume`` must be of the recipe and dataset of the run in ``out``). A
    resume refuses config edits it cannot honour (see
    :meth:`~rankwise.recipes.rundir.Run.check_last`). ``callbacks``: extra Lightning callbacks of
    every training stage. ``log_epoch``: receives one line per epoch when the progress bar is off.
    ``verbose=False`` hides the progress bar. Raises
    :class:`~rankwise.recipes.common.NonFiniteLossError` when the loss becomes NaN/inf (the last
    good checkpoint stays on disk); any error marks the run ``failed`` in meta.json.
    """
    if out is not None:
        run_dir = Path(out)
    elif cfg is not None:
        run_dir = Path(cfg.run.out_dir) / cfg.run.name
    else:
        raise TypeError("train() needs a config, or resume=True and the run directory `out`")
    if resume and overwrite:
        raise rundir.RunDirError("--resume and --overwrite contradict each other: continue the run, or replace it")
    if resume:
        if cfg is not None:
            check_resumes_same_run(run_dir, cfg.recipe, cfg.data.name, f"recipe {cfg.recipe!r}")
        cfg = load_run_config(run_dir, trainer=trainer_overrides, resume=True)
    elif cfg is None:
        raise TypeError("train() needs a config unless it resumes a run directory")
    from rankwise.recipes.own_data import apply_data_defaults

    recipe = get_recipe(cfg.recipe)
    metrics = rundir.run_recipe(
        recipe,
        cfg,
        run_dir,
        resume=resume,
        overwrite=overwrite,
        progress=progress and verbose,
        plots=plots,
        data=data,
        callbacks=callbacks,
        log_epoch=log_epoch,
        fit_to_data=apply_data_defaults,  # a preset switched to the user's own table
    )
    return RunResult(run_dir, metrics, cfg)


def evaluate(
    run_dir: str | Path,
    *,
    checkpoint: str | None = None,
    plots: bool | None = None,
    data: Any = None,
    allow_changed_data: bool = False,
) -> dict[str, Any]:
    """Re-evaluate a finished run from its checkpoint (``best``/``last``; None: the recipe's choice).

    Rewrites ``metrics.json`` (keeping the training time) and the plots; returns the metrics. Data
    that changed since training (a data file, config.yaml's data section, the split: the run's
    ``data.json``) are refused with a ``DataChangedError`` naming the file or key; with
    ``allow_changed_data`` they are evaluated with a warning and the results go to
    ``RUN_DIR/changed_data/`` instead.
    """
    check_checkpoint_name(checkpoint)
    cfg = load_run_config(run_dir)
    return rundir.evaluate_run(
        get_recipe(cfg.recipe),
        cfg,
        Path(run_dir),
        checkpoint=checkpoint,
        plots=plots,
        data=data,
        allow_changed_data=allow_changed_data,
    )


def predict(
    run_dir: str | Path,
    data: str | Path,
    *,
    checkpoint: str | None = None,
    allow_changed_data: bool = False,
    preprocess_out: str | Path | None = None,
    on_scan: Callable[[int, int, str, str, float], None] | None = None,
) -> dict[str, Any]:
    """A trained run's predictions for the rows of a new file ``data`` (name -> list of text or numpy
    array, in order); write them with :func:`write_predictions`.

    ``data`` is read with the rules of the run's loader and prepared with the training split's
    statistics as the run's ``data.json`` holds them (no training file is read where the recipe needs
    no more; config.yaml's data section must be the trained one unless ``allow_changed_data``);
    ``checkpoint``: ``best``, ``last`` or None (the recipe's choice, as :func:`evaluate`).
    The run directory is locked meanwhile and nothing in it changes. The recipe predicts through its
    ``predict_file`` hook (:meth:`~rankwise.recipes.Recipe.predict_file`), which says what
    the file holds and which columns come back:

    * ``dir``, ``rrt``, ``rnc`` (datasets of :data:`~rankwise.recipes.predict_data.PREDICTION_READERS`):
      the run's feature columns by name (any order; other columns, the target included, optional and
      kept as they are) or image paths; the file's columns, then ``prediction`` in the target's units;
    * ``brain_age``: a cohort CSV of NIfTI volumes (age optional); the CSV's columns, then the
      stage-1 prediction, the brain-age gap, the bias-corrected ages and ``prediction``;
    * ``ltr``: a LETOR / svmlight file; ``qid``, ``document``, ``relevance``, ``score``, ``rank``;
    * ``supcon``, ``retrieval`` (datasets of :data:`~rankwise.recipes.predict_data.CLASS_PREDICTION_READERS`):
      a CSV whose ``path`` column lists image files; the CSV's columns, then ``probability`` and
      ``prediction`` (the linear probe's class) or ``neighbor``, ``similarity``, ``embedding_0`` ..
      ``embedding_{D-1}`` and ``prediction`` (the nearest training image by cosine and its class).

    A ``brain_age`` run trained on scans of ``rankwise preprocess`` predicts a raw cohort CSV in one call:
    with ``preprocess_out`` (a folder) its scans are preprocessed there with the run's recorded template
    first (the recipe's ``prediction_input``; ``on_scan`` as :func:`rankwise.data.preprocess_cohort`'s),
    and the columns are those of the preprocessed CSV.

    Another recipe raises a ``ConfigError`` naming those that can.
    """
    check_checkpoint_name(checkpoint)
    cfg = load_run_config(run_dir)
    recipe = get_recipe(cfg.recipe)
    if not can_predict(recipe):  # before the run's data are loaded
        raise cannot_predict(recipe)
    data = recipe.prediction_input(Path(run_dir), Path(data), preprocess_out, on_scan=on_scan)
    return rundir.predict_run(
        recipe, cfg, Path(run_dir), Path(data), checkpoint=checkpoint, allow_changed_data=allow_changed_data
    )


#: rows of a block of :func:`predict_blocks`
PREDICT_BLOCK_ROWS = 100_000


def predict_blocks(
    run_dir: str | Path,
    data: str | Path,
    *,
    checkpoint: str | None = None,
    allow_changed_data: bool = False,
    preprocess_out: str | Path | None = None,
    on_scan: Callable[[int, int, str, str, float], None] | None = None,
    block_rows: int = PREDICT_BLOCK_ROWS,
) -> Iterator[dict[str, Any]]:
    """:func:`predict` in blocks of rows (columns of at most ``block_rows`` rows each, in the file's order;
    write them with :func:`write_prediction_blocks`): a regression run on a ``csv`` table reads and
    predicts the file block by block, in memory bounded by a block whatever the file's size; another run
    gives :func:`predict`'s columns as one block. The run directory is locked until the blocks are
    consumed."""
    check_checkpoint_name(checkpoint)
    cfg = load_run_config(run_dir)
    recipe = get_recipe(cfg.recipe)
    if not can_predict(recipe):
        raise cannot_predict(recipe)
    path = recipe.prediction_input(Path(run_dir), Path(data), preprocess_out, on_scan=on_scan)
    blocks = rundir.predict_run_blocks(
        recipe,
        cfg,
        Path(run_dir),
        Path(path),
        block_rows=block_rows,
        checkpoint=checkpoint,
        allow_changed_data=allow_changed_data,
    )
    if blocks is not None:
        return blocks
    whole = rundir.predict_run(
        recipe, cfg, Path(run_dir), Path(path), checkpoint=checkpoint, allow_changed_data=allow_changed_data
    )
    return iter([whole])


def default_predictions_path(run_dir: str | Path, data: str | Path) -> Path:
    """``RUN_DIR/predictions/<stem>.csv`` of a data file (``new.csv``, ``new.csv.gz``, ``new.zip``: ``new``)."""
    name = Path(data).name
    for suffix in (".gz", ".zip"):
        name = name.removesuffix(suffix)
    stem = Path(name).stem if Path(name).suffix.lower() in (".csv", ".tsv", ".txt") else name
    return Path(run_dir) / "predictions" / f"{stem or 'predictions'}.csv"


def _text(values: Any) -> list[str]:
    """A column as CSV text: numbers in their shortest round-trip form (float32 as float32), NaN (a value
    that needs what a row does not have, e.g. an unknown age) as an empty cell."""
    arr = np.asarray(values)
    if arr.dtype.kind == "f":
        # numpy scalars print their shortest repr of their own precision
        return ["" if v != v else str(v) for v in arr]
    return [str(v) for v in arr.tolist()]


def check_predictions_path(
    path: str | Path, *, overwrite: bool, data: str | Path | None = None, run_dir: str | Path | None = None
) -> Path:
    """``path`` as a Path if predictions may be written there: not a directory, not the input file
    ``data``, not an existing file (a symbolic link, even a dangling one, counts) unless ``overwrite``,
    and, given the run ``run_dir``, neither one of its files outside its ``predictions`` folder nor a
    file of its training data; else a ``UserError`` naming it. A name ending in a path separator
    (``out/``) names a folder too."""
    if isinstance(path, str) and path.endswith(("/", os.sep)):
        raise UserError(f"{path} names a folder; name the predictions file to write (--out FILE)")
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path} is a directory; name the predictions file to write (--out FILE)")
    real = Path(os.path.realpath(path))
    if data is not None and Path(data).exists() and real == Path(data).resolve():
        raise UserError(f"the predictions would replace the input file {data}; choose another --out")
    if run_dir is not None and Path(run_dir).is_dir():
        run = Path(run_dir).resolve()
        folder = run / "predictions"
        if real == folder:
            raise UserError(f"{path} is the run's predictions folder; name a file in it (--out FILE)")
        if real.is_relative_to(run) and not real.is_relative_to(folder):
            raise UserError(
                f"{path} is in the run directory {run_dir}, whose files the run needs; write predictions "
                f"to its predictions folder {Path(run_dir) / 'predictions'} or outside it"
            )
        if real in _run_data_files(run):
            raise UserError(f"{path} is the run's training data; choose another --out")
    if (path.exists() or path.is_symlink()) and not overwrite:
        raise UserError(f"{path} exists; pass --overwrite to replace it")
    return path


def _run_data_files(run_dir: Path) -> set[Path]:
    """The existing files named by the run's ``data.options`` (its training data); none when its config
    cannot be read (the prediction itself then says why)."""
    try:
        cfg = load_run_config(run_dir)
    except (UserError, OSError):  # reported by the prediction that follows
        return set()
    values = [v for v in cfg.data.options.values() if isinstance(v, (str, os.PathLike))]
    return {Path(v).resolve() for v in values if str(v) and Path(v).is_file()}


def write_predictions(columns: Mapping[str, Any], path: str | Path, *, overwrite: bool = False) -> Path:
    """Write ``columns`` (name -> values, all of one length; e.g. the result of :func:`predict`) as a
    CSV file ``path`` with a header; returns ``path``.

    An existing file is refused (a ``UserError`` naming it) unless ``overwrite``; the file is written
    to a temporary file beside it and moved into place (:func:`rankwise._fileio.atomic_open`), so only ``path`` changes,
    and a failed write leaves it as it was. Missing parent folders are created.
    """
    return write_prediction_blocks([columns], path, overwrite=overwrite)[0]


def write_prediction_blocks(
    blocks: Iterable[Mapping[str, Any]], path: str | Path, *, overwrite: bool = False
) -> tuple[Path, int]:
    """Write the blocks of columns of :func:`predict_blocks` (each as :func:`write_predictions` takes
    them, all with the same names) one after the other as one CSV file ``path``, one block in memory at
    a time; returns ``path`` and the number of rows. The file is that :func:`write_predictions` writes
    of the blocks' concatenated columns, with its rules (an existing file, the atomic move)."""
    try:
        return _write_blocks(blocks, path, overwrite)
    finally:  # blocks that hold a run directory's lock (predict_blocks) release it, even unread
        close = getattr(blocks, "close", None)
        if close is not None:
            close()


def _write_blocks(blocks: Iterable[Mapping[str, Any]], path: str | Path, overwrite: bool) -> tuple[Path, int]:
    path = check_predictions_path(path, overwrite=overwrite)
    target = Path(os.path.realpath(path))  # through a symbolic link: the file it names is replaced
    rows = 0
    names: list[str] | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(target, "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh, lineterminator="\n")
            for columns in blocks:
                texts = {str(k): _text(v) for k, v in columns.items()}
                lengths = {len(v) for v in texts.values()}
                if len(lengths) > 1:
                    raise ValueError(f"`columns` must have one length, got {sorted(lengths)}")
                if names is None:
                    names = list(texts)
                    writer.writerow(texts)
                elif list(texts) != names:
                    raise ValueError(f"every block must have the columns {names}, got {list(texts)}")
                writer.writerows(zip(*texts.values()))
                rows += next(iter(lengths), 0)
            if names is None:
                raise ValueError("`blocks` is empty: no columns to write")
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror or e}") from e
    return path, rows


def predictions_mae(columns: Mapping[str, Any], target: str) -> tuple[float, int] | None:
    """``(MAE, rows)`` of the predictions in ``columns`` (the last column named ``prediction`` or
    ``prediction_<k>``) against the column ``target`` on the rows whose target is a valid number (the
    loaders' rule); None when there are none."""
    import re

    from rankwise.data import DataFormatError, parse_number

    named = [k for k in columns if re.fullmatch(r"prediction(_[0-9]+)?", k)]
    if target not in columns or not named:
        return None
    pred = np.asarray(columns[named[-1]], dtype=np.float64)
    y = np.full(len(pred), np.nan)
    for i, v in enumerate(columns[target]):
        with contextlib.suppress(DataFormatError):
            y[i] = parse_number(str(v), "", 0, target)
    ok = ~np.isnan(y)
    if not ok.any():
        return None
    return float(np.mean(np.abs(pred[ok] - y[ok]))), int(ok.sum())


def _read_metrics(path: Path) -> dict[str, Any]:
    """A run's ``metrics.json``; unreadable, not JSON or not an object: a RunDirError naming the file."""
    try:
        metrics = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) else "not valid JSON" if isinstance(e, ValueError) else "not UTF-8"
        raise rundir.RunDirError(
            f"cannot read {path} ({why}); re-evaluate the run with `rankwise evaluate {path.parent}`"
        ) from None
    if not isinstance(metrics, dict) or not isinstance(metrics.get("test"), dict):
        raise rundir.RunDirError(
            f"{path} holds no test metrics; re-evaluate the run with `rankwise evaluate {path.parent}`"
        )
    return metrics


#: options that change where and how fast a run trains, not what it computes
_HARDWARE = (
    "trainer.num_threads",
    "trainer.memory_check",
    "trainer.devices",
    "trainer.accelerator",
    "trainer.strategy",
    "data.num_workers",
)
_PRESENTATION = ("report.plots", "report.tsne", "report.plot_samples", "run.out_dir", "description", "expected_time")


def _check_reused(run_dir: Path, cfg: Config) -> None:
    """A finished run of a comparison is reused only when it was trained with this config (up to the
    hardware and the plots): else one ConfigError naming the run and the first keys that differ."""
    from rankwise.recipes.config import config_changes, config_to_dict

    trained = cfg.model_copy(deep=True)
    rundir.absolute_data_paths(trained)  # as training writes them into config.yaml
    changes = config_changes(config_to_dict(load_run_config(run_dir)), config_to_dict(trained), shared_only=False)
    skip = (*_HARDWARE, *_PRESENTATION)
    differ = sorted(k for k in changes if not k.startswith(skip))
    if differ:
        shown = "; ".join(f"`{k}` {changes[k][0]!r} there, {changes[k][1]!r} now" for k in differ[:3])
        more = f" (and {len(differ) - 3} more)" if len(differ) > 3 else ""
        raise ConfigError(
            f"{run_dir} is a finished run of this comparison trained with another config: {shown}{more}; "
            "use another --out, or --overwrite to train it again"
        )


def _is_run_dir(p: str) -> bool:
    return Path(p).is_dir() and (Path(p) / "config.yaml").is_file()


def compare(
    sources: Sequence[str],
    *,
    seeds: Sequence[int] = (0,),
    out: str | Path = "runs/compare",
    overrides: Sequence[str] = (),
    progress: bool = False,
    overwrite: bool = False,
    title: str = "rankwise comparison",
    extra: str = "",
    plot_first_seed_only: bool = False,
    on_run: Callable[[str, int, RunResult], None] | None = None,
    jobs: int | None = 1,
) -> CompareResult:
    """Several methods x seeds: train every config/preset for each seed (finished run directories are
    reused as they are), then write ``OUT/report.md`` with the mean ± std table of their recipe.

    Every source must use recipes with the same ``report_kind`` (e.g. ``sort`` and ``median`` runs
    are not compared with ``dir`` runs). ``jobs``: how many runs train at once, each in a process
    forked from this one after the data are read (None: as many as the CPU cores this process may
    use hold the runs' ``trainer.num_threads``, see :func:`parallel_jobs`); every run is seeded on its
    own, so the results are those of one run after the other. ``on_run`` is called in the order of
    the sources and seeds either way.
    """
    from rankwise.recipes.config import dataset_switch
    from rankwise.recipes.own_data import apply_data_defaults

    out = Path(out)
    results: dict[str, list[dict[str, Any]]] = {}
    run_dirs: dict[str, list[Path]] = {}
    recipes: dict[str, Recipe] = {}
    planned: list[tuple[str, str]] = []
    for src in sources:  # validate every source before any training
        if _is_run_dir(src):
            cfg = load_run_config(src)
            planned.append(("run", src))
        else:
            cfg = load_config(src, list(overrides))
            planned.append(("config", src))
        recipes[src] = get_recipe(cfg.recipe)
    kinds = {r.report_kind for r in recipes.values()}
    if len(kinds) > 1:
        names = ", ".join(f"{s} ({r.name})" for s, r in recipes.items())
        raise ConfigError(f"cannot compare recipes with different metrics in one table: {names}")
    out.mkdir(parents=True, exist_ok=True)
    data_cache: dict[str, Any] = {}
    #: in order: a finished result (reused run directory) or the arguments of a run to train
    todo: list[tuple[str, int, RunResult | None, dict[str, Any] | None]] = []
    for kind, src in planned:
        if kind == "run":
            metrics_file = Path(src) / "metrics.json"
            metrics = _read_metrics(metrics_file) if metrics_file.is_file() else evaluate(src)
            name = Path(src).name
            results.setdefault(name, []).append(metrics)
            run_dirs.setdefault(name, []).append(Path(src))
            continue
        method = Path(src).stem if Path(src).is_file() else str(src)
        for i, seed in enumerate(seeds):
            cfg = load_config(src, [*overrides, f"run.seed={seed}", f"run.name={method}-seed{seed}"])
            key = json.dumps([cfg.data.name, cfg.data.options], sort_keys=True, default=str)
            if dataset_switch(cfg) is not None:  # a preset switched to another dataset: fitted to its data
                rundir.absolute_data_paths(cfg)
                if apply_data_defaults(cfg) is None and dataset_switch(cfg) is not None:
                    if key not in data_cache:
                        data_cache[key] = rundir.load_data(cfg, recipes[src])
                    apply_data_defaults(cfg, data_cache[key])
            run_dir = out / "runs" / method / f"seed{seed}"
            meta = rundir.read_meta(run_dir)
            if (run_dir / "metrics.json").is_file() and meta and meta.get("status") == "completed" and not overwrite:
                _check_reused(run_dir, cfg)
                todo.append((method, seed, RunResult(run_dir, _read_metrics(run_dir / "metrics.json"), cfg), None))
                continue
            if key not in data_cache:
                data_cache[key] = rundir.load_data(cfg, recipes[src])
            kwargs = {
                "cfg": cfg,
                "out": run_dir,
                "overwrite": True,
                "progress": progress,
                "data": key,
                "verbose": False,
                "plots": False if plot_first_seed_only and i > 0 else None,
            }
            todo.append((method, seed, None, kwargs))
    trained = [kw for *_, kw in todo if kw is not None]
    n_jobs = parallel_jobs([kw["cfg"] for kw in trained]) if jobs is None else max(1, int(jobs))
    for method, seed, res in _train_all(todo, data_cache, min(n_jobs, len(trained))):
        results.setdefault(method, []).append(res.metrics)
        run_dirs.setdefault(method, []).append(res.run_dir)
        if on_run is not None:
            on_run(method, seed, res)
    recipe = next(iter(recipes.values()))
    if overrides:
        ran = "Every config trained with " + " ".join(f"`--set {o}`" for o in overrides) + "."
        extra = f"{ran}\n\n{extra}" if extra else ran
    report = recipe.write_report(out, results, run_dirs, title=title, extra=extra)
    rundir.write_json(
        out / "results.json",
        {
            "results": results,
            "run_dirs": {k: [str(p) for p in v] for k, v in run_dirs.items()},
            "overrides": list(overrides),
        },
    )
    return CompareResult(out, report, results, run_dirs, recipe)


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity where the platform tells it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - platforms without affinity
        return max(1, os.cpu_count() or 1)


def _on_cpu(cfg: Config) -> bool:
    """Whether a run trains on the CPU: ``trainer.accelerator`` cpu, or auto on a machine without a GPU."""
    acc = str(cfg.trainer.accelerator)
    if acc == "cpu":
        return True
    if acc != "auto":
        return False
    import torch

    mps = getattr(torch.backends, "mps", None)
    return not torch.cuda.is_available() and not (mps is not None and mps.is_available())


def parallel_jobs(cfgs: Sequence[Config]) -> int:
    """How many runs of ``cfgs`` train at once by default: the usable CPU cores divided by the most
    threads one of them asks for (``trainer.num_threads``); 1 where a run sets no thread count (it
    takes every core), trains on a GPU (``trainer.accelerator`` not cpu, or auto where one is), loads its
    data with workers, or where processes cannot be forked (not Linux)."""
    import multiprocessing as mp
    import sys

    if not cfgs or not sys.platform.startswith("linux") or "fork" not in mp.get_all_start_methods():
        return 1
    threads = [c.trainer.num_threads for c in cfgs]
    if any(not t for t in threads) or not all(_on_cpu(c) for c in cfgs):
        return 1
    if any(c.data.num_workers for c in cfgs):
        return 1
    return max(1, usable_cores() // max(int(t or 1) for t in threads))


def _ready_to_fork() -> bool:
    """Whether this process may fork training workers: the background loads of the numba kernels are
    waited for (a fork inside an import would hold its lock forever); another thread running: no."""
    import threading

    for t in threading.enumerate():
        if t is not threading.current_thread() and t.name.startswith("rankwise-numba") and t.is_alive():
            t.join()
    return all(t is threading.current_thread() or not t.is_alive() for t in threading.enumerate())


#: the data of the runs a forked worker trains (set before the workers are forked; read in them)
_FORK_DATA: dict[str, Any] = {}


def _train_forked(kwargs: dict[str, Any]) -> tuple[dict[str, Any], Config]:
    """One run of a comparison in a forked worker: its metrics and its config (as training leaves it)."""
    kwargs = {**kwargs, "data": _FORK_DATA[kwargs["data"]]}
    res = train(**kwargs)
    return res.metrics, res.config


def _train_all(
    todo: Sequence[tuple[str, int, RunResult | None, dict[str, Any] | None]], data: dict[str, Any], jobs: int
) -> Any:
    """``(method, seed, RunResult)`` of every entry of ``todo`` in its order: reused ones as they are, the
    others trained here one after the other (``jobs`` <= 1) or by ``jobs`` forked processes at once. The
    first failure (in order) is raised once the runs already started have ended; no new run starts."""
    if jobs > 1 and not _ready_to_fork():
        jobs = 1
    if jobs <= 1:
        for method, seed, res, kw in todo:
            if kw is not None:
                res = train(**{**kw, "data": data[kw["data"]]})
            assert res is not None
            yield method, seed, res
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    _FORK_DATA.clear()
    _FORK_DATA.update(data)
    try:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("fork")) as pool:
            futures = [None if kw is None else pool.submit(_train_forked, kw) for *_, kw in todo]
            try:
                for (method, seed, res, kw), fut in zip(todo, futures):
                    if fut is not None and kw is not None:
                        metrics, cfg = fut.result()
                        res = RunResult(Path(kw["out"]), metrics, cfg)
                    assert res is not None
                    yield method, seed, res
            except BaseException:
                for f in futures:
                    if f is not None:
                        f.cancel()
                raise
    finally:
        _FORK_DATA.clear()
