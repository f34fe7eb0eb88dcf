"""The run directory: meta.json, the saved config, opening, overwriting and the ``.lock``."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from rankwise._fileio import atomic_write
from rankwise.recipes.config import Config, config_to_dict, dump_yaml
from rankwise.recipes.rundir._files import RunDirError, write_json

LOCK_NAME = ".lock"

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
        return contents

    @classmethod
    def _open(cls, path: Path, *, resume: bool, overwrite: bool) -> RunDir:
        contents = cls._check(path, resume=resume, overwrite=overwrite)
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
