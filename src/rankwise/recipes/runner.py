"""Run a recipe with Lightning and write its run directory; evaluate, compare, demo.

Run directory layout::

    RUN_DIR/config.yaml          resolved config (after presets, ``extends`` and ``--set``)
    RUN_DIR/meta.json            package version, git hash, command, status, timings
    RUN_DIR/checkpoints/         best.ckpt (lowest val MAE) and last.ckpt, written atomically
    RUN_DIR/pretrain/            Rank-N-Contrast stage-1 checkpoints (``run.recipe: rnc``)
    RUN_DIR/logs/metrics.csv     CSV log;  RUN_DIR/tb/  TensorBoard events
    RUN_DIR/metrics.json         test (and val) shot table + Pearson/Spearman of the best checkpoint
    RUN_DIR/predictions.npz      test predictions/labels, training labels, a feature sample
    RUN_DIR/plots/*.png          label histogram, per-label MAE, similarity heatmap, t-SNE

Everything loop-, device-, precision-, checkpoint- and logging-related is Lightning's Trainer; the
only plug-in is :class:`AtomicCheckpointIO` (write to a temporary file, fsync, ``os.replace``;
load with ``weights_only=True``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rankwise.recipes import _deps
from rankwise.recipes.config import Config, ConfigError, config_from_dict, config_to_dict, load_config

__all__ = [
    "ENV_KILL_AT_STEP",
    "AtomicCheckpointIO",
    "CompareResult",
    "RunResult",
    "compare",
    "evaluate",
    "git_hash",
    "load_state_dict",
    "train",
]

#: fault injection for the reliability tests: SIGKILL this process at this global step
ENV_KILL_AT_STEP = "RANKWISE_FAULT_KILL_AT_STEP"

log = logging.getLogger("rankwise")


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


# ------------------------------------------------------------------------------------------ plumbing


def _atomic_checkpoint_io() -> Any:
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    class _AtomicCheckpointIO(TorchCheckpointIO):
        """Checkpoint I/O that never leaves a truncated file: temp file + fsync + ``os.replace``.

        Loading always uses ``torch.load(weights_only=True)``.
        """

        def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
            if storage_options is not None:
                raise TypeError("`storage_options` is not supported by AtomicCheckpointIO")
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
            try:
                with open(tmp, "wb") as fh:
                    torch.save(checkpoint, fh)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise

        def load_checkpoint(
            self, path: Any, map_location: Any = None, weights_only: bool | None = None
        ) -> dict[str, Any]:
            return torch.load(path, map_location=map_location or "cpu", weights_only=True)

    return _AtomicCheckpointIO()


def AtomicCheckpointIO() -> Any:
    """A Lightning ``CheckpointIO`` plug-in writing checkpoints atomically (see module doc)."""
    return _atomic_checkpoint_io()


def load_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The model ``state_dict`` of a Lightning checkpoint, loaded with ``weights_only=True``."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    return ckpt["state_dict"] if isinstance(ckpt, dict) and "state_dict" in ckpt else ckpt


def git_hash() -> str | None:
    """Commit hash of the rankwise source checkout (``None`` outside a git work tree)."""
    try:
        root = Path(__file__).resolve().parents[3]
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False
        )
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def _kill_callback(step: int) -> Any:
    import lightning as L

    class _KillAtStep(L.Callback):
        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if trainer.global_step >= step:
                sys.stdout.flush()
                sys.stderr.flush()
                os.kill(os.getpid(), signal.SIGKILL)

    return _KillAtStep()


def _quiet_lightning() -> None:
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import warnings

    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*Experiment logs directory.*")
    warnings.filterwarnings("ignore", message=".*Checkpoint directory.*exists and is not empty.*")
    warnings.filterwarnings("ignore", message=".*number of training batches.*")
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    warnings.filterwarnings("ignore", message=".*isinstance.*treespec.*")


def _loaders(data: Any, cfg: Config) -> tuple[Any, Any, Any]:
    from torch.utils.data import DataLoader

    from rankwise.recipes.modules import EpochShuffleSampler

    collate = data.meta.get("collate_fn")
    n = len(data.train)
    bs = cfg.data.batch_size
    kw: dict[str, Any] = {
        "num_workers": cfg.data.num_workers,
        "collate_fn": collate,
        "persistent_workers": cfg.data.num_workers > 0,
    }
    train_dl = DataLoader(
        data.train, batch_size=bs, sampler=EpochShuffleSampler(n, cfg.run.seed), drop_last=n > bs, **kw
    )
    val_dl = DataLoader(data.val, batch_size=cfg.data.eval_batch_size, shuffle=False, **kw)
    test_dl = DataLoader(data.test, batch_size=cfg.data.eval_batch_size, shuffle=False, **kw)
    return train_dl, val_dl, test_dl


def _trainer(
    cfg: Config,
    run_dir: Path,
    ckpt_dir: Path,
    *,
    max_epochs: int,
    monitor: str | None,
    progress: bool,
    loggers: bool = True,
    log_name: str = "",
    max_steps: int = -1,
) -> Any:
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    t = cfg.trainer
    callbacks: list[Any] = [
        # with a monitor: best.ckpt + last.ckpt; without: last.ckpt only (written as the "top-1" file,
        # since Lightning >= 2.6 writes save_last only when a top-k checkpoint was saved too)
        ModelCheckpoint(
            dirpath=ckpt_dir,
            filename="best" if monitor else "last",
            monitor=monitor,
            mode="min",
            save_last=bool(monitor),
            save_top_k=1,
            auto_insert_metric_name=False,
            enable_version_counter=False,
        )
    ]
    if progress and t.enable_progress_bar:
        from lightning.pytorch.callbacks import RichProgressBar

        callbacks.append(RichProgressBar(leave=False))
    kill = os.environ.get(ENV_KILL_AT_STEP)
    if kill:
        callbacks.append(_kill_callback(int(kill)))
    logger: Any = False
    if loggers:
        from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

        logger = [
            CSVLogger(run_dir, name="logs", version=log_name),
            TensorBoardLogger(run_dir, name="tb", version=log_name),
        ]
    kwargs: dict[str, Any] = {
        "default_root_dir": str(run_dir),
        "max_epochs": max_epochs,
        "max_steps": max_steps,
        "accelerator": t.accelerator,
        "devices": t.devices,
        "strategy": t.strategy,
        "num_nodes": t.num_nodes,
        "precision": t.precision,
        "deterministic": t.deterministic,
        "gradient_clip_val": t.gradient_clip_val,
        "log_every_n_steps": t.log_every_n_steps,
        "logger": logger,
        "callbacks": callbacks,
        "enable_progress_bar": progress and t.enable_progress_bar,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
        "plugins": [AtomicCheckpointIO()],
    }
    if t.limit_train_batches is not None:
        kwargs["limit_train_batches"] = t.limit_train_batches
    if t.limit_val_batches is not None:
        kwargs["limit_val_batches"] = t.limit_val_batches
    return L.Trainer(**kwargs)


def eval_trainer(cfg: Config) -> Any:
    """A quiet single-device Lightning Trainer (``predict`` / ``test`` on rank 0 after a possibly distributed fit)."""
    import lightning as L

    return L.Trainer(
        accelerator=cfg.trainer.accelerator,
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        precision=cfg.trainer.precision,  # type: ignore[arg-type]
    )


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=_json_default))
    os.replace(tmp, path)


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.generic,)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    return str(o)


def _save_config(cfg: Config, run_dir: Path) -> None:
    import yaml

    (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


def _update_meta(run_dir: Path, **fields: Any) -> None:
    p = run_dir / "meta.json"
    meta = json.loads(p.read_text()) if p.is_file() else {}
    meta.update(fields)
    _write_json(p, meta)


def _is_launched_worker() -> bool:
    """True in the extra processes Lightning's DDP launcher starts (they re-run the same command)."""
    # RANK / GROUP_RANK: torchrun (other nodes' local rank 0 too); SLURM_PROCID: srun tasks
    names = ("LOCAL_RANK", "NODE_RANK", "RANK", "GROUP_RANK", "SLURM_PROCID")
    return any(int(os.environ.get(v, "0") or 0) != 0 for v in names)


def resolve_run_dir(cfg: Config, out: str | Path | None, *, resume: bool, overwrite: bool) -> Path:
    """``out`` or ``{run.out_dir}/{run.name}``; refuses to reuse a finished/started run unless asked."""
    run_dir = Path(out) if out is not None else Path(cfg.run.out_dir) / cfg.run.name
    if _is_launched_worker():
        return run_dir  # rank > 0 of a multi-process launch: rank 0 owns the directory
    if resume:
        if not (run_dir / "config.yaml").is_file():
            raise ConfigError(f"cannot --resume: {run_dir} is not a run directory (no config.yaml)")
        return run_dir
    if run_dir.exists() and any(run_dir.iterdir()):
        if not overwrite:
            raise ConfigError(
                f"run directory {run_dir} already exists; pass --resume to continue it, --overwrite to replace "
                "it, or --out/--set run.name=... for a new one"
            )
        shutil.rmtree(run_dir)
    return run_dir


# ------------------------------------------------------------------------------------------ train


def build_module(cfg: Config, data: Any, *, freeze_backbone: bool = False) -> Any:
    from rankwise.recipes.modules import DIRRegressor

    return DIRRegressor(
        config_to_dict(cfg),
        input_dim=data.input_dim,
        bin_width=data.bin_width,
        train_labels=data.train_labels,
        meta=data.meta,
        freeze_backbone=freeze_backbone,
    )


def _load_backbone_weights(module: Any, path: str) -> None:
    state = load_state_dict(path)
    missing, _ = module.backbone.load_state_dict(state, strict=False)
    if len(missing) == len(module.backbone.state_dict()):
        raise ConfigError(f"`model.weights` {path}: no parameter matches the backbone (first keys: {list(state)[:3]})")


def _resolve_ckpt(source: str) -> Path:
    p = Path(source)
    if p.is_dir():
        for cand in (p / "checkpoints" / "best.ckpt", p / "checkpoints" / "last.ckpt"):
            if cand.is_file():
                return cand
        raise ConfigError(f"`run.init_checkpoint`: no checkpoints/best.ckpt or last.ckpt under {p}")
    if not p.is_file():
        raise ConfigError(f"`run.init_checkpoint`: {p} does not exist")
    return p


def train(
    cfg: Config,
    *,
    out: str | Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    plots: bool | None = None,
    data: Any = None,
    verbose: bool = True,
    trainer_overrides: dict[str, Any] | None = None,
) -> RunResult:
    """Train one run of ``cfg`` (recipe ``dir``, ``rrt`` or ``rnc``), then evaluate its best checkpoint.

    ``resume=True`` continues ``RUN_DIR`` from ``checkpoints/last.ckpt`` (the config saved in the
    run directory is used; ``trainer_overrides`` -- hardware options such as ``devices``,
    ``strategy``, ``num_nodes``, ``accelerator`` -- are applied on top, so a DDP run can be
    resumed on one process and vice versa). Raises :class:`~rankwise.recipes.modules.NonFiniteLossError` when the
    loss becomes NaN/inf (the last good checkpoint stays on disk).
    """
    import lightning as L

    from rankwise.recipes import reproduce
    from rankwise.recipes.modules import NonFiniteLossError, RnCPretrainer

    if cfg.run.recipe in reproduce.RECIPES:
        return reproduce.train(
            cfg,
            out=out,
            resume=resume,
            overwrite=overwrite,
            progress=progress,
            data=data,
            verbose=verbose,
            trainer_overrides=trainer_overrides,
        )
    if not verbose:
        _quiet_lightning()
    run_dir = resolve_run_dir(cfg, out, resume=resume, overwrite=overwrite)
    if resume:
        import yaml

        cfg = config_from_dict(yaml.safe_load((run_dir / "config.yaml").read_text()))
        if trainer_overrides:
            import dataclasses

            cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, **trainer_overrides))
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt_dir = run_dir / "checkpoints"
    worker = _is_launched_worker()
    if not resume and not worker:
        from rankwise import __version__

        _save_config(cfg, run_dir)
        _update_meta(
            run_dir,
            rankwise_version=__version__,
            git_hash=git_hash(),
            command=" ".join(sys.argv),
            torch_version=torch.__version__,
            started=time.strftime("%Y-%m-%dT%H:%M:%S"),
        )
    if not worker:
        _update_meta(run_dir, status="running")
    if cfg.trainer.num_threads:
        torch.set_num_threads(cfg.trainer.num_threads)
    t0 = time.perf_counter()
    L.seed_everything(cfg.run.seed, workers=True, verbose=False)
    if data is None:
        data = _deps.get_dataset(cfg.data.name, **cfg.data.options)
    if not hasattr(data, "train_labels"):
        raise ConfigError(
            f"dataset `{cfg.data.name}` is a classification dataset; the training recipes need a "
            "regression dataset (see `rankwise data list`)"
        )
    train_dl, val_dl, test_dl = _loaders(data, cfg)
    try:
        recipe = cfg.run.recipe
        if recipe == "rnc":
            pre_dir = run_dir / "pretrain"
            done = pre_dir / "done"
            pre = RnCPretrainer(config_to_dict(cfg), input_dim=data.input_dim, meta=data.meta, kind=data.kind)
            if not done.is_file():
                last = pre_dir / "last.ckpt"
                trainer = _trainer(
                    cfg,
                    run_dir,
                    pre_dir,
                    max_epochs=cfg.rnc.pretrain_epochs,
                    monitor=None,
                    progress=progress,
                    log_name="pretrain",
                )
                trainer.fit(
                    pre, train_dl, ckpt_path=str(last) if resume and last.is_file() else None, weights_only=True
                )
                if trainer.global_rank == 0:
                    done.write_text("ok")
            else:
                pre.load_state_dict(load_state_dict(pre_dir / "last.ckpt"))
            module = build_module(cfg, data, freeze_backbone=True)
            module.backbone.load_state_dict(pre.backbone.state_dict())
        else:
            module = build_module(cfg, data, freeze_backbone=recipe == "rrt")
            if cfg.model.weights:
                _load_backbone_weights(module, cfg.model.weights)
            if recipe == "rrt":
                if not cfg.run.init_checkpoint:  # also checked by the config validation
                    raise ConfigError("`run.init_checkpoint` is required when `run.recipe` is 'rrt'")
                src = _resolve_ckpt(cfg.run.init_checkpoint)
                state = load_state_dict(src)
                module.load_state_dict({k: v for k, v in state.items() if not k.startswith("lds_")}, strict=False)
                if cfg.run.reset_head:
                    torch.manual_seed(cfg.run.seed)
                    module.reset_head()
        last = ckpt_dir / "last.ckpt"
        trainer = _trainer(
            cfg, run_dir, ckpt_dir, max_epochs=cfg.trainer.max_epochs, monitor="val/mae", progress=progress
        )
        trainer.fit(
            module, train_dl, val_dl, ckpt_path=str(last) if resume and last.is_file() else None, weights_only=True
        )
    except NonFiniteLossError as e:
        _update_meta(run_dir, status="failed: non-finite loss", error=str(e))
        raise
    except BaseException as e:
        _update_meta(run_dir, status=f"failed: {type(e).__name__}", error=str(e))
        raise
    if trainer.global_rank != 0:
        return RunResult(run_dir, {}, cfg)
    seconds = time.perf_counter() - t0
    _update_meta(run_dir, train_seconds=round(seconds, 2), epochs=int(trainer.current_epoch))
    metrics = evaluate(run_dir, data=data, module=module, cfg=cfg, plots=plots, test_dl=test_dl, val_dl=val_dl)
    _update_meta(run_dir, status="completed", finished=time.strftime("%Y-%m-%dT%H:%M:%S"))
    return RunResult(run_dir, metrics, cfg)


# ------------------------------------------------------------------------------------------ evaluate


def _predict(module: Any, loader: Any, trainer: Any) -> dict[str, np.ndarray]:
    outs = trainer.predict(module, loader)
    return {k: torch.cat([o[k] for o in outs]).cpu().numpy() for k in ("pred", "label", "features")}


def evaluate(
    run_dir: str | Path,
    *,
    data: Any = None,
    module: Any = None,
    cfg: Config | None = None,
    plots: bool | None = None,
    test_dl: Any = None,
    val_dl: Any = None,
    checkpoint: str = "best",
) -> dict[str, Any]:
    """Evaluate ``RUN_DIR``'s best checkpoint on the val and test sets; write metrics.json, predictions, plots."""
    import yaml

    from rankwise.recipes import reports

    run_dir = Path(run_dir)
    if cfg is None:
        cfg_file = run_dir / "config.yaml"
        if not cfg_file.is_file():
            raise ConfigError(f"{run_dir} is not a run directory (no config.yaml)")
        cfg = config_from_dict(yaml.safe_load(cfg_file.read_text()))
    if cfg.run.recipe in ("supcon", "sort", "median", "dknn"):  # reproduction recipes: metrics of the run
        metrics_file = run_dir / "metrics.json"
        if not metrics_file.is_file():
            raise ConfigError(f"{run_dir} has no metrics.json (recipe {cfg.run.recipe!r} is evaluated when trained)")
        return dict(json.loads(metrics_file.read_text()))
    if data is None:
        data = _deps.get_dataset(cfg.data.name, **cfg.data.options)
    if module is None:
        module = build_module(cfg, data, freeze_backbone=cfg.run.recipe in ("rrt", "rnc"))
    ckpt = run_dir / "checkpoints" / f"{checkpoint}.ckpt"
    if not ckpt.is_file():
        ckpt = run_dir / "checkpoints" / "last.ckpt"
    if not ckpt.is_file():
        raise ConfigError(f"{run_dir} has no checkpoint (checkpoints/best.ckpt or last.ckpt)")
    module.load_state_dict(load_state_dict(ckpt))
    module.eval()
    if test_dl is None or val_dl is None:
        _, val_dl, test_dl = _loaders(data, cfg)
    r = cfg.run
    kw = {"many_shot": r.many_shot, "few_shot": r.few_shot, "bin_width": data.bin_width}
    trainer = eval_trainer(cfg)
    test = _predict(module, test_dl, trainer)
    val = _predict(module, val_dl, trainer)
    metrics = {
        "test": _deps.regression_metrics(test["pred"], test["label"], data.train_labels, **kw),
        "val": _deps.regression_metrics(val["pred"], val["label"], data.train_labels, **kw),
        "checkpoint": str(ckpt.relative_to(run_dir)),
        "dataset": cfg.data.name,
        "run": cfg.run.name,
        "seed": cfg.run.seed,
    }
    _write_json(run_dir / "metrics.json", metrics)
    rng = np.random.default_rng(0)
    n = len(test["label"])
    sample = np.sort(rng.choice(n, size=min(n, r.plot_samples), replace=False)) if n else np.zeros(0, dtype=int)
    np.savez_compressed(
        run_dir / "predictions.npz",
        pred=test["pred"],
        label=test["label"],
        train_labels=np.asarray(data.train_labels, dtype=np.float64),
        bin_width=data.bin_width,
        sample=sample,
        features=test["features"][sample],
    )
    if plots if plots is not None else r.plots:
        pdir = run_dir / "plots"
        pdir.mkdir(exist_ok=True)
        title = f"{r.name} (seed {r.seed})"
        reports.plot_label_histogram(
            data.train_labels,
            data.bin_width,
            pdir / "label_histogram.png",
            many_shot=r.many_shot,
            few_shot=r.few_shot,
            test_labels=data.test_labels,
        )
        reports.plot_per_label_mae(
            test["pred"],
            test["label"],
            data.train_labels,
            data.bin_width,
            pdir / "per_label_mae.png",
            title=f"per-label test MAE: {title}",
        )
        feats, labs = test["features"][sample], test["label"][sample]
        reports.plot_similarity_heatmap(feats, labs, pdir / "similarity.png", title=f"feature similarity: {title}")
        if r.tsne:
            reports.plot_tsne(feats, labs, pdir / "tsne.png", seed=r.seed, title=f"t-SNE: {title}")
    return metrics


# ------------------------------------------------------------------------------------------ compare


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
    """Several methods x seeds: train every config/preset for each seed (run directories are reused
    as they are), then write ``OUT/report.md`` with the mean ± std table and plots."""
    from rankwise.recipes import reports

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict[str, Any]]] = {}
    run_dirs: dict[str, list[Path]] = {}
    data_cache: dict[str, Any] = {}
    for src in sources:
        if _is_run_dir(src):
            metrics_file = Path(src) / "metrics.json"
            metrics = json.loads(metrics_file.read_text()) if metrics_file.is_file() else evaluate(src)
            name = Path(src).name
            results.setdefault(name, []).append(metrics)
            run_dirs.setdefault(name, []).append(Path(src))
            continue
        load_config(src, list(overrides))  # validate once before any training
        method = Path(src).stem if Path(src).is_file() else str(src)
        for i, seed in enumerate(seeds):
            cfg = load_config(src, [*overrides, f"run.seed={seed}", f"run.name={method}-seed{seed}"])
            run_dir = out / "runs" / method / f"seed{seed}"
            if (
                (run_dir / "metrics.json").is_file()
                and (run_dir / "meta.json").is_file()
                and json.loads((run_dir / "meta.json").read_text()).get("status") == "completed"
                and not overwrite
            ):
                metrics = json.loads((run_dir / "metrics.json").read_text())
                res = RunResult(run_dir, metrics, cfg)
            else:
                key = json.dumps([cfg.data.name, cfg.data.options], sort_keys=True, default=str)
                if key not in data_cache:
                    data_cache[key] = _deps.get_dataset(cfg.data.name, **cfg.data.options)
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
    from rankwise.recipes import reproduce

    writer = (
        reproduce.write_compare_report
        if any(reproduce.is_repro_metrics(m) for runs in results.values() for m in runs)
        else reports.write_compare_report
    )
    report = writer(out, results, run_dirs, title=title, extra=extra)
    _write_json(
        out / "results.json", {"results": results, "run_dirs": {k: [str(p) for p in v] for k, v in run_dirs.items()}}
    )
    return CompareResult(out, report, results, run_dirs)
