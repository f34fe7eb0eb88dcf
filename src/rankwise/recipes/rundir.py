"""The run lifecycle every recipe goes through: run directory, lock, config + meta, Trainer, resume, status.

Run directory layout (the same for every recipe)::

    RUN_DIR/config.yaml          resolved config (after presets, ``extends`` and ``--set``)
    RUN_DIR/meta.json            rankwise version, git hash, command, status (running / completed / failed)
    RUN_DIR/checkpoints/         best.ckpt (best validation metric; the evaluated one without validation)
                                 and last.ckpt (after EVERY epoch, ``--resume`` continues from it)
    RUN_DIR/<stage>/             checkpoints of a recipe's other stages (see :mod:`rankwise.recipes.stages`);
                                 every stage folder holds a ``done`` marker once the stage has finished
    RUN_DIR/logs/metrics.csv     CSV log (``logs/<stage>/`` for other stages);  RUN_DIR/tb/  TensorBoard
    RUN_DIR/metrics.json         ``recipe``, ``method``, ``test`` metrics, seed, timing
    RUN_DIR/plots/*.png          training curves + the recipe's plots
    RUN_DIR/.lock                exclusive lock held while a process uses the directory

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

import contextlib
import json
import logging
import math
import os
import pickle
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rankwise.recipes import stages as _stages
from rankwise.recipes.config import Config, ConfigError, UserError, config_to_dict

__all__ = [
    "AtomicCheckpointIO",
    "CheckpointError",
    "Run",
    "RunDir",
    "RunDirError",
    "RunTerminated",
    "check_resume_checkpoint",
    "check_state_matches",
    "evaluate_run",
    "git_hash",
    "is_rankwise_run_dir",
    "load_checkpoint",
    "load_data",
    "load_state_dict",
    "load_weights",
    "run_recipe",
    "saved_config",
    "target_limit",
    "write_json",
]

log = logging.getLogger("rankwise")

LOCK_NAME = ".lock"


class RunDirError(UserError):
    """The run directory cannot be used (exists, is locked by another process, is not a run directory, ...)."""


class CheckpointError(UserError):
    """A checkpoint is missing, unreadable (truncated, corrupt) or refused by the weights-only loader."""


class RunTerminated(BaseException):
    """The process received SIGTERM, SIGHUP or SIGINT during a run; the CLI exits with ``128 + signum``."""

    def __init__(self, signum: int) -> None:
        name = signal.Signals(signum).name
        super().__init__(f"interrupted ({name})" if signum == signal.SIGINT else f"terminated by signal {name}")
        self.signum = int(signum)


# ------------------------------------------------------------------------------------------ files


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON atomically (temporary file + ``os.replace``)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(json.dumps(obj, indent=2, default=_json_default))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


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


def load_checkpoint(path: str | Path, map_location: Any = "cpu") -> Any:
    """``torch.load(path, weights_only=True)``; a missing, truncated or refused file raises :class:`CheckpointError`."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    corrupt = (
        f"cannot read checkpoint {path}: the file is corrupt or not a torch checkpoint "
        "(truncated, or written by another program)"
    )
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:
        if not _holds_pickled_objects(path):  # random bytes, a truncated or foreign file: no pickle at all
            raise CheckpointError(corrupt) from None
        # never repeat torch's advice to load with weights_only=False: that would run code from the file
        raise CheckpointError(
            f"checkpoint {path} was refused: it holds objects other than tensors and plain data, and rankwise "
            "only loads checkpoints in weights-only mode"
        ) from None
    except MemoryError:
        raise
    except Exception:  # any byte sequence: RuntimeError, EOFError, BadZipFile, KeyError, IndexError, ...
        raise CheckpointError(corrupt) from None


#: most pickle opcodes :func:`_holds_pickled_objects` reads before deciding
_MAX_OPCODES = 1_000_000


def _holds_pickled_objects(path: Path) -> bool:
    """Whether ``path`` (the ``data.pkl`` of a zip checkpoint, else the file itself: up to four pickles in a
    row, as in torch's legacy format) holds a complete pickle stream that builds objects (``GLOBAL``,
    ``REDUCE``, ...); read with :mod:`pickletools`, which decodes the opcodes without running any of
    them. Random bytes, a truncated pickle and a pickle of plain data only are not."""
    import pickletools
    import zipfile

    builders = {"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "NEWOBJ", "NEWOBJ_EX", "BUILD"}
    try:
        with contextlib.ExitStack() as stack:
            if zipfile.is_zipfile(path):
                archive = stack.enter_context(zipfile.ZipFile(path))
                member = next((n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"), None)
                if member is None:
                    return False
                stream = stack.enter_context(archive.open(member))
            else:
                stream = stack.enter_context(open(path, "rb"))
            count = 0
            for _ in range(4):  # torch's legacy format: magic number, protocol, system info, then the objects
                seen = False
                for op, _, _ in pickletools.genops(stream):
                    seen = seen or op.name in builders
                    count += 1
                    if count >= _MAX_OPCODES:
                        return seen
                if seen:  # a complete pickle stream that builds objects
                    return True
            return False
    except Exception:  # an unknown opcode, a truncated stream, a broken zip: not a pickle
        return False


def _check_state(state: Any, path: str | Path) -> dict[str, torch.Tensor]:
    """A state dict: a mapping of names to tensors, every floating tensor finite."""
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} holds no state dict (got {type(state).__name__})")
    for k, v in state.items():
        if not isinstance(k, str) or not isinstance(v, torch.Tensor):
            raise CheckpointError(
                f"checkpoint {path} is not a state dict: entry {str(k)[:60]!r} holds a {type(v).__name__}, not a tensor"
            )
        if v.is_floating_point() and v.numel() and not bool(torch.isfinite(v).all()):
            raise CheckpointError(f"checkpoint {path} holds NaN or infinite weights in {k!r}")
    return state


def load_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The model ``state_dict`` of a Lightning checkpoint (or a plain state dict), weights-only.

    Raises :class:`CheckpointError` naming the file when it holds no mapping of names to tensors
    or a NaN/infinite weight.
    """
    ckpt = load_checkpoint(path)
    state = ckpt["state_dict"] if isinstance(ckpt, dict) and "state_dict" in ckpt else ckpt
    return _check_state(state, path)


def check_state_matches(module: torch.nn.Module, state: dict[str, torch.Tensor], path: str | Path) -> None:
    """``state`` has exactly the keys of ``module.state_dict()`` with the same shapes and kinds of dtype
    (floating or not), else :class:`CheckpointError`."""
    own = module.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} key(s), e.g. {missing[:3]}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected key(s), e.g. {[k[:60] for k in unexpected[:3]]}")
        raise CheckpointError(f"checkpoint {path} does not fit this run's model: {'; '.join(parts)}")
    for k, v in own.items():
        if tuple(state[k].shape) != tuple(v.shape):
            raise CheckpointError(
                f"checkpoint {path} does not fit this run's model: {k!r} has shape {tuple(state[k].shape)}, "
                f"the model's is {tuple(v.shape)}"
            )
        if state[k].is_floating_point() != v.is_floating_point():  # integer weights would load truncated
            raise CheckpointError(
                f"checkpoint {path} does not fit this run's model: {k!r} has dtype {state[k].dtype}, "
                f"the model's is {v.dtype}"
            )


def load_weights(module: torch.nn.Module, path: str | Path, *, strict: bool = True, skip: Sequence[str] = ()) -> None:
    """Load the (Lightning or plain) checkpoint ``path`` into ``module``, every key and shape checked.

    ``skip``: prefixes of keys left out; ``strict=False``: only the keys the module and the file share
    are loaded (e.g. another run's encoder into a new head).
    """
    state = load_state_dict(path)
    if skip:
        state = {k: v for k, v in state.items() if not k.startswith(tuple(skip))}
    if not strict:
        module.load_state_dict(state, strict=False)
        return
    check_state_matches(module, state, path)
    module.load_state_dict(state)


def check_resume_checkpoint(path: Path, module: torch.nn.Module) -> int | None:
    """A ``last.ckpt`` that ``--resume`` can continue: a Lightning checkpoint of this run's model.
    Returns the epochs it has trained (its ``epoch`` + 1; ``None`` when that is not an int).

    Refused with :class:`CheckpointError` naming the file: not a regular file (a symlink to a
    device, a directory), not a Lightning checkpoint (no ``state_dict``, ``optimizer_states``,
    ``loops``, ``epoch``), a state dict whose keys or shapes differ from the model's, NaN weights.
    """
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise CheckpointError(f"cannot --resume: checkpoint {path} cannot be read: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"cannot --resume: checkpoint {path} is not a regular file")
    ckpt = load_checkpoint(path)
    if not isinstance(ckpt, dict):
        raise CheckpointError(
            f"cannot --resume: checkpoint {path} is not a Lightning checkpoint (a {type(ckpt).__name__})"
        )
    missing = [k for k in ("state_dict", "optimizer_states", "loops", "epoch", "global_step") if k not in ckpt]
    if missing:
        raise CheckpointError(
            f"cannot --resume: checkpoint {path} is not a Lightning training checkpoint (no {', '.join(missing)})"
        )
    opt = ckpt["optimizer_states"]
    if not isinstance(opt, list) or not all(isinstance(o, dict) and "param_groups" in o for o in opt):
        raise CheckpointError(f"cannot --resume: checkpoint {path} has no valid optimizer state")
    check_state_matches(module, _check_state(ckpt["state_dict"], path), path)
    epoch = ckpt["epoch"]
    return epoch + 1 if isinstance(epoch, int) else None


def _atomic_checkpoint_io() -> Any:
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    class _AtomicCheckpointIO(TorchCheckpointIO):
        """Checkpoint I/O that never leaves a truncated file: temp file + fsync + ``os.replace``.

        Loading always uses ``torch.load(weights_only=True)`` (errors name the file).
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
            return load_checkpoint(path, map_location=map_location or "cpu")

    return _AtomicCheckpointIO()


def AtomicCheckpointIO() -> Any:
    """A Lightning ``CheckpointIO`` plug-in writing checkpoints atomically (see module doc)."""
    return _atomic_checkpoint_io()


# ------------------------------------------------------------------------------------------ run directory


def is_launched_worker() -> bool:
    """True in the extra processes a DDP launcher starts (they re-run the same command; rank 0 owns the dir)."""
    # RANK / GROUP_RANK: torchrun (other nodes' local rank 0 too); SLURM_PROCID: srun tasks
    names = ("LOCAL_RANK", "NODE_RANK", "RANK", "GROUP_RANK", "SLURM_PROCID")
    return any(int(os.environ.get(v, "0") or 0) != 0 for v in names)


def read_meta(run_dir: Path) -> dict[str, Any] | None:
    """``meta.json`` of a run directory (``None`` when absent or unreadable)."""
    try:
        meta = json.loads((run_dir / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def is_rankwise_run_dir(path: str | Path) -> bool:
    """A directory holding a ``meta.json`` written by rankwise (the only kind ``--overwrite`` deletes)."""
    meta = read_meta(Path(path))
    return meta is not None and "rankwise_version" in meta


def saved_config(run_dir: str | Path, *, resume: bool = False) -> Path:
    """``RUN_DIR/config.yaml``; a RunDirError when there is none (``resume``: naming ``--resume``)."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        action = "cannot --resume: " if resume else ""
        raise RunDirError(f"{action}{run_dir} is not a run directory (no config.yaml)")
    return path


class RunDir:
    """An opened run directory: exclusively locked by this process until :meth:`close` (or exit)."""

    def __init__(self, path: Path, lock_fd: int | None) -> None:
        self.path = path
        self._lock_fd = lock_fd

    @classmethod
    def open(cls, path: str | Path, *, resume: bool, overwrite: bool) -> RunDir:
        """Create (or reuse with ``resume``/``overwrite``) and lock the run directory ``path``."""
        path = Path(path)
        try:
            return cls._open(path, resume=resume, overwrite=overwrite)
        except OSError as e:
            raise RunDirError(f"cannot use run directory {path}: {e.strerror or e}") from e

    @classmethod
    def _open(cls, path: Path, *, resume: bool, overwrite: bool) -> RunDir:
        if resume and overwrite:
            raise RunDirError("--resume and --overwrite contradict each other: continue the run, or replace it")
        if path.exists() and not path.is_dir():
            raise RunDirError(f"run directory {path} exists and is not a directory")
        contents = [p for p in path.iterdir() if p.name != LOCK_NAME] if path.is_dir() else []
        if resume:
            saved_config(path, resume=True)
            if not any(path.rglob("*.ckpt")):
                raise RunDirError(
                    f"cannot --resume {path}: it has no checkpoint yet (the run stopped before its first epoch "
                    "ended); start it again with --overwrite"
                )
        elif contents:
            if not overwrite:
                raise RunDirError(
                    f"run directory {path} already exists; pass --resume to continue it, --overwrite to replace "
                    "it, or --out/--set run.name=... for a new one"
                )
            if not is_rankwise_run_dir(path):
                raise RunDirError(
                    f"--overwrite refuses to delete {path}: it is not a rankwise run directory (no meta.json "
                    "written by rankwise); remove it yourself or choose another --out"
                )
        path.mkdir(parents=True, exist_ok=True)
        fd = _lock(path)
        if not resume and contents:  # --overwrite of a rankwise run directory, now that we hold its lock
            for p in path.iterdir():
                if p.name == LOCK_NAME:
                    continue
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                else:
                    p.unlink()
        return cls(path, fd)

    @classmethod
    def lock_existing(cls, path: str | Path) -> RunDir:
        """Lock an existing run directory (e.g. to re-evaluate it) without changing it."""
        path = Path(path)
        saved_config(path)
        try:
            return cls(path, _lock(path))
        except OSError as e:
            raise RunDirError(f"cannot use run directory {path}: {e.strerror or e}") from e

    def write_config(self, cfg: Config) -> None:
        import yaml

        tmp = self.path / f".config.yaml.tmp{os.getpid()}"
        tmp.write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
        os.replace(tmp, self.path / "config.yaml")

    def update_meta(self, **fields: Any) -> None:
        meta = read_meta(self.path) or {}
        meta.update(fields)
        write_json(self.path / "meta.json", meta)

    def close(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None


def _lock(path: Path) -> int | None:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no lock
        return None
    fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        try:
            holder = os.read(fd, 64).decode(errors="replace").strip()
        except OSError:
            holder = ""
        os.close(fd)
        who = f" (pid {holder})" if holder else ""
        raise RunDirError(
            f"run directory {path} is in use by another rankwise process{who}; wait for it or choose another --out"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


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
        return self.dir / (stage or "checkpoints")

    def checkpoint(self, name: str = "last", stage: str = "") -> Path:
        """Path of ``<stage dir>/<name>.ckpt`` (``CheckpointError`` if it does not exist)."""
        p = self.ckpt_dir(stage) / f"{name}.ckpt"
        if not p.is_file():
            raise CheckpointError(f"{self.dir} has no {p.relative_to(self.dir)}")
        return p

    @property
    def plots_dir(self) -> Path | None:
        """``RUN_DIR/plots`` (created) when plots are on, else ``None``."""
        if not self.plots:
            return None
        p = self.dir / "plots"
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


# ------------------------------------------------------------------------------------------ lifecycle


def load_data(cfg: Config, recipe: Any) -> Any:
    """Load ``cfg.data`` and check it suits ``recipe`` (kind, non-empty splits)."""
    from rankwise.data import DataFormatError, get_dataset

    try:
        data = get_dataset(cfg.data.name, **cfg.data.options)
    except DataFormatError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(f"cannot load dataset `data.name` {cfg.data.name!r} with `data.options`: {e}") from None
    check_data(cfg, recipe, data)
    return data


def check_data(cfg: Config, recipe: Any, data: Any) -> None:
    """The dataset has the recipe's kind and no empty split it uses."""
    regression = hasattr(data, "train_labels")
    ranking = hasattr(data, "num_features") and not regression
    if (recipe.data_kind == "ranking") != ranking:
        kind = "a ranking (query-list) dataset such as letor or ltr_synthetic" if ranking else "not a ranking dataset"
        need = (
            "a ranking dataset (letor, ltr_synthetic)"
            if recipe.data_kind == "ranking"
            else f"a {recipe.data_kind} dataset"
        )
        raise ConfigError(
            f"dataset `{cfg.data.name}` is {kind}; recipe {recipe.name!r} needs {need} (see `rankwise data list`)"
        )
    if recipe.data_kind == "regression" and not regression:
        raise ConfigError(
            f"dataset `{cfg.data.name}` is a classification dataset; recipe {recipe.name!r} needs a regression "
            "dataset (see `rankwise data list`)"
        )
    if recipe.data_kind == "classification" and not hasattr(data, "num_classes"):
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
        y = np.asarray(getattr(data, f"{split}_labels", None) if hasattr(data, f"{split}_labels") else [])
        if y.size == 0 or not np.issubdtype(y.dtype, np.number):
            continue
        top = float(np.max(np.abs(y)))
        if not top <= limit:
            raise ConfigError(
                f"dataset `{cfg.data.name}`: {split} targets reach |y| = {top:.3g}, beyond {limit:.3g}, the largest "
                f"target whose squared error stays finite at `trainer.precision` {cfg.trainer.precision!r}; "
                "rescale the target column (e.g. divide it by a power of ten)"
            )


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
        raise RunTerminated(signum)

    sigs = [signal.SIGTERM, signal.SIGINT] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])
    old = {s: signal.signal(s, handler) for s in sigs}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


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
) -> dict[str, Any]:
    """Train ``cfg`` with ``recipe`` in ``run_dir`` (the lifecycle of the module doc); returns metrics.json.

    Rank > 0 of a distributed run returns ``{}`` (rank 0 owns the directory, evaluates and reports).
    """
    import lightning as L

    quiet_lightning()
    if data is None:
        data = load_data(cfg, recipe)
    else:
        check_data(cfg, recipe, data)
    worker = is_launched_worker()
    rd = None if worker else RunDir.open(run_dir, resume=resume, overwrite=overwrite)
    try:
        with _signals_raise():
            if rd is not None:
                from rankwise import __version__

                if not resume:
                    rd.write_config(cfg)
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
        if rd is not None:
            with contextlib.suppress(OSError):  # e.g. a full disk: keep the original error
                rd.update_meta(status="failed", failure=type(e).__name__, error=str(e), finished=_now())
        raise
    finally:
        if rd is not None:
            rd.close()


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
) -> dict[str, Any]:
    """Re-evaluate a finished run from its checkpoint (``best``, ``last`` or None: the recipe's choice; see
    :func:`rankwise.recipes.runner.check_checkpoint_name`); rewrites metrics.json (keeping the training
    time) and plots."""
    quiet_lightning()
    if data is None:
        data = load_data(cfg, recipe)
    else:
        check_data(cfg, recipe, data)
    rd = RunDir.lock_existing(run_dir)  # not while a training process writes the directory
    try:
        run = Run(cfg, Path(run_dir), data, plots=cfg.report.plots if plots is None else plots, evaluating=True)
        if cfg.trainer.num_threads:
            torch.set_num_threads(cfg.trainer.num_threads)
        result = recipe.evaluate(run, checkpoint)
        old = {}
        with contextlib.suppress(OSError, ValueError):
            old = json.loads((run.dir / "metrics.json").read_text())
        metrics = {**_common_metrics(recipe, cfg), **result}
        if isinstance(old, dict) and "train_seconds" in old:
            metrics["train_seconds"] = old["train_seconds"]
        write_json(run.dir / "metrics.json", metrics)
        _plot_curves(run, only_missing=True)
        return metrics
    finally:
        rd.close()
