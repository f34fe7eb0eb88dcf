"""Runs of a comparison trained by forked processes at once, and checkpoints written by a thread: the
same results and files as one run after the other, written synchronously."""

from __future__ import annotations

import concurrent.futures
import errno
import json
import os
import sys

import pytest
import torch

from rankwise.recipes import load_config
from rankwise.recipes.rundir import CheckpointError
from rankwise.recipes.rundir import _files as files_module
from rankwise.recipes.rundir._files import AtomicCheckpointIO
from rankwise.recipes.runner import compare, parallel_jobs

QUICK = [
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=3",
    "report.plots=false",
    "report.tsne=false",
    "trainer.enable_progress_bar=false",
]


def _metrics(res):
    return {m: [{k: v for k, v in r.items() if k != "train_seconds"} for r in runs] for m, runs in res.results.items()}


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forked workers: Linux only")
def test_runs_trained_at_once_give_the_results_of_one_after_the_other(tmp_path):
    seen: dict[str, list[tuple[str, int]]] = {"one": [], "two": []}
    res = {}
    for label, jobs in (("one", 1), ("two", 2)):
        res[label] = compare(
            ["abalone_vanilla", "abalone_lds"],
            seeds=[0, 1],
            out=tmp_path / label,
            overrides=QUICK,
            jobs=jobs,
            on_run=lambda m, s, r, label=label: seen[label].append((m, s)),
        )
    assert _metrics(res["one"]) == _metrics(res["two"])
    assert seen["one"] == seen["two"] == [(m, s) for m in ("abalone_vanilla", "abalone_lds") for s in (0, 1)]
    for method in ("abalone_vanilla", "abalone_lds"):
        for seed in (0, 1):
            a, b = (tmp_path / k / "runs" / method / f"seed{seed}" for k in ("one", "two"))
            assert json.loads((b / "meta.json").read_text())["status"] == "completed"
            wa = torch.load(a / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
            wb = torch.load(b / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
            assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert (tmp_path / "two" / "report.md").is_file()


def test_parallel_jobs_divides_the_cores_by_the_threads_of_a_run(monkeypatch):
    import rankwise.recipes.runner as runner

    monkeypatch.setattr(runner, "usable_cores", lambda: 4)
    one = load_config("abalone_vanilla", ["trainer.num_threads=1"])
    two = load_config("abalone_vanilla", ["trainer.num_threads=2"])
    unset = load_config("abalone_vanilla", ["trainer.num_threads=null"])
    expect_fork = sys.platform.startswith("linux")
    assert parallel_jobs([one, one]) == (4 if expect_fork else 1)
    assert parallel_jobs([one, two]) == (2 if expect_fork else 1)
    assert parallel_jobs([one, unset]) == 1  # a run without a thread count takes every core
    assert parallel_jobs([]) == 1


CKPT = {"state_dict": {"w": torch.arange(20_000, dtype=torch.float32)}, "epoch": 3}


def test_a_background_checkpoint_holds_the_state_at_the_call(tmp_path):
    io = AtomicCheckpointIO(background=True)
    w = torch.zeros(5)
    io.save_checkpoint({"state_dict": {"w": w}, "epoch": 0}, tmp_path / "last.ckpt")
    w += 1  # training goes on while the file is written
    io.save_checkpoint({"state_dict": {"w": w}, "epoch": 1}, tmp_path / "best.ckpt")
    io.teardown()
    assert sorted(os.listdir(tmp_path)) == ["best.ckpt", "last.ckpt"]  # no temporary file left
    assert torch.equal(torch.load(tmp_path / "last.ckpt", weights_only=True)["state_dict"]["w"], torch.zeros(5))
    assert torch.load(tmp_path / "best.ckpt", weights_only=True)["epoch"] == 1


def test_a_failed_background_write_is_raised_by_the_next_save_or_the_teardown(tmp_path, monkeypatch):
    real = open

    def failing(p, mode):
        fh = real(p, mode)
        fh.close()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files_module, "open", failing, raising=False)
    io = AtomicCheckpointIO(background=True)
    io.save_checkpoint(CKPT, tmp_path / "last.ckpt")  # returns before the write
    concurrent.futures.wait(io._pending)  # the write has failed by the next save
    with pytest.raises(CheckpointError, match=r"cannot save checkpoint .*last\.ckpt: no space left"):
        io.save_checkpoint(CKPT, tmp_path / "last.ckpt")
    io.save_checkpoint(CKPT, tmp_path / "best.ckpt")
    with pytest.raises(CheckpointError, match=r"best\.ckpt: no space left"):
        io.teardown()
    assert os.listdir(tmp_path) == []
