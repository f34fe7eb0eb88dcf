"""The CLI and run-directory items of the reliability issue (12: items 10-14, 16, 17) and quiet logs (17: item 7).

One test (at least) per item; each reproduces the probe that found the defect.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("typer")
pytest.importorskip("lightning")
pytest.importorskip("sklego")

import torch
from typer.testing import CliRunner

from rankwise.cli import app
from tests.cli_helpers import TINY
from tests.cli_helpers import one_error_line as _one_error_line

ROOT = Path(__file__).resolve().parents[1]


runner = CliRunner()


def _sets(extra=()):
    return [a for s in [*TINY, *extra] for a in ("--set", s)]


def invoke(args):
    return runner.invoke(app, args, catch_exceptions=False)


def _train(tmp_path, name="run", extra=()):
    r = invoke(["train", "abalone_vanilla", *_sets(extra), "--out", str(tmp_path / name), "--no-progress"])
    assert r.exit_code == 0, r.output
    return tmp_path / name


# ------------------------------------------------------------------------------ item 10: --overwrite


def test_overwrite_refuses_a_directory_rankwise_did_not_write(tmp_path):
    victim = tmp_path / "victim"
    (victim / "src").mkdir(parents=True)
    (victim / "important.txt").write_text("keep me")
    (victim / "src" / "code.py").write_text("x = 1")
    line = _one_error_line(invoke(["train", "abalone_vanilla", *_sets(), "--out", str(victim), "--overwrite"]))
    assert "refuses to delete" in line and "not a rankwise run directory" in line
    assert (victim / "important.txt").read_text() == "keep me" and (victim / "src" / "code.py").is_file()
    # a rankwise run directory is replaced (a stage folder of the old run goes with it), one holding a
    # file of the user's is refused
    run = _train(tmp_path)
    (run / "pretrain").mkdir()
    (run / "pretrain" / "last.ckpt").write_bytes(b"stale")
    r = invoke(["train", "abalone_vanilla", *_sets(), "--out", str(run), "--overwrite", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert not (run / "pretrain").exists()
    (run / "extra.txt").write_text("mine")
    line = _one_error_line(invoke(["train", "abalone_vanilla", *_sets(), "--out", str(run), "--overwrite"]))
    assert "extra.txt is a file that rankwise did not write" in line
    assert (run / "extra.txt").read_text() == "mine" and (run / "checkpoints" / "best.ckpt").is_file()


# ------------------------------------------------------------------------------ items 11 + 13: lock, SIGTERM


def _wait_for(pred, timeout=240.0):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if pred():
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
def test_second_run_on_the_same_dir_fails_at_once_and_sigterm_exits_143(tmp_path):
    run = tmp_path / "busy"
    cmd = [sys.executable, "-m", "rankwise.cli", "train", "abalone_vanilla", "--out", str(run), "--no-progress"]
    cmd += _sets(["trainer.max_epochs=100000", "trainer.limit_train_batches=1"])
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert _wait_for(lambda: (run / "checkpoints" / "last.ckpt").is_file()), "the first run did not start"
        # item 11: the second run on the same directory fails at once with a clear message
        t0 = time.perf_counter()
        line = _one_error_line(invoke(["train", "abalone_vanilla", *_sets(), "--out", str(run), "--resume"]))
        assert "in use by another rankwise process" in line and str(proc.pid) in line
        line = _one_error_line(invoke(["train", "abalone_vanilla", *_sets(), "--out", str(run), "--overwrite"]))
        assert "in use by another rankwise process" in line
        assert time.perf_counter() - t0 < 60
        assert (run / "checkpoints" / "last.ckpt").is_file()  # the running run's files are untouched
        # item 13: SIGTERM -> non-zero exit (143) and status failed
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, out[-2000:] + err[-2000:]
    assert "error: terminated by signal SIGTERM" in " ".join(err.split())
    meta = json.loads((run / "meta.json").read_text())
    assert meta["status"] == "failed" and meta["failure"] == "RunTerminated"
    # the lock died with the process
    import fcntl

    fd = os.open(run / ".lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


@pytest.mark.slow
def test_sigterm_to_the_process_group_with_dataloader_workers_exits_143(tmp_path):
    """A scheduler's time limit (or ``timeout``, or Ctrl-C) signals the whole process group: the DataLoader
    workers die of the signal too, and however the race between them and the main process goes, the run
    is "terminated by signal SIGTERM" (exit 143, resumable), not an unexpected RuntimeError."""
    run = tmp_path / "group"
    cmd = [sys.executable, "-m", "rankwise.cli", "train", "abalone_vanilla", "--out", str(run), "--no-progress"]
    cmd += _sets(["trainer.max_epochs=100000", "trainer.limit_train_batches=2", "data.num_workers=2"])
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert _wait_for(lambda: (run / "checkpoints" / "last.ckpt").is_file()), "the run did not start"
        time.sleep(1.0)  # inside an epoch, with the workers alive
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, out[-2000:] + err[-2000:]
    assert "error: terminated by signal SIGTERM" in " ".join(err.split()) and "RuntimeError" not in out + err
    meta = json.loads((run / "meta.json").read_text())
    assert meta["status"] == "failed" and meta["failure"] == "RunTerminated"


def test_a_worker_killed_by_a_stop_signal_is_a_termination():
    from rankwise.recipes.rundir import termination_of

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        msg = f"DataLoader worker (pid 123) is killed by signal: {signal.strsignal(sig)}. "
        stopped = termination_of(RuntimeError(msg))
        assert stopped is not None and stopped.signum == sig
    for other in (
        RuntimeError("DataLoader worker (pid 123) is killed by signal: Segmentation fault. "),
        RuntimeError("DataLoader worker (pid(s) 123) exited unexpectedly"),
        RuntimeError("killed by signal: Terminated"),
        ValueError("DataLoader worker (pid 123) is killed by signal: Terminated. "),
    ):
        assert termination_of(other) is None
    from rankwise.recipes.rundir import RunTerminated

    try:  # an error raised while the run unwinds from the signal: still a termination
        try:
            raise RunTerminated(signal.SIGTERM)
        except RunTerminated:
            raise RuntimeError("DataLoader worker (pid 9) is killed by signal: Segmentation fault. ") from None
    except RuntimeError as e:
        chained = termination_of(e)
    assert chained is not None and chained.signum == signal.SIGTERM


def test_every_failure_marks_the_run_failed_and_exits_non_zero(tmp_path, monkeypatch):
    import errno

    real_save = torch.save

    def full_disk(obj, f, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(getattr(f, "name", f)))

    monkeypatch.setattr(torch, "save", full_disk)
    line = _one_error_line(invoke(["train", "abalone_vanilla", *_sets(), "--out", str(tmp_path / "full")]))
    assert "no space left" in line.lower() and ".ckpt" in line
    monkeypatch.setattr(torch, "save", real_save)
    meta = json.loads((tmp_path / "full" / "meta.json").read_text())
    assert meta["status"] == "failed" and meta["failure"] == "CheckpointError"


# ------------------------------------------------------------------------------ item 12: last.ckpt every epoch


def test_last_checkpoint_every_epoch_best_by_validation(tmp_path):
    import csv

    run = _train(tmp_path, extra=["trainer.max_epochs=4", "optimizer.lr=0.05"])
    last = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    best = torch.load(run / "checkpoints" / "best.ckpt", weights_only=True)
    assert last["epoch"] == 3 and last["global_step"] == 12  # the last epoch, whatever the validation did
    with open(run / "logs" / "metrics.csv") as fh:
        val = {int(r["epoch"]): float(r["val/mae"]) for r in csv.DictReader(fh) if r.get("val/mae")}
    assert best["epoch"] == min(val, key=val.get)  # best = lowest validation MAE


# ------------------------------------------------------------------------------ item 14: one error line


def test_user_errors_are_one_line_naming_the_file(tmp_path):
    # a missing data file
    missing = tmp_path / "nope.csv"
    line = _one_error_line(
        invoke(["train", "abalone_vanilla", *_sets(["data.name=csv", f"data.options={{path: {missing}, target: y}}"])])
    )
    assert str(missing) in line
    # bad rows in a CSV: the loader names the file and row
    bad = tmp_path / "bad.csv"
    bad.write_text("x1,x2,y\n" + "\n".join(f"{i},{i * 2},{i % 7}" for i in range(60)) + "\n1,oops,3\n")
    line = _one_error_line(
        invoke(["train", "abalone_vanilla", *_sets(["data.name=csv", f"data.options={{path: {bad}, target: y}}"])])
    )
    assert str(bad) in line
    # an output directory that cannot be created (its parent is a file)
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    line = _one_error_line(invoke(["train", "abalone_vanilla", *_sets(), "--out", str(blocker / "run")]))
    assert str(blocker / "run") in line and "Not a directory" in line
    # an unwritable output directory
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if not os.access(ro, os.W_OK):  # (as root, permissions are not enforced: nothing to check)
            line = _one_error_line(invoke(["train", "abalone_vanilla", *_sets(), "--out", str(ro / "run")]))
            assert str(ro / "run") in line and "ermission" in line
    finally:
        ro.chmod(0o700)


def test_refused_and_truncated_checkpoints_name_the_file(tmp_path):
    run = _train(tmp_path)
    best = run / "checkpoints" / "best.ckpt"
    ckpt = torch.load(best, weights_only=True)

    class Payload:  # any non-weights object: the weights-only loader refuses the file
        def __reduce__(self):
            return (print, ("pwned",))

    ckpt["evil"] = Payload()
    with open(best, "wb") as fh:
        torch.save(ckpt, fh, pickle_module=pickle)
    line = _one_error_line(invoke(["evaluate", str(run), "--no-plots"]))
    assert str(best) in line and "refused" in line and "weights_only=False" not in line
    # a truncated last.ckpt: --resume names it
    last = run / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[:200])
    line = _one_error_line(invoke(["train", "abalone_vanilla", "--out", str(run), "--resume", "--no-progress"]))
    assert str(last) in line and "cannot read checkpoint" in line
    assert json.loads((run / "meta.json").read_text())["status"] == "failed"


class _Touch:
    """Unpickling this runs ``touch path``: the loader must refuse it without running it."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_corrupt_files_and_pickle_payloads_get_their_own_message(tmp_path):
    import io

    import numpy as np

    from rankwise.recipes.rundir import CheckpointError, load_checkpoint

    good = io.BytesIO()
    torch.save({"state_dict": {"w": torch.ones(3)}}, good)
    zipped = good.getvalue()
    legacy = io.BytesIO()
    torch.save({"state_dict": {"w": torch.ones(3)}}, legacy, _use_new_zipfile_serialization=False)
    corrupt = {
        "random bytes": np.random.default_rng(1).bytes(4096),
        "short random bytes": np.random.default_rng(2).bytes(64),
        "truncated zip checkpoint": zipped[: len(zipped) // 2],
        "truncated legacy checkpoint": legacy.getvalue()[:100],
        "text": b"hello world\n",
        "empty": b"",
        "zip of garbage": b"PK\x03\x04" + np.random.default_rng(3).bytes(300),
    }
    ran = tmp_path / "payload_ran"
    payloads = {
        "zip checkpoint with an object": {"state_dict": {"w": torch.ones(3)}, "x": _Touch(ran)},
        "legacy checkpoint with an object": ({"x": _Touch(ran)}, {"_use_new_zipfile_serialization": False}),
        "raw pickle, protocol 4": pickle.dumps(_Touch(ran), protocol=4),
        "raw pickle, protocol 2": pickle.dumps(_Touch(ran), protocol=2),
        "raw pickle, protocol 0": pickle.dumps(_Touch(ran), protocol=0),
    }
    for name, data in corrupt.items():
        path = tmp_path / f"{name}.ckpt"
        path.write_bytes(data)
        with pytest.raises(CheckpointError) as info:
            load_checkpoint(path)
        msg = str(info.value)
        assert str(path) in msg and "corrupt or not a torch checkpoint" in msg, (name, msg)
        assert "objects other than tensors" not in msg, name
    for name, data in payloads.items():
        path = tmp_path / f"{name}.ckpt"
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            obj, kw = data if isinstance(data, tuple) else (data, {})
            with open(path, "wb") as fh:
                torch.save(obj, fh, pickle_module=pickle, **kw)
        with pytest.raises(CheckpointError) as info:
            load_checkpoint(path)
        msg = str(info.value)
        assert str(path) in msg and "refused" in msg and "objects other than tensors" in msg, (name, msg)
        assert "weights_only=False" not in msg
        assert not ran.exists(), f"{name}: the payload ran"
    for name, data in (("zip", zipped), ("legacy", legacy.getvalue())):  # whole checkpoints still load
        (tmp_path / f"{name}.ckpt").write_bytes(data)
        assert load_checkpoint(tmp_path / f"{name}.ckpt")["state_dict"]["w"].tolist() == [1.0] * 3


def test_evaluate_names_a_random_bytes_checkpoint_as_corrupt(tmp_path):
    import numpy as np

    run = _train(tmp_path)
    best = run / "checkpoints" / "best.ckpt"
    best.write_bytes(np.random.default_rng(1).bytes(4096))
    line = _one_error_line(invoke(["evaluate", str(run), "--no-plots"]))
    assert str(best) in line and "corrupt or not a torch checkpoint" in line, line


def test_debug_shows_the_traceback(tmp_path, monkeypatch):
    from rankwise.recipes.config import ConfigError

    with pytest.raises(ConfigError):
        invoke(["--debug", "train", "abalone_vanilla", "--set", "optimizer.lrr=1"])
    monkeypatch.setenv("RANKWISE_DEBUG", "1")
    with pytest.raises(ConfigError):
        invoke(["train", "abalone_vanilla", "--set", "optimizer.lrr=1"])


# ------------------------------------------------------------------------------ item 16: ranges where read


@pytest.mark.parametrize(
    "override,needle",
    [
        ("schedule.gamma=-1", "`schedule.gamma` must be > 0"),
        ("optimizer.lr=.nan", "`optimizer.lr` must be a finite number"),
        ("trainer.num_threads=-1", "`trainer.num_threads` must be >= 1"),
        ("trainer.precision=bogus", "`trainer.precision` must be one of"),
        ("task.fds.momentum=5", "`task.fds.momentum` must be <= 1"),
        ("report.few_shot=-1", "`report.few_shot` must be >= 0"),
        ("report.plot_samples=-5", "`report.plot_samples` must be >= 1"),
    ],
)
def test_bad_values_are_one_line(override, needle, tmp_path):
    line = _one_error_line(invoke(["train", "abalone_vanilla", "--set", override, "--out", str(tmp_path / "x")]))
    assert needle in line
    assert not (tmp_path / "x").exists()


def test_rnc_feature_dropout_range(tmp_path):
    line = _one_error_line(invoke(["train", "abalone_rnc", "--set", "task.feature_dropout=2"]))
    assert "`task.feature_dropout` must be < 1" in line


def test_empty_splits_are_refused_before_training(tmp_path):
    line = _one_error_line(invoke(["train", "abalone_vanilla", *_sets(["data.options.per_label=0"])]))
    assert "per_label=0" in line and "every split needs at least one row" in line
    one = tmp_path / "one.csv"
    one.write_text("x1,y\n1.0,2.0\n")
    line = _one_error_line(
        invoke(["train", "abalone_vanilla", *_sets(["data.name=csv", f"data.options={{path: {one}, target: y}}"])])
    )
    assert "split" in line or str(one) in line


def test_evaluate_and_resume_arguments(tmp_path):
    line = _one_error_line(invoke(["evaluate", str(tmp_path), "--checkpoint", "bogus"]))
    assert "--checkpoint must be 'best' or 'last'" in line
    run = _train(tmp_path)
    (run / "checkpoints" / "best.ckpt").unlink()
    line = _one_error_line(invoke(["evaluate", str(run), "--checkpoint", "best", "--no-plots"]))
    assert "checkpoints/best.ckpt" in line  # no silent fall-back to last
    assert invoke(["evaluate", str(run), "--checkpoint", "last", "--no-plots"]).exit_code == 0
    # --resume of a directory with no checkpoint does not silently start from scratch
    empty = tmp_path / "empty"
    _train(tmp_path, "empty")
    for p in (empty / "checkpoints").iterdir():
        p.unlink()
    line = _one_error_line(invoke(["train", "abalone_vanilla", "--out", str(empty), "--resume"]))
    assert "has no checkpoint yet" in line


# ------------------------------------------------------------------------------ item 17: paths


def test_preset_names_and_run_names_stay_in_their_folders(tmp_path, monkeypatch):
    (tmp_path / "x.yaml").write_text("trainer: {max_epochs: 1}\n")
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)
    line = _one_error_line(invoke(["train", "../../x"]))
    assert "does not exist" in line
    line = _one_error_line(invoke(["train", "abalone_vanilla", "--set", "run.name=../escaped"]))
    assert "`run.name` must be a single path component" in line
    assert not (tmp_path / "a" / "escaped").exists() and not (sub / "runs").exists()


# ------------------------------------------------------------------------------ quiet logs


@pytest.mark.slow
def test_no_progress_prints_one_line_per_epoch_and_no_adverts(tmp_path):
    cmd = [sys.executable, "-m", "rankwise.cli", "train", "abalone_vanilla", "--out", str(tmp_path / "r")]
    proc = subprocess.run(
        [*cmd, "--no-progress", *_sets(["trainer.max_epochs=3"])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout + proc.stderr
    epochs = [ln for ln in proc.stdout.splitlines() if ln.startswith("epoch ")]
    assert [ln.split(":")[0] for ln in epochs] == ["epoch 1/3", "epoch 2/3", "epoch 3/3"]
    assert all("train/loss" in ln and "val/mae" in ln and ln.rstrip().endswith(" s)") for ln in epochs)
    for noise in ("Tip", "litlogger", "litmodels", "LeafSpec", "GPU available", "FutureWarning"):
        assert noise not in text, noise


def test_help_does_not_import_heavy_packages():
    code = (
        "import sys, atexit\n"
        "heavy = ('lightning', 'torchvision', 'matplotlib', 'pandas', 'sklearn')\n"
        "atexit.register(lambda: print('HEAVY', [m for m in heavy if m in sys.modules]))\n"
        "from rankwise.cli import main\n"
        "main(['--help'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "HEAVY []" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
