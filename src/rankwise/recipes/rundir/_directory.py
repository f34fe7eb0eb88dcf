"""The run directory: meta.json, the saved config, opening, overwriting and the ``.lock``."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankwise._fileio import atomic_write
from rankwise.recipes.config import Config, config_to_dict, dump_yaml
from rankwise.recipes.rundir._files import RunDirError, write_json
from rankwise.recipes.rundir._record import CHANGED_DATA_DIR, RECORD_NAME
from rankwise.recipes.stages import DONE

LOCK_NAME = ".lock"

# ------------------------------------------------------------------------------------------ layout
# What rankwise writes into a run directory: ``--overwrite`` deletes these and nothing else.

#: the plots a recipe draws into ``plots/`` (besides ``<stage>_curves.png``)
PLOT_NAMES = frozenset(
    {
        "training_curves.png",
        "label_histogram.png",
        "per_label_mae.png",
        "similarity.png",
        "tsne.png",
        "ndcg_at_k.png",
        "shots.png",
        "pred_vs_age.png",
        "bag_vs_age.png",
        "mae_by_decade.png",
        "inputs_montage.png",
    }
)
_RESULT_FILES = frozenset({"metrics.json", "predictions.npz", "predictions.csv", "report.md"})
_RUN_FILES = _RESULT_FILES | {"config.yaml", "meta.json", RECORD_NAME, LOCK_NAME}
_CHECKPOINT_FILES = frozenset({"best.ckpt", "last.ckpt", DONE})
_LOG_FILES = frozenset({"metrics.csv", "hparams.yaml"})
#: the temporary file of an atomic write (``rankwise._fileio.temporary_path``) left by a killed process
_TEMPORARY = re.compile(r"\.(.+)\.tmp[0-9]+(\.[A-Za-z0-9]+)?")


@dataclass(frozen=True)
class _Folder:
    """A folder of the layout: the names of the files it may hold, and the layout of each subfolder
    (``None``: that subfolder is not rankwise's)."""

    file: Callable[[str], bool]
    folder: Callable[[str], _Folder | None] = lambda name: None

    def holds(self, name: str) -> bool:
        """``name`` is one of its files, or the temporary file of a write to one."""
        m = _TEMPORARY.fullmatch(name)
        return self.file(name) or (m is not None and self.file(m[1]))


def _plot(name: str) -> bool:
    return name in PLOT_NAMES or (name.endswith("_curves.png") and len(name) > len("_curves.png"))


_LOGS = _Folder(_LOG_FILES.__contains__)  # CSV log of one stage
_STAGE = _Folder(_CHECKPOINT_FILES.__contains__, {"logs": _LOGS}.get)  # a stage's checkpoints (+ a local stage's log)
_PLOTS = _Folder(_plot)
_RESULTS = _Folder(_RESULT_FILES.__contains__, lambda name: _PLOTS if name == "plots" else _STAGE)


def _tb_file(name: str) -> bool:
    return name == "hparams.yaml" or name.startswith("events.out.tfevents.")


_SUBFOLDERS: dict[str, _Folder] = {
    "checkpoints": _Folder(_CHECKPOINT_FILES.__contains__),
    "logs": _Folder(_LOG_FILES.__contains__, lambda name: _LOGS),
    "tb": _Folder(_tb_file, lambda name: _Folder(_tb_file)),
    "plots": _PLOTS,
    "predictions": _Folder(lambda name: name.endswith(".csv")),
    CHANGED_DATA_DIR: _RESULTS,
}
_RUN = _Folder(_RUN_FILES.__contains__, lambda name: _SUBFOLDERS.get(name, _STAGE))


class _Foreign(Exception):
    def __init__(self, path: Path) -> None:
        self.path = path


def _walk(folder: Path, layout: _Folder, files: list[Path], folders: list[Path]) -> None:
    """Add the files and subfolders of ``folder`` to ``files`` and ``folders`` (a subfolder after its
    contents); raise :class:`_Foreign` at the first entry that is not in ``layout`` (a symbolic link
    never is: rankwise writes none, and none is followed)."""
    for p in sorted(folder.iterdir()):
        if p.is_symlink():
            raise _Foreign(p)
        if p.is_dir():
            sub = layout.folder(p.name)
            if sub is None:
                raise _Foreign(p)
            _walk(p, sub, files, folders)
            folders.append(p)
        elif p.is_file() and layout.holds(p.name):
            files.append(p)
        else:
            raise _Foreign(p)


def rankwise_files(run_dir: Path) -> tuple[list[Path], list[Path]]:
    """The files and folders of ``run_dir`` (its ``.lock`` aside) for ``--overwrite`` to delete: all of them
    when each is one rankwise writes there, else a :class:`RunDirError` naming the first other one."""
    files: list[Path] = []
    folders: list[Path] = []
    try:
        _walk(run_dir, _RUN, files, folders)
    except _Foreign as e:
        rel = e.path.relative_to(run_dir)
        kind = "a symbolic link" if e.path.is_symlink() else "a folder" if e.path.is_dir() else "a file"
        raise RunDirError(
            f"--overwrite refuses to delete {run_dir}: {rel} is {kind} that rankwise did not write; move it "
            "out of the run directory or choose another --out"
        ) from None
    return [p for p in files if p != run_dir / LOCK_NAME], folders


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


def unfinished_note(run_dir: Path, checkpoint: Path) -> str | None:
    """One line saying that the training of ``run_dir`` did not finish (meta.json's status ``running``
    while no process holds the run: it was killed; or ``failed``, with its error) and that ``checkpoint``
    is the one used; None for a completed run (or one without a status)."""
    import time

    meta = read_meta(run_dir) or {}
    status = meta.get("status")
    if status == "running":
        how = "was killed (meta.json still says status 'running')"
    elif status == "failed":
        error = " ".join(str(meta.get("error") or "").split())[:200]
        how = f"failed ({meta.get('failure') or 'error'}: {error})" if error else "failed"
    else:
        return None
    try:
        saved = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(checkpoint.stat().st_mtime))
    except OSError:
        saved = "?"
    return (
        f"the training of {run_dir} {how}: using {checkpoint.relative_to(run_dir)}, saved {saved} "
        "before it stopped (finish the run with `rankwise train ... --resume`)"
    )


#: the fields of meta.json that rankwise writes when a run starts (each a string)
META_FIELDS = ("rankwise_version", "command", "torch_version", "started")


def is_rankwise_run_dir(path: str | Path) -> bool:
    """A directory holding the ``config.yaml`` and the ``meta.json`` that rankwise writes when a run starts
    (its version, command, torch version and start time); the only kind ``--overwrite`` replaces."""
    path = Path(path)
    meta = read_meta(path)
    if meta is None or not (path / "config.yaml").is_file():
        return False
    return all(isinstance(meta.get(k), str) for k in META_FIELDS)


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
    def check(cls, path: str | Path, *, resume: bool, overwrite: bool) -> None:
        """Raise the :class:`RunDirError` that :meth:`open` would raise for ``path``, changing nothing.

        A run checks its directory before it reads its data (which may take minutes), then opens it.
        """
        path = Path(path)
        try:
            cls._check(path, resume=resume, overwrite=overwrite)
        except OSError as e:
            raise RunDirError(f"cannot use run directory {path}: {e.strerror or e}") from e

    @classmethod
    def _check(cls, path: Path, *, resume: bool, overwrite: bool) -> list[Path]:
        """The validation of :meth:`open`; returns the directory's entries other than its lock."""
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
            rankwise_files(path)
        return contents

    @classmethod
    def _open(cls, path: Path, *, resume: bool, overwrite: bool) -> RunDir:
        contents = cls._check(path, resume=resume, overwrite=overwrite)
        path.mkdir(parents=True, exist_ok=True)
        rd = cls(path, _lock(path))
        if not resume and contents:  # --overwrite of a rankwise run directory, now that we hold its lock
            try:
                files, folders = rankwise_files(path)  # again: nothing else may have come in meanwhile
                for p in files:
                    p.unlink()
                for p in folders:  # each after its contents
                    os.rmdir(p)
            except BaseException:
                rd.close()
                raise
        return rd

    @classmethod
    def lock_existing(cls, path: str | Path) -> RunDir:
        """Lock an existing run directory (e.g. to re-evaluate it) without changing it."""
        path = Path(path)
        saved_config(path)
        try:
            return cls(path, _lock(path, "wait for it to finish"))
        except OSError as e:
            raise RunDirError(f"cannot use run directory {path}: {e.strerror or e}") from e

    def write_config(self, cfg: Config) -> None:
        atomic_write(self.path / "config.yaml", dump_yaml(config_to_dict(cfg)))

    def update_meta(self, **fields: Any) -> None:
        meta = read_meta(self.path) or {}
        meta.update(fields)
        write_json(self.path / "meta.json", meta)

    def close(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None


def _lock(path: Path, advice: str = "wait for it or choose another --out") -> int | None:
    """Hold the run directory's lock file (an exclusive ``flock``); another process holding it: a
    RunDirError naming the directory, its pid and ``advice``."""
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
        raise RunDirError(f"run directory {path} is in use by another rankwise process{who}; {advice}") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd
