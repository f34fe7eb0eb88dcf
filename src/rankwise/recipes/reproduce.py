"""Shared plumbing of the paper-reproduction recipes (``run.recipe``: supcon, sort, median, dknn).

Each recipe is a set of LightningModules trained by Lightning's Trainer (devices, DDP, precision,
progress bar, CSV/TensorBoard logs, end-of-epoch checkpoints, ``--resume``), see
:mod:`rankwise.recipes.supcon` and :mod:`rankwise.recipes.sorting`. A run directory holds
``config.yaml``, ``meta.json``, ``logs/`` + ``tb/``, ``checkpoints/last.ckpt`` and ``metrics.json``
(``{"recipe", "method", "test": {metric: value}, ...}``). ``rankwise train`` /
``rankwise compare`` dispatch here through :func:`train`; :func:`write_compare_report` writes the
mean ± std table of ``compare``. The recipe options live in the config's ``task:`` mapping and are
validated by :func:`check_task` against the dataclass of the recipe (:class:`SupConTask`,
:class:`SortTask`, :class:`DKNNTask`).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from rankwise.recipes.config import Config, ConfigError, _build, config_from_dict

__all__ = [
    "RECIPES",
    "DKNNTask",
    "SortTask",
    "SupConTask",
    "check_task",
    "format_summary",
    "is_repro_metrics",
    "markdown_table",
    "task_options",
    "train",
    "write_compare_report",
]

RECIPES = ("supcon", "sort", "median", "dknn")


@dataclass
class SupConTask:
    """Two-stage contrastive recipe (Khosla et al. 2020) and its baselines; ``trainer.max_epochs`` = stage-1 epochs."""

    #: supcon (labels), simclr (labels=None, NT-Xent) or ce (cross-entropy on one augmented view)
    method: Literal["supcon", "simclr", "ce"] = "supcon"
    temperature: float = 0.1
    #: L_out (sum over positives outside the log, recommended) or L_in
    variant: Literal["out", "in"] = "out"
    #: stage-1 optimizer: SGD, LARS (``timm.optim.Lars``) or Adam; lr/momentum/weight decay from ``optimizer``
    optimizer: Literal["sgd", "lars", "adam"] = "sgd"
    #: digits: RandomResizedCrop + RandomAffine; digits_elastic: + ElasticTransform; or torchvision's policies
    augment: Literal["digits", "digits_elastic", "autoaugment", "randaugment", "none"] = "digits"
    projection_dim: int = 64
    #: use only this many training images (seeded subset) for both stages; None = all
    train_subset: int | None = None
    probe_epochs: int = 30
    probe_lr: float = 0.01


@dataclass
class SortTask:
    """NeuralSort's large-MNIST tasks (Grover et al. 2019): sort lists of 4-digit numbers / regress their median."""

    n: int = 5
    #: neuralsort (deterministic), stochastic (Plackett-Luce + Gumbel), softsort, vanilla (predict ranks directly)
    method: Literal["neuralsort", "stochastic", "softsort", "vanilla"] = "neuralsort"
    tau: float = 1.0
    #: relaxed samples per list for ``stochastic``
    n_samples: int = 5
    #: SoftSort's distance power
    power: float = 1.0
    #: straight-through training: the forward pass uses the exact permutation (row-wise argmax of the
    #: relaxation), gradients are those of the relaxation (NeuralSort paper, sec. 3; not for ``vanilla``)
    hard: bool = False
    #: before testing, re-estimate the BatchNorm running statistics with the final weights over this many
    #: batches of training lists (``torch.optim.swa_utils.update_bn``); 0 keeps the training-time running averages
    bn_recalibration: int = 50
    #: training batches, in epochs of at most ``steps_per_epoch`` (a checkpoint after each; see recipes.sorting)
    steps: int = 300
    steps_per_epoch: int = 100
    lists_per_batch: int = 16
    test_lists: int = 1000
    digits: int = 4
    #: average-pool the 28 x 112 images by this factor before the CNN (1 = full resolution)
    downsample: int = 2


@dataclass
class DKNNTask:
    """Differentiable kNN (NeuralSort sec. 5.3) vs plain kNN on raw pixels."""

    #: dknn: train a CNN embedding with the dkNN loss, classify by hard kNN in that space; knn_pixels: sklearn kNN
    method: Literal["dknn", "knn_pixels"] = "dknn"
    k: int = 9
    tau: float = 0.1
    #: relaxation: deterministic NeuralSort or stochastic (Gumbel) samples
    relaxation: Literal["deterministic", "stochastic"] = "deterministic"
    n_samples: int = 5
    #: training episodes, in epochs of at most ``steps_per_epoch`` (a checkpoint after each)
    steps: int = 300
    steps_per_epoch: int = 100
    queries: int = 100
    neighbors: int = 100
    embedding_dim: int = 64


#: task options for which 0 (or None) is valid
_MAY_BE_ZERO = ("train_subset", "bn_recalibration")
_TASKS: dict[str, Any] = {"supcon": SupConTask, "sort": SortTask, "median": SortTask, "dknn": DKNNTask}


def task_options(cfg: Config) -> Any:
    """The typed task options of ``cfg`` (``cfg.task`` validated against the recipe's dataclass)."""
    return _build(_TASKS[cfg.run.recipe], dict(cfg.task), "task")


def check_task(cfg: Config) -> None:
    """Validate ``cfg.task`` for the reproduction recipe ``cfg.run.recipe`` (``ConfigError`` naming the key)."""
    if cfg.run.recipe not in RECIPES:
        if cfg.task:
            raise ConfigError(f"`task` options are only used by the recipes {list(RECIPES)}, not {cfg.run.recipe!r}")
        return
    t = task_options(cfg)
    for f in dataclasses.fields(t):
        v = getattr(t, f.name)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v <= 0 and f.name not in _MAY_BE_ZERO:
            raise ConfigError(f"`task.{f.name}` must be > 0, got {v!r}")
    if isinstance(t, SortTask):
        if t.bn_recalibration < 0:
            raise ConfigError(f"`task.bn_recalibration` must be >= 0 (batches; 0 = off), got {t.bn_recalibration!r}")
        if t.n < 2:
            raise ConfigError(f"`task.n` must be >= 2, got {t.n}")
        if cfg.run.recipe == "median" and t.method not in ("neuralsort", "stochastic"):
            raise ConfigError(
                f"`task.method` must be 'neuralsort' or 'stochastic' for the median task, got {t.method!r}"
            )
        if t.hard and t.method == "vanilla":
            raise ConfigError("`task.hard` (straight-through relaxation) does not apply to `task.method` 'vanilla'")
    if isinstance(t, SupConTask) and t.train_subset is not None and t.train_subset < 2:
        raise ConfigError(f"`task.train_subset` must be >= 2 or null, got {t.train_subset}")


# ------------------------------------------------------------------------------------------ run plumbing


def device_of(cfg: Config) -> torch.device:
    """``trainer.accelerator``: auto (CUDA when available), cpu, gpu/cuda, mps."""
    acc = str(cfg.trainer.accelerator)
    if acc in ("gpu", "cuda") or (acc == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    if acc == "mps":
        return torch.device("mps")
    return torch.device("cpu")


def method_name(cfg: Config) -> str:
    t = task_options(cfg)
    return str(t.method)


def train(
    cfg: Config,
    *,
    out: str | Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    data: Any = None,
    verbose: bool = True,
    trainer_overrides: Mapping[str, Any] | None = None,
    **_: Any,
) -> Any:
    """Run the reproduction recipe ``cfg.run.recipe`` with Lightning and return a ``RunResult``.

    ``resume=True`` continues ``RUN_DIR`` from ``checkpoints/last.ckpt`` with the config saved
    there (``trainer_overrides`` -- ``devices``, ``strategy``, ... -- applied on top). On rank > 0
    of a distributed run the result has empty metrics (rank 0 evaluates and writes them).
    """
    import lightning as L

    from rankwise import __version__
    from rankwise.recipes import runner

    if not verbose:
        runner._quiet_lightning()
    run_dir = runner.resolve_run_dir(cfg, out, resume=resume, overwrite=overwrite)
    if resume:
        import yaml

        cfg = config_from_dict(yaml.safe_load((run_dir / "config.yaml").read_text()))
        if trainer_overrides:
            cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, **trainer_overrides))
    run_dir.mkdir(parents=True, exist_ok=True)
    worker = runner._is_launched_worker()
    if not resume and not worker:
        runner._save_config(cfg, run_dir)
        runner._update_meta(
            run_dir,
            rankwise_version=__version__,
            git_hash=runner.git_hash(),
            command=" ".join(sys.argv),
            torch_version=torch.__version__,
            started=time.strftime("%Y-%m-%dT%H:%M:%S"),
            threads=torch.get_num_threads(),
        )
    if not worker:
        runner._update_meta(run_dir, status="running")
    if cfg.trainer.num_threads:
        torch.set_num_threads(cfg.trainer.num_threads)
    L.seed_everything(cfg.run.seed, workers=True, verbose=False)
    t0 = time.perf_counter()
    try:
        if cfg.run.recipe == "supcon":
            from rankwise.recipes import supcon

            test = supcon.fit(cfg, run_dir, data=data, resume=resume, progress=progress and verbose)
        else:
            from rankwise.recipes import sorting

            test = sorting.fit(cfg, run_dir, data=data, resume=resume, progress=progress and verbose)
    except BaseException as e:
        if not worker:
            from rankwise.recipes.modules import NonFiniteLossError

            status = "non-finite loss" if isinstance(e, NonFiniteLossError) else type(e).__name__
            runner._update_meta(run_dir, status=f"failed: {status}", error=str(e))
        raise
    if test is None:  # rank > 0 of a distributed run
        return runner.RunResult(run_dir, {}, cfg)
    seconds = time.perf_counter() - t0
    metrics = {
        "recipe": cfg.run.recipe,
        "method": method_name(cfg),
        "test": test,
        "train_seconds": round(seconds, 2),
        "dataset": cfg.data.name,
        "run": cfg.run.name,
        "seed": cfg.run.seed,
        "device": str(device_of(cfg)),
    }
    runner._write_json(run_dir / "metrics.json", metrics)
    runner._update_meta(
        run_dir, status="completed", train_seconds=round(seconds, 2), finished=time.strftime("%Y-%m-%dT%H:%M:%S")
    )
    return runner.RunResult(run_dir, metrics, cfg)


# ------------------------------------------------------------------------------------------ reports


def is_repro_metrics(metrics: Mapping[str, Any]) -> bool:
    return metrics.get("recipe") in RECIPES


def _stat(vals: Sequence[float]) -> tuple[float, float, int]:
    a = np.asarray([v for v in vals if v is not None and np.isfinite(v)], dtype=np.float64)
    return (float(a.mean()), float(a.std()), int(a.size)) if a.size else (float("nan"), float("nan"), 0)


def _cell(stat: tuple[float, float, int], digits: int = 3) -> str:
    m, s, n = stat
    if n == 0:
        return "–"
    return f"{m:.{digits}f} ± {s:.{digits}f}" if n > 1 else f"{m:.{digits}f}"


def table_rows(results: Mapping[str, Sequence[Mapping[str, Any]]]) -> tuple[list[str], list[list[str]]]:
    """``method | seeds | <every test metric> mean ± std (ddof=0) | wall s``."""
    keys: list[str] = []
    for runs in results.values():
        for r in runs:
            keys += [k for k in r.get("test", {}) if k not in keys]
    header = ["method", "seeds", *keys, "train s"]
    rows = []
    for method, runs in results.items():
        cells = [_cell(_stat([float(r["test"].get(k, np.nan)) for r in runs])) for k in keys]
        wall = _cell(_stat([float(r.get("train_seconds", np.nan)) for r in runs]), 1)
        rows.append([method, str(len(runs)), *cells, wall])
    return header, rows


def markdown_table(results: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    header, rows = table_rows(results)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def format_summary(metrics: Mapping[str, Any]) -> str:
    """One line ``key value, ...`` of a run's test metrics."""
    return ", ".join(f"{k} {v:.4f}" for k, v in metrics.get("test", {}).items())


def write_compare_report(
    out_dir: str | Path,
    results: Mapping[str, Sequence[Mapping[str, Any]]],
    run_dirs: Mapping[str, Sequence[str | Path]],
    *,
    title: str = "rankwise comparison",
    extra: str = "",
    **_: Any,
) -> Path:
    """``OUT/report.md``: the mean ± std table of every test metric, and links to the runs."""
    from rankwise.recipes.reports import _rel

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# {title}", ""]
    if extra:
        lines += [extra, ""]
    lines += ["Test metrics, mean ± std (ddof=0) over seeds; `train s` = wall time of one run.", ""]
    lines += [markdown_table(results), "", "## Runs", ""]
    for method, dirs in run_dirs.items():
        lines += [f"### {method}", ""] + [f"- [{_rel(Path(d), out)}]({_rel(Path(d), out)})" for d in dirs] + [""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
