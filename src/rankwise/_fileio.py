"""File I/O shared by the library and the training system: atomic writes and weights-only reads.

Every file rankwise writes goes through :func:`atomic_path` (or :func:`atomic_write`,
:func:`atomic_open` on top of it): the bytes go to a temporary file in the target's folder, which is
flushed to the disk (``fsync``) and moved over the target (``os.replace``), and the folder is synced
so that the rename survives a crash. A reader sees the old file or the new one, never a part; a
failed or interrupted write leaves the old file as it was and removes its temporary file.

Every checkpoint or weights file is read by :func:`load_weights_only` (``torch.load(...,
weights_only=True)``: no code from the file runs).
"""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Literal, overload

__all__ = ["UnreadableWeightsError", "atomic_open", "atomic_path", "atomic_write", "load_weights_only"]


# ------------------------------------------------------------------------------------------ writes


def temporary_path(path: Path, suffix: str = "") -> Path:
    """The temporary file of a write to ``path``: hidden, beside it, named after it and this process."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}{suffix}")


def _fsync_path(path: Path, *, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    try:
        os.fsync(fd)
    except OSError as e:  # a folder on a file system that cannot sync one: the rename is still atomic
        if not directory or e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | Path, *, suffix: str = "") -> Iterator[Path]:
    """A temporary path to write ``path``'s new content to; on leaving the block it replaces ``path``.

    The block writes the file at the yielded path (by any means: ``open``, ``torch.save``,
    ``nib.save``); then it is synced (``fsync``), moved over ``path`` (``os.replace``) and ``path``'s
    folder is synced. An exception in the block, or in the sync or the move, removes the temporary
    file and is raised again; ``path`` keeps its old content. ``suffix`` ends the temporary name (for
    writers that read the format from it, e.g. ``".nii.gz"``). The folder must exist.

    Example:
        >>> import tempfile, pathlib
        >>> target = pathlib.Path(tempfile.mkdtemp()) / "numbers.txt"
        >>> with atomic_path(target) as tmp:
        ...     _ = tmp.write_text("1 2 3")
        >>> target.read_text(), [p.name for p in target.parent.iterdir()]
        ('1 2 3', ['numbers.txt'])
    """
    path = Path(path)
    tmp = temporary_path(path, suffix)
    try:
        yield tmp
        _fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
    _fsync_path(path.parent, directory=True)


def write_all(path: Path, data: bytes) -> None:
    """Create (or truncate) ``path`` and write all of ``data`` with ``os.write`` (short writes continued,
    a write of nothing is a full disk)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        view = memoryview(data).cast("B")
        while view:
            n = os.write(fd, view)
            if not n:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            view = view[n:]
    finally:
        os.close(fd)


def atomic_write(path: str | Path, data: str | bytes, *, encoding: str = "utf-8") -> Path:
    """Write ``data`` (text is encoded with ``encoding``) to ``path`` atomically (:func:`atomic_path`).
    Returns ``path``."""
    path = Path(path)
    payload = data.encode(encoding) if isinstance(data, str) else bytes(data)
    with atomic_path(path) as tmp:
        write_all(tmp, payload)
    return path


@overload
def atomic_open(
    path: str | Path, mode: Literal["w"] = "w", *, encoding: str = "utf-8", newline: str | None = None
) -> contextlib.AbstractContextManager[IO[str]]: ...


@overload
def atomic_open(
    path: str | Path, mode: Literal["wb"], *, encoding: str = "utf-8", newline: str | None = None
) -> contextlib.AbstractContextManager[IO[bytes]]: ...


def atomic_open(
    path: str | Path, mode: str = "w", *, encoding: str = "utf-8", newline: str | None = None
) -> contextlib.AbstractContextManager[IO[Any]]:
    """A file to write ``path``'s new content to (``mode`` ``"w"`` text or ``"wb"`` bytes), put in place
    atomically when the block ends (:func:`atomic_path`)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"`mode` must be 'w' or 'wb', got {mode!r}")
    return _atomic_open(Path(path), mode, encoding, newline)


@contextlib.contextmanager
def _atomic_open(path: Path, mode: str, encoding: str, newline: str | None) -> Iterator[IO[Any]]:
    with atomic_path(path) as tmp:
        if mode == "wb":
            with open(tmp, "wb") as fh:
                yield fh
        else:
            with open(tmp, "w", encoding=encoding, newline=newline) as fh:
                yield fh


# ------------------------------------------------------------------------------------------ reads


class UnreadableWeightsError(ValueError):
    """A file that ``torch.load(weights_only=True)`` cannot read: :attr:`refused` when it holds pickled
    objects other than tensors and plain data (the weights-only loader refuses them), else it is
    corrupt, truncated or no torch file; :attr:`reason` says which, :attr:`cause` is the loader's exception."""

    def __init__(self, path: str | Path, cause: BaseException, *, refused: bool) -> None:
        self.path, self.cause, self.refused = Path(path), cause, refused
        self.reason = (
            "it holds objects other than tensors and plain data, and only weights-only loading is allowed"
            if refused
            else "the file is corrupt or not a torch file (truncated, or written by another program)"
        )
        super().__init__(f"cannot read {path}: {self.reason}")


def load_weights_only(path: str | Path, *, map_location: Any = "cpu") -> Any:
    """``torch.load(path, map_location=map_location, weights_only=True)``.

    An ``OSError`` (a missing or unreadable file) and ``MemoryError`` are raised as they are; any other
    failure of the loader, whatever the bytes, raises :class:`UnreadableWeightsError`. Torch's advice to
    load with ``weights_only=False`` is never repeated: that would run code from the file.

    Example:
        >>> import tempfile, os, torch
        >>> path = os.path.join(tempfile.mkdtemp(), "w.pt")
        >>> torch.save({"w": torch.ones(2)}, path)
        >>> load_weights_only(path)
        {'w': tensor([1., 1.])}
    """
    import torch  # here: the writes need no torch (the command line imports this module)

    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except (OSError, MemoryError):
        raise
    except pickle.UnpicklingError as e:
        raise UnreadableWeightsError(path, e, refused=_holds_pickled_objects(Path(path))) from None
    except Exception as e:  # any byte sequence: RuntimeError, EOFError, BadZipFile, KeyError, IndexError, ...
        raise UnreadableWeightsError(path, e, refused=False) from None


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
