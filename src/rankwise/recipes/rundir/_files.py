"""Run-directory files: the errors, JSON, git hash, and checkpoints (weights-only reads, atomic writes)."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import torch

from rankwise._fileio import UnreadableWeightsError, atomic_path, atomic_write, load_weights_only
from rankwise.recipes.config import UserError

log = logging.getLogger("rankwise")


class RunDirError(UserError):
    """The run directory cannot be used (exists, is locked by another process, is not a run directory, ...)."""


class CheckpointError(UserError):
    """A checkpoint is missing, unreadable (truncated, corrupt) or refused by the weights-only loader."""


class ModelMismatchError(CheckpointError):
    """A checkpoint whose keys, shapes or kinds of dtype are not those of the model it is loaded into."""


class UnfinishedRunWarning(UserWarning):
    """Evaluating or predicting from a run whose training did not finish (killed or failed); the CLI prints
    it as ``warning: ...``."""


class RunTerminated(BaseException):
    """The process received SIGTERM, SIGHUP or SIGINT during a run; the CLI exits with ``128 + signum``."""

    def __init__(self, signum: int) -> None:
        name = signal.Signals(signum).name
        super().__init__(f"interrupted ({name})" if signum == signal.SIGINT else f"terminated by signal {name}")
        self.signum = int(signum)


# ------------------------------------------------------------------------------------------ files


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON atomically (:func:`rankwise._fileio.atomic_write`)."""
    atomic_write(path, json.dumps(obj, indent=2, default=_json_default))


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
        return load_weights_only(path, map_location=map_location)
    except UnreadableWeightsError as e:
        if not e.refused:  # random bytes, a truncated or foreign file: no pickle at all
            raise CheckpointError(corrupt) from None
        # never repeat torch's advice to load with weights_only=False: that would run code from the file
        raise CheckpointError(
            f"checkpoint {path} was refused: it holds objects other than tensors and plain data, and rankwise "
            "only loads checkpoints in weights-only mode"
        ) from None
    except MemoryError:
        raise
    except OSError:  # a file that cannot be read (a folder, no permission): as any unreadable byte sequence
        raise CheckpointError(corrupt) from None


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
        raise ModelMismatchError(f"checkpoint {path} does not fit this run's model: {'; '.join(parts)}")
    for k, v in own.items():
        if tuple(state[k].shape) != tuple(v.shape):
            raise ModelMismatchError(
                f"checkpoint {path} does not fit this run's model: {k!r} has shape {tuple(state[k].shape)}, "
                f"the model's is {tuple(v.shape)}"
            )
        if state[k].is_floating_point() != v.is_floating_point():  # integer weights would load truncated
            raise ModelMismatchError(
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
    return load_resume_checkpoint(path, module)[1]


def load_resume_checkpoint(path: Path, module: torch.nn.Module) -> tuple[dict[str, Any], int | None]:
    """:func:`check_resume_checkpoint`, and the checkpoint it loaded (read once)."""
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
    return ckpt, (epoch + 1 if isinstance(epoch, int) else None)


class _WholeWrites:
    """The file object ``torch.save`` writes a checkpoint to: every buffer written whole (a short write
    is continued; nothing written is a full disk), and the first exception of a write kept in
    :attr:`error`. torch's zip writer turns an exception of ``write`` (``ENOSPC``: no space left on
    the device) into a ``RuntimeError`` "unexpected pos ..." and ignores a short write."""

    def __init__(self, fh: Any) -> None:
        self._fh = fh
        self.error: BaseException | None = None

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        done = 0
        try:
            while done < len(view):
                n = self._fh.write(view[done:])
                if not n:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                done += n
        except BaseException as e:
            if self.error is None:
                self.error = e
            raise
        return done

    def flush(self) -> None:
        self._fh.flush()


def _save_error(path: Path, err: OSError) -> str:
    """One line: the checkpoint that could not be saved, why, and what to do."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        why, then = "no space left on the device (or over the disk quota)", "free some space, then continue"
    else:
        why, then = (err.strerror or str(err) or type(err).__name__).rstrip("."), "continue"
    return f"cannot save checkpoint {path}: {why}; its temporary file was removed ({then} the run with --resume)"


#: most checkpoints a background writer holds unwritten (a save waits for the oldest beyond it)
MAX_PENDING = 4


def _atomic_checkpoint_io(background: bool) -> Any:
    import io
    import sys
    from concurrent.futures import Future, ThreadPoolExecutor

    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    def write(path: Path, save: Any) -> None:
        """``save(file)`` into ``path`` through :func:`atomic_path`; an OSError: a CheckpointError naming it."""
        path.parent.mkdir(parents=True, exist_ok=True)
        out: _WholeWrites | None = None
        try:
            with atomic_path(path) as tmp, open(tmp, "wb") as fh:  # removed again on any failure
                out = _WholeWrites(fh)
                save(cast("IO[bytes]", out))  # only write() and flush() are used
        except BaseException as e:
            if not isinstance(e, Exception):  # a signal (RunTerminated, KeyboardInterrupt) stops the run as itself
                raise
            cause = out.error if out is not None and out.error is not None else e
            if isinstance(cause, OSError):
                raise CheckpointError(_save_error(path, cause)) from None
            if cause is not e:  # e.g. the RunTerminated of a signal, hidden by torch's "unexpected pos"
                raise cause from None
            raise

    class _AtomicCheckpointIO(TorchCheckpointIO):
        """Checkpoint I/O that never leaves a truncated file (:func:`rankwise._fileio.atomic_path`).

        Loading always uses ``torch.load(weights_only=True)`` (errors name the file). ``background``:
        the checkpoint is serialized at once (the state as it is at the call) and written, synced and
        moved into place by one writer thread, in the order of the calls, while training goes on (at
        most :data:`MAX_PENDING` unwritten); a save raises the error of a write that failed before it,
        and a load, a removal and the end of the stage (``teardown``) wait for every write and raise
        the first error.
        """

        def __init__(self) -> None:
            super().__init__()
            self._pool: ThreadPoolExecutor | None = None
            self._pending: list[Future[None]] = []

        def _raise_failed(self, *, wait: bool) -> None:
            while self._pending and (wait or self._pending[0].done() or len(self._pending) >= MAX_PENDING):
                self._pending.pop(0).result()

        def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
            if storage_options is not None:
                raise TypeError("`storage_options` is not supported by AtomicCheckpointIO")
            path = Path(path)
            if not background:
                write(path, lambda f: torch.save(checkpoint, f))
                return
            self._raise_failed(wait=False)
            buf = io.BytesIO()
            try:
                torch.save(checkpoint, buf)
            except OSError as e:  # as in write(): the error names the checkpoint
                raise CheckpointError(_save_error(path, e)) from None
            data = buf.getvalue()
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rankwise-checkpoint")
            self._pending.append(self._pool.submit(write, path, lambda f: f.write(data)))

        def wait(self) -> None:
            """Wait for the checkpoints being written; raise the first error."""
            try:
                self._raise_failed(wait=True)
            finally:
                for f in self._pending:  # after a failure: the later writes still end before this returns
                    with contextlib.suppress(Exception):
                        f.result()
                self._pending = []

        def remove_checkpoint(self, path: Any) -> None:
            self.wait()
            super().remove_checkpoint(path)

        def teardown(self) -> None:
            try:
                if sys.exc_info()[1] is None:
                    self.wait()
                else:  # the stage failed already: that error is the one to report
                    with contextlib.suppress(Exception):
                        self.wait()
            finally:
                if self._pool is not None:
                    self._pool.shutdown(wait=True)
                    self._pool = None
            super().teardown()

        def load_checkpoint(
            self, path: Any, map_location: Any = None, weights_only: bool | None = None
        ) -> dict[str, Any]:
            self.wait()
            return load_checkpoint(path, map_location=map_location or "cpu")

    return _AtomicCheckpointIO()


def AtomicCheckpointIO(*, background: bool = False) -> Any:
    """A Lightning ``CheckpointIO`` plug-in writing checkpoints atomically (see module doc); ``background``:
    written by a thread while training goes on (see the class)."""
    return _atomic_checkpoint_io(background)
