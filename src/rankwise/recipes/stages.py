"""Training stages: what a recipe trains (:class:`Stage`); the run lifecycle trains it (:meth:`Run.run_stage`).

A recipe describes each of its stages with a :class:`Stage` -- a LightningModule, its data (a
``LightningDataModule``: :class:`~rankwise.recipes.datamodules.LoaderData` over the recipe's
loaders), epochs, the checkpoint monitor, which weights it hands on -- and runs them in
order with ``run.run_stage(stage)`` (or ``run.run_stages([...])``); the next stage is built from the
modules of the stages before it (the weights they hand on are loaded in them). The run
(:class:`~rankwise.recipes.rundir.Run`, its one stage loop) alone owns, for every stage:

* its folders: checkpoints in ``RUN_DIR/<stage>/`` (the main stage, ``name=""``: ``checkpoints/``),
  CSV log in ``logs/<stage>/`` (main: ``logs/``), TensorBoard in ``tb/<stage>``; a ``local`` stage
  (one device, rank 0) keeps ``last.ckpt`` and its CSV log (``logs/metrics.csv``) under ``RUN_DIR/<stage>/``;
* its ``done`` marker (``<checkpoint folder>/done``, JSON ``{"epoch_seconds": [...]}``: the wall
  time of every training epoch), written by rank 0 when the stage has trained to its end;
* resume across stages: a stage with a ``done`` marker is skipped (its weights are loaded; under
  ``--resume`` its ``last.ckpt`` is checked as for a stage that continues), an unfinished one
  continues from its ``last.ckpt`` under ``--resume`` -- also a finished one whose ``last.ckpt`` holds
  fewer epochs than the stage now asks for (a run extended by editing its saved ``config.yaml``); a
  ``local`` stage is cheap and redone every time (no marker);
* the weights it hands on: after the stage (trained or skipped) its ``best`` or ``last`` checkpoint
  is loaded into ``module`` on every process, so the next stage starts from them;
* its training-curve plot (``plots/<stage>_curves.png``, when ``curves`` names it);
* the random state after it: once the stage has trained or been skipped, the global RNGs (``random``,
  NumPy, torch on the CPU) are set to the state its ``last.ckpt`` recorded at the end of its last epoch
  (:meth:`~rankwise.recipes.rundir.Run.restore_rng`), so what the recipe builds next (the next stage's
  initial weights) and trains next is the same whether this process trained the stage or a resumed
  one skipped it as done (or found it trained to its end without a marker); a ``local`` stage is redone
  every time and leaves the state as its training does.

The helpers here read a stage's files; those that take ``run`` take the :class:`~rankwise.recipes.rundir.Run`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rankwise._fileio import atomic_write

__all__ = [
    "Stage",
    "StageResult",
    "plot_stage_curves",
    "read_done",
    "stage_log",
    "write_done",
]

DONE = "done"


@dataclass
class Stage:
    """One training stage of a recipe (see the module doc for what the lifecycle does with it).

    Args:
        name: folder of the stage: ``""`` is the main stage (``checkpoints/``, ``logs/``), another
            name ``RUN_DIR/<name>/`` and ``logs/<name>/``.
        module: the LightningModule trained.
        data: its ``LightningDataModule`` (:class:`~rankwise.recipes.datamodules.LoaderData`): training
            data, and validation data when it defines ``val_dataloader`` (else no validation).
        epochs: training epochs.
        monitor: the logged metric selecting ``best.ckpt`` (None: the latest epoch).
        mode: ``"min"`` or ``"max"`` of ``monitor``.
        best: keep a ``best.ckpt`` besides ``last.ckpt``.
        hand_on: the checkpoint loaded into ``module`` after the stage (``"best"``, ``"last"``;
            None: the weights in memory at the end of training).
        local: a small stage trained on one device of rank 0 (e.g. a linear probe), redone on
            every fit and evaluation: ``last.ckpt`` and ``logs/metrics.csv`` under ``RUN_DIR/<name>/``.
        precision: train at ``trainer.precision`` (False: float32; ``local`` stages).
        callbacks: extra Lightning callbacks of this stage.
        quiet: warning messages (regular expressions) ignored while it trains.
        curves: title of ``plots/<name>_curves.png`` drawn from its CSV log (None: no plot).
    """

    name: str
    module: Any
    data: Any
    epochs: int = 1
    monitor: str | None = None
    mode: Literal["min", "max"] = "min"
    best: bool = True
    hand_on: Literal["best", "last"] | None = "best"
    local: bool = False
    precision: bool = True
    callbacks: Sequence[Any] = ()
    quiet: Sequence[str] = ()
    curves: str | None = None

    def __post_init__(self) -> None:
        if self.name in (".", "..") or "/" in self.name or "\\" in self.name:
            raise ValueError(f"`name` must be a folder name of the run directory (or ''), got {self.name!r}")
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, int) or self.epochs < 1:
            raise ValueError(f"`epochs` must be an int >= 1, got {self.epochs!r}")
        if self.mode not in ("min", "max"):
            raise ValueError(f"`mode` must be 'min' or 'max', got {self.mode!r}")
        if self.hand_on not in (None, "best", "last"):
            raise ValueError(f"`hand_on` must be 'best', 'last' or None, got {self.hand_on!r}")
        if self.hand_on == "best" and (self.local or not self.best):
            raise ValueError(f"stage {self.name!r} keeps no best.ckpt to hand on: use hand_on='last' or None")


@dataclass
class StageResult:
    """A stage after :meth:`~rankwise.recipes.rundir.Run.run_stage`: its module (holding the handed-on
    weights), its Trainer (None when it was skipped as done, or on a rank other than 0 for a ``local``
    stage) and its epoch times."""

    stage: Stage
    trainer: Any = None
    epoch_seconds: list[float] = field(default_factory=list)
    skipped: bool = False

    @property
    def module(self) -> Any:
        return self.stage.module


def read_done(path: Path) -> list[float] | None:
    """The epoch seconds of a ``done`` marker (:func:`write_done`); None when there is none, or when the
    file is not such a marker (the stage is then trained again)."""
    try:
        marker = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    secs = marker.get("epoch_seconds") if isinstance(marker, dict) else None
    if not isinstance(secs, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in secs):
        return None
    return [float(v) for v in secs]


def write_done(path: Path, epoch_seconds: Iterable[float]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps({"epoch_seconds": list(epoch_seconds)}))


def stage_log(run: Any, name: str) -> Path:
    """The CSV log of stage ``name`` (``""``: the main stage)."""
    return run.dir / "logs" / name / "metrics.csv" if name else run.dir / "logs" / "metrics.csv"


def plot_stage_curves(run: Any, log: Path, name: str, title: str) -> None:
    """``plots/<name>_curves.png`` from the CSV ``log`` (when plots are on and the log exists)."""
    pdir = run.plots_dir
    if pdir is None or not log.is_file():
        return
    from rankwise.recipes.reports import plot_training_curves

    r = run.cfg.run
    plot_training_curves(log, pdir / f"{name}_curves.png", title=f"{title}: {r.name} (seed {r.seed})")
