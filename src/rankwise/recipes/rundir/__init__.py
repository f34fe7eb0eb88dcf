"""The run lifecycle every recipe goes through: run directory, lock, config + meta, Trainer, resume, status.

Run directory layout (the same for every recipe)::

    RUN_DIR/config.yaml          resolved config (after presets, ``extends`` and ``--set``)
    RUN_DIR/meta.json            rankwise version, git hash, command, status (running / completed / failed)
    RUN_DIR/checkpoints/         best.ckpt (best validation metric; the evaluated one without validation)
                                 and last.ckpt (after EVERY epoch, ``--resume`` continues from it)
    RUN_DIR/<stage>/             checkpoints of a recipe's other stages (see :mod:`rankwise.recipes.stages`);
                                 every stage folder holds a ``done`` marker once the stage has finished
    RUN_DIR/logs/metrics.csv     CSV log (``logs/<stage>/`` for other stages);  RUN_DIR/tb/  TensorBoard
    RUN_DIR/data.json            what the run was trained on: data section, file fingerprints, split digest,
                                 what a prediction needs (see :mod:`rankwise.recipes.rundir._record`)
    RUN_DIR/metrics.json         ``recipe``, ``method``, ``test`` metrics, seed, timing
    RUN_DIR/changed_data/        ``rankwise evaluate --allow-changed-data``'s metrics, predictions, plots
    RUN_DIR/plots/*.png          training curves + the recipe's plots
    RUN_DIR/predictions/*.csv    ``rankwise predict``'s predictions of new rows
    RUN_DIR/.lock                exclusive lock held while a process uses the directory

``--overwrite`` deletes these files and nothing else: a directory holding any other file, folder or
symbolic link is refused, nothing deleted (:func:`rankwise.recipes.rundir._directory.rankwise_files`).

:func:`run_recipe` is the lifecycle of ``rankwise train``: load the data, open (and lock) the run
directory, write config and meta, seed, call ``recipe.fit(run)`` -- which builds its modules and
trains each stage with :meth:`Run.run_stage` (:mod:`rankwise.recipes.stages`) -- then write ``metrics.json``,
plots and the final status. ANY error or signal marks the run ``failed`` in meta.json (SIGTERM is
raised as :class:`RunTerminated`); the lock is released on exit, also after a crash or ``kill -9``
(it is an ``fcntl.flock`` on ``.lock``).

Checkpoints are written atomically (temporary file, fsync, ``os.replace``) and read with
``torch.load(weights_only=True)``; an unreadable or refused file raises :class:`CheckpointError`
naming it.
"""

from __future__ import annotations

from rankwise.recipes.rundir._directory import LOCK_NAME as LOCK_NAME
from rankwise.recipes.rundir._directory import RunDir, is_rankwise_run_dir, saved_config
from rankwise.recipes.rundir._directory import is_launched_worker as is_launched_worker
from rankwise.recipes.rundir._directory import read_meta as read_meta
from rankwise.recipes.rundir._files import (
    AtomicCheckpointIO,
    CheckpointError,
    RunDirError,
    RunTerminated,
    check_resume_checkpoint,
    check_state_matches,
    git_hash,
    load_checkpoint,
    load_state_dict,
    load_weights,
    write_json,
)
from rankwise.recipes.rundir._files import UnfinishedRunWarning as UnfinishedRunWarning
from rankwise.recipes.rundir._lifecycle import check_data as check_data
from rankwise.recipes.rundir._lifecycle import (
    evaluate_run,
    load_data,
    predict_run,
    predict_run_blocks,
    run_recipe,
    target_limit,
    termination_of,
)
from rankwise.recipes.rundir._lifecycle import load_checked_data as load_checked_data
from rankwise.recipes.rundir._lifecycle import log as log
from rankwise.recipes.rundir._record import ChangedDataWarning, DataChangedError, absolute_data_paths
from rankwise.recipes.rundir._trainer import Run
from rankwise.recipes.rundir._trainer import quiet_lightning as quiet_lightning

__all__ = [
    "AtomicCheckpointIO",
    "ChangedDataWarning",
    "CheckpointError",
    "DataChangedError",
    "Run",
    "RunDir",
    "RunDirError",
    "RunTerminated",
    "absolute_data_paths",
    "check_resume_checkpoint",
    "check_state_matches",
    "evaluate_run",
    "git_hash",
    "is_rankwise_run_dir",
    "load_checkpoint",
    "load_data",
    "load_state_dict",
    "load_weights",
    "predict_run",
    "predict_run_blocks",
    "run_recipe",
    "saved_config",
    "target_limit",
    "termination_of",
    "write_json",
]
