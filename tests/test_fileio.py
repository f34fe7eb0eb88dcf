"""``rankwise._fileio``: the one atomic write of every file rankwise writes, and the one weights-only read."""

from __future__ import annotations

import errno
import os
import pickle
import stat
from pathlib import Path

import pytest
import torch

from rankwise import _fileio
from rankwise._fileio import (
    UnreadableWeightsError,
    atomic_open,
    atomic_path,
    atomic_write,
    load_weights_only,
    write_all,
)


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_writes_text_and_bytes_and_leaves_only_the_file(tmp_path: Path) -> None:
    atomic_write(tmp_path / "a.txt", "grüße")
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "grüße"
    atomic_write(tmp_path / "a.txt", b"\x00\x01")
    assert (tmp_path / "a.txt").read_bytes() == b"\x00\x01"
    with atomic_open(tmp_path / "b.csv", "w", newline="") as fh:
        fh.write("x,y\r\n")
    assert (tmp_path / "b.csv").read_bytes() == b"x,y\r\n"
    with atomic_open(tmp_path / "c.bin", "wb") as fb:
        fb.write(b"abc")
    assert (tmp_path / "c.bin").read_bytes() == b"abc"
    assert _names(tmp_path) == ["a.txt", "b.csv", "c.bin"]


def test_an_interrupted_replace_keeps_the_old_file_and_removes_the_temporary(tmp_path, monkeypatch) -> None:
    path = tmp_path / "meta.json"
    atomic_write(path, "old")

    def interrupted(src: object, dst: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, "new")
    with pytest.raises(KeyboardInterrupt), atomic_open(path, "w") as fh:
        fh.write("new")
    assert path.read_text() == "old" and _names(tmp_path) == ["meta.json"]


def test_a_failing_block_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    atomic_write(path, b"old")
    with pytest.raises(RuntimeError, match="boom"), atomic_path(path) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("boom")
    with pytest.raises(FileNotFoundError), atomic_path(path):  # nothing written: not a new empty file
        pass
    assert path.read_bytes() == b"old" and _names(tmp_path) == ["last.ckpt"]


def test_the_file_and_its_folder_are_synced(tmp_path, monkeypatch) -> None:
    synced: list[tuple[int, bool]] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        synced.append((st.st_ino, stat.S_ISDIR(st.st_mode)))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    path = atomic_write(tmp_path / "done", "{}")
    assert (path.stat().st_ino, False) in synced  # the file (its inode moved to `path`)
    assert (tmp_path.stat().st_ino, True) in synced  # its folder, after the rename
    assert [d for _, d in synced] == [False, True]


def test_the_temporary_file_keeps_a_suffix_for_writers_that_read_it(tmp_path: Path) -> None:
    with atomic_path(tmp_path / "s.nii.gz", suffix=".nii.gz") as tmp:
        assert tmp.parent == tmp_path and tmp.name.endswith(".nii.gz") and tmp.name.startswith(".")
        tmp.write_bytes(b"x")
    assert _names(tmp_path) == ["s.nii.gz"]


def test_write_all_continues_short_writes_and_names_a_full_disk(tmp_path, monkeypatch) -> None:
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, bytes(data)[:3]))
    write_all(tmp_path / "f", b"0123456789")
    assert (tmp_path / "f").read_bytes() == b"0123456789"
    monkeypatch.setattr(os, "write", lambda fd, data: 0)
    with pytest.raises(OSError) as err:
        atomic_write(tmp_path / "g", b"data")
    assert err.value.errno == errno.ENOSPC and _names(tmp_path) == ["f"]


def test_atomic_open_takes_only_write_modes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="`mode` must be 'w' or 'wb'"):
        atomic_open(tmp_path / "x", "a")  # type: ignore[call-overload]


class _Obj:
    pass


def test_load_weights_only_reads_tensors_and_names_what_it_cannot_read(tmp_path: Path) -> None:
    good = tmp_path / "good.pt"
    torch.save({"w": torch.arange(3.0)}, good)
    assert torch.equal(load_weights_only(good)["w"], torch.arange(3.0))
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a torch file at all")
    with pytest.raises(UnreadableWeightsError, match="corrupt or not a torch file") as err:
        load_weights_only(junk)
    assert not err.value.refused and err.value.path == junk and isinstance(err.value, ValueError)
    objects = tmp_path / "objects.pt"
    torch.save({"obj": _Obj()}, objects)
    with pytest.raises(UnreadableWeightsError, match="only weights-only loading") as err:
        load_weights_only(objects)
    assert err.value.refused and isinstance(err.value.cause, pickle.UnpicklingError)
    assert "weights_only=False" not in str(err.value)
    with pytest.raises(FileNotFoundError):
        load_weights_only(tmp_path / "missing.pt")


def test_the_library_loads_and_saves_through_it() -> None:
    """No ``torch.load`` / ``os.replace`` / ``fsync`` outside this module (a new writer or reader uses it)."""
    import re

    src = Path(_fileio.__file__).parent
    calls = re.compile(r"(?<![\w.`])(torch\.load|os\.replace|os\.fsync|tempfile\.mkstemp)\(")
    found = [
        f"{p.relative_to(src)}:{i}"
        for p in sorted(src.rglob("*.py"))
        if p.name != "_fileio.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if calls.search(line) and ">>>" not in line
    ]
    assert not found, found
