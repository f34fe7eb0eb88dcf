"""The Trainer of a run (``rankwise.recipes.rundir._trainer``) under ``--resume``: CSV logs that keep every
epoch once, and the config edits a resume cannot honour refused in one error."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

pytest.importorskip("lightning")
pytest.importorskip("sklego")

import lightning as L
import yaml

from rankwise.recipes import load_config
from rankwise.recipes.config import ConfigError
from rankwise.recipes.runner import train
from tests.recipes._faults import NaNAtStep
from tests.recipes.test_recipe_training import TINY

#: 3 steps per epoch, a row per step (TINY logs every step)


@pytest.fixture(scope="module")
def abalone():
    from rankwise.data import get_dataset

    return get_dataset("abalone", per_label=10, seed=0)


def _rows(log: Path) -> list[dict[str, str]]:
    with open(log, newline="") as f:
        return list(csv.DictReader(f))


def _epochs(log: Path, column: str = "val/mae") -> list[int]:
    """The epochs of the log's rows holding ``column`` (``val/mae``: one row per epoch)."""
    return [int(float(r["epoch"])) for r in _rows(log) if r.get(column)]


def _steps(log: Path, column: str) -> list[int]:
    return [int(float(r["step"])) for r in _rows(log) if r.get(column)]


def _edit(run: Path, section: str, key: str, value) -> None:
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg[section][key] = value
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


def _stopped(tmp_path: Path, abalone, preset: str = "abalone_vanilla", sets=(), step: int = 7) -> Path:
    """A run stopped by a NaN in epoch 2 of the main stage (last.ckpt: epoch 1 done), its log holding
    the rows of that unfinished epoch."""
    run = tmp_path / "run"
    cfg = load_config(preset, [*TINY, "trainer.max_epochs=4", *sets])
    with pytest.raises(Exception, match="became nan"):
        train(cfg, out=run, progress=False, verbose=False, data=abalone, callbacks=[NaNAtStep(step)])
    log = run / "logs" / "metrics.csv"
    assert _epochs(log) == [0, 1] and 2 in _epochs(log, "train/loss_step")
    return run


@pytest.mark.parametrize(
    ("preset", "sets"), [("abalone_vanilla", ()), ("abalone_rnc", ("task.pretrain_epochs=1",))], ids=["dir", "rnc"]
)
def test_a_resumed_stage_keeps_every_epoch_of_its_log_once(tmp_path, abalone, preset, sets):
    run = _stopped(tmp_path, abalone, preset, sets)
    train(None, out=run, resume=True, progress=False, verbose=False, data=abalone)
    log = run / "logs" / "metrics.csv"
    assert _epochs(log) == [0, 1, 2, 3]
    steps = _steps(log, "train/loss_step")
    assert steps == sorted(set(steps)) and len(steps) == 12  # every step once, in order
    if preset == "abalone_rnc":  # the pretraining stage, skipped as done, keeps its log
        assert _epochs(run / "logs" / "pretrain" / "metrics.csv", "pretrain/loss_epoch") == [0]


def test_extending_a_finished_run_keeps_the_rows_of_its_earlier_epochs(tmp_path, abalone):
    run = tmp_path / "run"
    train(
        load_config("abalone_vanilla", [*TINY, "trainer.max_epochs=2"]),
        out=run,
        progress=False,
        verbose=False,
        data=abalone,
    )
    _edit(run, "trainer", "max_epochs", 3)
    train(None, out=run, resume=True, progress=False, verbose=False, data=abalone)
    assert _epochs(run / "logs" / "metrics.csv") == [0, 1, 2]


class _FailAtStart(L.Callback):
    def on_train_start(self, trainer, pl_module):
        raise RuntimeError("failed at once")


def test_a_resume_that_fails_at_once_leaves_the_log_as_it_was(tmp_path, abalone):
    run = _stopped(tmp_path, abalone)
    log = run / "logs" / "metrics.csv"
    before = log.read_bytes()
    with pytest.raises(RuntimeError, match="failed at once"):
        train(None, out=run, resume=True, progress=False, verbose=False, data=abalone, callbacks=[_FailAtStart()])
    assert log.read_bytes() == before
    _edit(run, "trainer", "max_epochs", 1)  # below the 2 epochs last.ckpt has trained
    with pytest.raises(ConfigError, match=r"`trainer.max_epochs` is 1 now, but checkpoints/last.ckpt has trained 2"):
        train(None, out=run, resume=True, progress=False, verbose=False, data=abalone)
    assert log.read_bytes() == before


@pytest.mark.parametrize(
    ("section", "key", "value", "match"),
    [
        ("optimizer", "lr", 0.5, r"`optimizer.lr` is 0.5 now, but was 0.003 when checkpoints/last.ckpt was written"),
        ("loss", "kind", "mse", r"`loss.kind` is 'mse' now, but was 'l1'"),
        ("data", "batch_size", 64, r"`data.batch_size` is 64 now, but was 128"),
    ],
)
def test_an_edit_a_resume_cannot_honour_is_refused(tmp_path, abalone, section, key, value, match):
    run = _stopped(tmp_path, abalone)
    log = run / "logs" / "metrics.csv"
    before = log.read_bytes()
    _edit(run, section, key, value)
    with pytest.raises(ConfigError, match=match):
        train(None, out=run, resume=True, progress=False, verbose=False, data=abalone)
    assert log.read_bytes() == before


def test_precision_given_to_a_resume_is_refused_unless_it_is_the_runs(tmp_path, abalone):
    run = _stopped(tmp_path, abalone)
    with pytest.raises(ConfigError, match=r"`trainer.precision` is '64-true' now, but was '32-true'"):
        train(
            None,
            out=run,
            resume=True,
            progress=False,
            verbose=False,
            data=abalone,
            trainer_overrides={"precision": "64-true"},
        )
    res = train(
        None,
        out=run,
        resume=True,
        progress=False,
        verbose=False,
        data=abalone,
        trainer_overrides={"precision": "32-true"},
    )
    assert res.metrics["test"]


def test_edits_a_resume_honours_are_accepted(tmp_path, abalone):
    run = _stopped(tmp_path, abalone)
    _edit(run, "data", "num_workers", 0)
    _edit(run, "report", "plots", False)
    _edit(run, "trainer", "log_every_n_steps", 5)
    res = train(None, out=run, resume=True, progress=False, verbose=False, data=abalone)
    assert _epochs(run / "logs" / "metrics.csv") == [0, 1, 2, 3] and res.metrics["test"]


def test_the_random_state_a_checkpoint_records_is_restored_exactly(tmp_path):
    import random

    import numpy as np
    import torch

    from rankwise.recipes.rundir import load_checkpoint
    from rankwise.recipes.rundir._trainer import rng_state, set_rng_state

    random.gauss(0, 1)  # a cached Gaussian in Python's state too
    torch.save({"rankwise_rng": rng_state()}, tmp_path / "c.ckpt")
    want = (torch.rand(3).tolist(), np.random.rand(3).tolist(), random.random(), random.gauss(0, 1))  # noqa: NPY002
    torch.rand(100), np.random.rand(7), random.random()  # noqa: NPY002
    set_rng_state(load_checkpoint(tmp_path / "c.ckpt")["rankwise_rng"])  # weights-only
    assert (torch.rand(3).tolist(), np.random.rand(3).tolist(), random.random(), random.gauss(0, 1)) == want  # noqa: NPY002
