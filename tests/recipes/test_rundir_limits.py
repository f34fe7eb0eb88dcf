"""The run directory at its limits: a checkpoint that does not fit on the disk, a new file too large
to predict from, predictions from a run that was killed or failed, a stop signal racing a worker's exit."""

from __future__ import annotations

import errno
import io
import json
import os
import signal
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("lightning")

from rankwise.data import DataFormatError
from rankwise.data._files import MAX_DATA_BYTES
from rankwise.recipes.rundir import CheckpointError, RunTerminated, UnfinishedRunWarning
from rankwise.recipes.rundir import _files as files_module
from rankwise.recipes.rundir._directory import unfinished_note
from rankwise.recipes.rundir._files import AtomicCheckpointIO
from rankwise.recipes.rundir._lifecycle import _signals_raise, predict_run
from rankwise.recipes.rundir._trainer import Run

CKPT = {"state_dict": {"w": torch.arange(20_000, dtype=torch.float32)}, "epoch": 3}


def _saved_before(path: Path) -> bytes:
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.zeros(3)}}, path)
    return path.read_bytes()


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_is_one_line_naming_the_checkpoint_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "last.ckpt"
    before = _saved_before(path)
    os.symlink("/dev/full", tmp_path / f".last.ckpt.tmp{os.getpid()}")  # every write: ENOSPC
    with pytest.raises(CheckpointError) as err:
        AtomicCheckpointIO().save_checkpoint(CKPT, path)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and "no space left" in msg and "unexpected pos" not in msg
    assert _left(tmp_path) == ["last.ckpt"] and path.read_bytes() == before  # the previous one kept


class _Failing(io.RawIOBase):
    """A file whose writes fail (``exc``) once ``room`` bytes are written, or (``short``) write at most
    100 bytes at a time."""

    def __init__(self, fh, room=4096, exc=None, short=False):
        self.fh, self.room, self.exc, self.short = fh, room, exc, short

    def writable(self):
        return True

    def write(self, data):
        data = bytes(data)
        if self.short:
            return self.fh.write(data[:100])
        if self.exc is not None and len(data) > self.room:
            raise self.exc
        self.room -= len(data)
        return self.fh.write(data)

    def flush(self):
        self.fh.flush()

    def fileno(self):
        return self.fh.fileno()

    def close(self):
        super().close()  # flushes
        self.fh.close()


def _patch_open(monkeypatch, **kw):
    real = open
    monkeypatch.setattr(files_module, "open", lambda p, mode: _Failing(real(p, mode), **kw), raising=False)


def test_enospc_from_a_write_is_named_not_torchs_unexpected_pos(tmp_path, monkeypatch):
    path = tmp_path / "best.ckpt"
    _patch_open(monkeypatch, exc=OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(CheckpointError, match=r"cannot save checkpoint .*best\.ckpt: no space left"):
        AtomicCheckpointIO().save_checkpoint(CKPT, path)
    assert _left(tmp_path) == []


def test_another_write_error_is_named_with_its_reason(tmp_path, monkeypatch):
    _patch_open(monkeypatch, exc=OSError(errno.EIO, "Input/output error"))
    with pytest.raises(CheckpointError, match=r"last\.ckpt: Input/output error"):
        AtomicCheckpointIO().save_checkpoint(CKPT, tmp_path / "last.ckpt")
    assert _left(tmp_path) == []


def test_short_writes_are_continued_not_a_truncated_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    _patch_open(monkeypatch, short=True)
    AtomicCheckpointIO().save_checkpoint(CKPT, path)
    assert torch.equal(torch.load(path, weights_only=True)["state_dict"]["w"], CKPT["state_dict"]["w"])


def test_a_signal_during_a_write_stops_the_run_not_a_runtime_error(tmp_path, monkeypatch):
    _patch_open(monkeypatch, exc=RunTerminated(signal.SIGTERM))
    with pytest.raises(RunTerminated):
        AtomicCheckpointIO().save_checkpoint(CKPT, tmp_path / "last.ckpt")
    assert _left(tmp_path) == []


def test_a_signal_after_a_failed_write_still_stops_the_run(tmp_path, monkeypatch):
    class Interrupted(_Failing):
        def close(self):
            super().close()
            raise RunTerminated(signal.SIGINT)

    real = open
    failing = OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(files_module, "open", lambda p, mode: Interrupted(real(p, mode), exc=failing), raising=False)
    with pytest.raises(RunTerminated):
        AtomicCheckpointIO().save_checkpoint(CKPT, tmp_path / "last.ckpt")
    assert _left(tmp_path) == []


@pytest.mark.skipif(not hasattr(signal, "SIGCHLD") or sys.platform == "win32", reason="POSIX signals")
def test_a_worker_exit_arriving_with_the_stop_signal_is_not_reported(monkeypatch):
    """SIGTERM and a DataLoader worker's SIGCHLD pending together: Python runs the SIGTERM handler first,
    then the SIGCHLD one; that one must still be a Python handler (SIG_DFL: "Signal 17 ignored due to
    race condition" on stderr)."""
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    old_chld = signal.signal(signal.SIGCHLD, lambda s, f: None)  # torch's worker-failure handler
    both = {signal.SIGTERM, signal.SIGCHLD}
    try:
        with pytest.raises(RunTerminated), _signals_raise():
            signal.pthread_sigmask(signal.SIG_BLOCK, both)
            os.kill(os.getpid(), signal.SIGCHLD)
            os.kill(os.getpid(), signal.SIGTERM)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, both)  # both delivered now, handled in order
            for _ in range(1000):
                pass
        for _ in range(1000):  # the pending SIGCHLD is handled here
            pass
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, both)
        signal.signal(signal.SIGCHLD, old_chld)
    assert [str(u.exc_value) for u in unraisable] == []


def test_predict_refuses_a_file_above_the_limit_before_reading_anything(tmp_path):
    new = tmp_path / "new.csv"
    with open(new, "wb") as f:
        f.truncate(8 * 2**30)  # sparse, like the 8 GiB cohort CSV

    def load_data(cfg):
        raise AssertionError("the run's data were loaded")

    for kind in ("regression", "ranking"):  # a ranking run's LETOR files: MAX_LETOR_BYTES (4 GiB)
        recipe = SimpleNamespace(learns=kind, load_data=load_data)
        with pytest.raises(DataFormatError, match=r"new\.csv: the file of 8,589,934,592 bytes .* limit"):
            predict_run(recipe, SimpleNamespace(), tmp_path, new)
    with open(new, "wb") as f:
        f.truncate(MAX_DATA_BYTES + 1)
    with pytest.raises(AssertionError, match="data were loaded"):  # within a LETOR file's limit
        predict_run(SimpleNamespace(learns="ranking", load_data=load_data), SimpleNamespace(), tmp_path, new)


def _run_dir(tmp_path: Path, **meta) -> Path:
    d = tmp_path / "run"
    (d / "checkpoints").mkdir(parents=True)
    (d / "checkpoints" / "best.ckpt").write_bytes(b"x")
    (d / "meta.json").write_text(json.dumps({"rankwise_version": "0", **meta}))
    return d


@pytest.mark.parametrize(
    ("meta", "words"),
    [
        ({"status": "running", "pid": 1}, ["was killed", "status 'running'"]),
        ({"status": "failed", "failure": "RunTerminated", "error": "terminated by signal SIGTERM"}, ["failed"]),
    ],
)
def test_evaluating_an_unfinished_run_says_so_once_and_names_the_checkpoint(tmp_path, meta, words):
    d = _run_dir(tmp_path, **meta)
    run = Run(cfg=None, dir=d, data=None, evaluating=True)  # type: ignore[arg-type]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run.checkpoint("best")
        run.checkpoint("best")
    lines = [str(w.message) for w in seen if issubclass(w.category, UnfinishedRunWarning)]
    assert len(lines) == 1 and all(w in lines[0] for w in words), lines
    assert str(d) in lines[0] and "checkpoints/best.ckpt" in lines[0] and "--resume" in lines[0]


def test_a_completed_run_or_training_says_nothing(tmp_path):
    d = _run_dir(tmp_path, status="completed")
    assert unfinished_note(d, d / "checkpoints" / "best.ckpt") is None
    (d / "meta.json").write_text(json.dumps({"status": "running"}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Run(cfg=None, dir=d, data=None).checkpoint("best")  # type: ignore[arg-type]  # training: its own run
