"""``train`` / ``evaluate`` / ``compare``: the public entry points, dispatching through the recipe registry.

Each looks up the recipe named by the config (``recipe:``; for a run directory, its saved
``config.yaml``) with :func:`~rankwise.recipes.registry.get_recipe` and runs it through the run
lifecycle of :mod:`rankwise.recipes.rundir` (see there for the run directory layout).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankwise.recipes import rundir
from rankwise.recipes.config import Config, ConfigError, load_config, load_raw, upgrade_saved
from rankwise.recipes.registry import Recipe, get_recipe

__all__ = ["CompareResult", "RunResult", "check_checkpoint_name", "compare", "evaluate", "load_run_config", "train"]


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
    raw = upgrade_saved(load_raw(rundir.saved_config(run_dir, resume=resume)))
    if trainer:
        section = raw.get("trainer")
        raw["trainer"] = {**(section if isinstance(section, dict) else {}), **trainer}
    return load_config(raw, list(overrides))


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
    one process and vice versa; a new run takes them from ``cfg``). ``callbacks``: extra Lightning callbacks of
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
        cfg = load_run_config(run_dir, trainer=trainer_overrides, resume=True)
    elif cfg is None:
        raise TypeError("train() needs a config unless it resumes a run directory")
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
    )
    return RunResult(run_dir, metrics, cfg)


def evaluate(
    run_dir: str | Path,
    *,
    checkpoint: str | None = None,
    plots: bool | None = None,
    data: Any = None,
) -> dict[str, Any]:
    """Re-evaluate a finished run from its checkpoint (``best``/``last``; None: the recipe's choice).

    Rewrites ``metrics.json`` (keeping the training time) and the plots; returns the metrics.
    """
    check_checkpoint_name(checkpoint)
    cfg = load_run_config(run_dir)
    return rundir.evaluate_run(
        get_recipe(cfg.recipe), cfg, Path(run_dir), checkpoint=checkpoint, plots=plots, data=data
    )


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
) -> CompareResult:
    """Several methods x seeds: train every config/preset for each seed (finished run directories are
    reused as they are), then write ``OUT/report.md`` with the mean ± std table of their recipe.

    Every source must use recipes with the same ``report_kind`` (e.g. ``sort`` and ``median`` runs
    are not compared with ``dir`` runs).
    """
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
            run_dir = out / "runs" / method / f"seed{seed}"
            meta = rundir.read_meta(run_dir)
            if (run_dir / "metrics.json").is_file() and meta and meta.get("status") == "completed" and not overwrite:
                res = RunResult(run_dir, _read_metrics(run_dir / "metrics.json"), cfg)
            else:
                key = json.dumps([cfg.data.name, cfg.data.options], sort_keys=True, default=str)
                if key not in data_cache:
                    data_cache[key] = rundir.load_data(cfg, recipes[src])
                res = train(
                    cfg,
                    out=run_dir,
                    overwrite=True,
                    progress=progress,
                    data=data_cache[key],
                    verbose=False,
                    plots=False if plot_first_seed_only and i > 0 else None,
                )
            results.setdefault(method, []).append(res.metrics)
            run_dirs.setdefault(method, []).append(res.run_dir)
            if on_run is not None:
                on_run(method, seed, res)
    recipe = next(iter(recipes.values()))
    report = recipe.write_report(out, results, run_dirs, title=title, extra=extra)
    rundir.write_json(
        out / "results.json", {"results": results, "run_dirs": {k: [str(p) for p in v] for k, v in run_dirs.items()}}
    )
    return CompareResult(out, report, results, run_dirs, recipe)
