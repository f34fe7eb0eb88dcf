"""Lightning recipes on tiny abalone runs: DIR stack, RRT, RnC, FDS; resume after SIGKILL; NaN stop; run dirs."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning")
pytest.importorskip("sklego")

import torch

from rankwise.recipes import load_config
from rankwise.recipes.common import NonFiniteLossError
from rankwise.recipes.rundir import load_state_dict
from rankwise.recipes.runner import evaluate, train
from tests.recipes._faults import NaNAtStep

ROOT = Path(__file__).resolve().parents[2]

#: tiny, fast settings shared by every test run
TINY = [
    "model.options.hidden=[16]",
    "model.options.feature_dim=8",
    "data.batch_size=128",
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=3",
    "trainer.num_threads=1",
    "trainer.log_every_n_steps=1",
    "trainer.enable_progress_bar=false",
    "report.plots=false",
]


@pytest.fixture(scope="module")
def abalone():
    from rankwise.data import get_dataset

    return get_dataset("abalone", per_label=10, seed=0)


def _check_metrics(m):
    for g in ("all", "many", "medium", "few"):
        assert math.isfinite(m["test"][g]["mae"]) and m["test"][g]["count"] > 0
    assert m["test"]["all"]["count"] == sum(m["test"][g]["count"] for g in ("many", "medium", "few"))


def test_dir_stack_with_all_regularizers_and_plots(tmp_path, abalone):
    cfg = load_config(
        "abalone_ranksim_lds",
        [
            *TINY,
            "report.plots=true",
            "report.plot_samples=40",
            "loss.regularizers.pairwise_difference.weight=0.1",
            "loss.regularizers.spearman.weight=0.5",
            "loss.regularizers.conr.weight=0.5",
            "loss.kind=focal_l1",
        ],
    )
    res = train(cfg, out=tmp_path / "run", progress=False, verbose=False, data=abalone)
    d = res.run_dir
    for f in [
        "config.yaml",
        "meta.json",
        "metrics.json",
        "predictions.npz",
        "checkpoints/best.ckpt",
        "checkpoints/last.ckpt",
        "logs/metrics.csv",
        "plots/label_histogram.png",
        "plots/per_label_mae.png",
        "plots/similarity.png",
        "plots/tsne.png",
        "plots/training_curves.png",
    ]:
        assert (d / f).is_file(), f
    assert list((d / "tb").glob("events.out.tfevents.*"))
    meta = json.loads((d / "meta.json").read_text())
    assert meta["status"] == "completed" and meta["rankwise_version"]
    m = json.loads((d / "metrics.json").read_text())
    _check_metrics(m)
    assert m["recipe"] == "dir" and m["method"] == "dir"
    assert m == res.metrics
    csv_text = (d / "logs" / "metrics.csv").read_text()
    assert "train/loss/ranksim" in csv_text and "val/mae" in csv_text and "train/loss/conr" in csv_text
    assert "train/loss/pairwise_difference" in csv_text and "train/loss/spearman" in csv_text
    # checkpoints are plain state: loadable with weights_only=True
    ckpt = torch.load(d / "checkpoints" / "best.ckpt", weights_only=True)
    assert "state_dict" in ckpt and "lds_table" in "".join(ckpt["state_dict"])
    # evaluate reproduces the same numbers from the run directory alone
    again = evaluate(d, plots=False)
    assert again["test"]["all"]["mae"] == pytest.approx(m["test"]["all"]["mae"], rel=1e-6)


def test_lds_weights_follow_the_label_table(abalone):
    from rankwise.recipes.regression.module import DIRRegressor

    cfg = load_config("abalone_lds", TINY)
    mod = DIRRegressor(cfg, input_dim=abalone.input_dim, bin_width=1.0, train_labels=abalone.train_labels)
    y = torch.tensor(abalone.train_labels, dtype=torch.float32)
    w = mod.sample_weights(y)
    assert w is not None and w.shape == y.shape
    assert float(w.mean()) == pytest.approx(1.0, rel=1e-4)
    rare, common = w[y == abalone.train_labels.max()].mean(), w[y == 10.5].mean()
    assert rare > common


def test_fds_rrt_and_rnc_recipes(tmp_path, abalone):
    fds = train(load_config("abalone_lds_fds", TINY), out=tmp_path / "fds", progress=False, verbose=False, data=abalone)
    _check_metrics(fds.metrics)
    state = load_state_dict(fds.run_dir / "checkpoints" / "last.ckpt")
    assert float(state["fds.num_samples_tracked"].sum()) > 0
    # RRT: only the head changes
    rrt = train(
        load_config("abalone_rrt", [*TINY, f"task.init_checkpoint={fds.run_dir}"]),
        out=tmp_path / "rrt",
        progress=False,
        verbose=False,
        data=abalone,
    )
    _check_metrics(rrt.metrics)
    s2 = load_state_dict(rrt.run_dir / "checkpoints" / "last.ckpt")
    bk = [k for k in state if k.startswith("backbone.")]
    assert bk and all(torch.equal(state[k], s2[k]) for k in bk)
    assert not torch.equal(state["head.weight"], s2["head.weight"])
    # Rank-N-Contrast two-stage: pretrained encoder is frozen in stage 2
    rnc = train(
        load_config("abalone_rnc", [*TINY, "task.pretrain_epochs=1"]),
        out=tmp_path / "rnc",
        progress=False,
        verbose=False,
        data=abalone,
    )
    _check_metrics(rnc.metrics)
    pre = load_state_dict(rnc.run_dir / "pretrain" / "last.ckpt")
    fin = load_state_dict(rnc.run_dir / "checkpoints" / "last.ckpt")
    assert all(torch.equal(pre[k], fin[k]) for k in pre if k.startswith("backbone."))


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, abalone):
    cfg = load_config("abalone_vanilla", [*TINY, "trainer.max_epochs=3"])
    with pytest.raises(NonFiniteLossError, match=r"the training loss became nan at epoch 1, global step 4"):
        # epoch 0 = steps 0..2, the weights diverge in epoch 1
        train(cfg, out=tmp_path / "nan", progress=False, verbose=False, data=abalone, callbacks=[NaNAtStep(4)])
    d = tmp_path / "nan"
    meta = json.loads((d / "meta.json").read_text())
    assert meta["status"] == "failed" and meta["failure"] == "NonFiniteLossError" and "nan" in meta["error"]
    ckpt = torch.load(d / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["epoch"] == 0 and ckpt["global_step"] == 3
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values() if v.is_floating_point())
    assert not list((d / "checkpoints").glob(".*tmp*")), "no temporary checkpoint left behind"


def _cli(args, cwd=None):
    """``rankwise ARGS`` in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "rankwise.cli", *args], capture_output=True, text=True, cwd=cwd or ROOT, timeout=300
    )


def _cli_with_fault(kind, step, preset, out, sets):
    """``rankwise train PRESET --out OUT --set ...`` in a subprocess that SIGKILLs/SIGTERMs itself at ``step``."""
    args = [kind, str(step), preset, str(out)] + [a for s in sets for a in ("--set", s)]
    return subprocess.run(
        [sys.executable, "-m", "tests.recipes._faults", *args], capture_output=True, text=True, cwd=ROOT, timeout=300
    )


@pytest.mark.slow
def test_resume_after_sigkill_matches_uninterrupted_run(tmp_path, abalone):
    sets = [*TINY, "trainer.max_epochs=3", "loss.regularizers.ranksim.weight=1.0", "run.seed=3"]
    # LDS weights + FDS (smoothing from epoch 1, statistics refreshed every epoch) + RankSim's random draws
    ref = train(load_config("abalone_lds_fds", sets), out=tmp_path / "ref", progress=False, verbose=False, data=abalone)

    killed = _cli_with_fault("kill", 4, "abalone_lds_fds", tmp_path / "killed", sets)  # mid-epoch 1 (3 steps/epoch)
    assert killed.returncode == -9, killed.stderr[-2000:]
    ck = torch.load(tmp_path / "killed" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ck["epoch"] == 0
    assert not (tmp_path / "killed" / "metrics.json").exists()

    resumed = _cli(["train", "abalone_lds_fds", "--out", str(tmp_path / "killed"), "--resume", "--no-progress"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got = json.loads((tmp_path / "killed" / "metrics.json").read_text())
    assert got["test"] == ref.metrics["test"]
    assert got["val"] == ref.metrics["val"]
    meta = json.loads((tmp_path / "killed" / "meta.json").read_text())
    assert meta["status"] == "completed"


def test_run_dir_protection(tmp_path, abalone):
    from rankwise.recipes.rundir import RunDirError

    cfg = load_config("abalone_vanilla", [*TINY, "trainer.max_epochs=1"])
    train(cfg, out=tmp_path / "r", progress=False, verbose=False, data=abalone)
    with pytest.raises(RunDirError, match="already exists; pass --resume"):
        train(cfg, out=tmp_path / "r", progress=False, verbose=False, data=abalone)
    with pytest.raises(RunDirError, match="cannot --resume"):
        train(cfg, out=tmp_path / "nothing", resume=True, progress=False, verbose=False, data=abalone)
    # --overwrite replaces a rankwise run directory (and keeps nothing of the old run)
    (tmp_path / "r" / ".metrics.json.tmp99").write_text("old")  # a killed write's temporary file
    train(cfg, out=tmp_path / "r", overwrite=True, progress=False, verbose=False, data=abalone)
    assert not (tmp_path / "r" / ".metrics.json.tmp99").exists() and (tmp_path / "r" / "metrics.json").is_file()
    # ... but not one holding a file rankwise did not write
    (tmp_path / "r" / "stale.txt").write_text("mine")
    with pytest.raises(RunDirError, match=r"stale\.txt is a file that rankwise did not write"):
        train(cfg, out=tmp_path / "r", overwrite=True, progress=False, verbose=False, data=abalone)
    assert (tmp_path / "r" / "stale.txt").read_text() == "mine"


def test_checkpoint_writes_are_atomic(tmp_path, monkeypatch):
    import errno

    from rankwise.recipes.rundir import AtomicCheckpointIO, CheckpointError

    io = AtomicCheckpointIO()
    path = tmp_path / "c" / "last.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "epoch": 1}, path)
    assert io.load_checkpoint(path)["epoch"] == 1

    real_save = torch.save

    def crash(obj, f, *a, **k):  # write part of a file, then die
        f.write(b"PK\x03\x04 part of a zip")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(CheckpointError, match=r"cannot save checkpoint .*last\.ckpt: no space left"):
        io.save_checkpoint({"state_dict": {"w": torch.zeros(3)}, "epoch": 2}, path)
    monkeypatch.setattr(torch, "save", real_save)
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]  # no temporary file left
    ck = io.load_checkpoint(path)  # the previous checkpoint is intact
    assert ck["epoch"] == 1 and torch.equal(ck["state_dict"]["w"], torch.ones(3))
