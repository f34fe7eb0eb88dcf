"""`rankwise train --resume` resolves the run's config once: the config saved in the run directory, with the
hardware options applied to it, never the preset again."""

from __future__ import annotations

import pytest

pytest.importorskip("lightning")
pytest.importorskip("sklego")

from typer.testing import CliRunner

from rankwise.cli import app
from rankwise.recipes import config as config_module
from rankwise.recipes import runner
from tests.cli_helpers import TINY


def _sets(extra=()):
    return [a for s in [*TINY, "trainer.max_epochs=1", *extra] for a in ("--set", s)]


@pytest.fixture
def calls(monkeypatch):
    """Every config load (its source) and every config a run directory yields."""
    seen: dict[str, list] = {"load_config": [], "run_config": []}
    real_load, real_run = config_module.load_config, runner.load_run_config

    def load_config(source=None, overrides=None, *a, **kw):
        seen["load_config"].append(source if isinstance(source, str) else type(source).__name__)
        return real_load(source, overrides, *a, **kw)

    def load_run_config(*a, **kw):
        cfg = real_run(*a, **kw)
        seen["run_config"].append(cfg)
        return cfg

    monkeypatch.setattr(config_module, "load_config", load_config)  # every entry point ends in it
    monkeypatch.setattr(runner, "load_run_config", load_run_config)
    return seen


def test_resume_reads_the_saved_config_once_with_the_hardware_options(tmp_path, calls):
    run = tmp_path / "run"
    r = CliRunner().invoke(app, ["train", "abalone_vanilla", *_sets(), "--out", str(run), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert calls["load_config"] == ["abalone_vanilla"]
    calls["load_config"].clear()
    args = ["train", "abalone_vanilla", "--resume", "--out", str(run), "--no-progress", "--accelerator", "cpu"]
    r = CliRunner().invoke(app, [*args, "--devices", "1", "--strategy", "auto"])
    assert r.exit_code == 0, r.output
    assert calls["load_config"] == ["dict"]  # the saved config.yaml, read once; the preset is not loaded
    (cfg,) = calls["run_config"]
    t = cfg.trainer
    assert (t.accelerator, t.devices, t.strategy, t.max_epochs, cfg.model.options["hidden"]) == (
        "cpu",
        1,
        "auto",
        1,
        [16],
    )


def test_resume_without_out_continues_the_directory_the_preset_names(tmp_path, calls, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["train", "abalone_vanilla", *_sets(["run.name=mine"]), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "runs" / "mine" / "config.yaml").is_file()
    calls["load_config"].clear()
    # --set is ignored by --resume (a warning says so): the preset's own run directory is resumed
    r = CliRunner().invoke(app, ["train", "abalone_vanilla", "--resume", "--no-progress"])
    assert r.exit_code == 2 and "runs/abalone_vanilla" in r.output and "not a run directory" in r.output
    (tmp_path / "runs" / "mine").rename(tmp_path / "runs" / "abalone_vanilla")
    r = CliRunner().invoke(app, ["train", "abalone_vanilla", "--resume", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert calls["run_config"][-1].run.name == "mine"  # the saved config, not the preset's


def test_resume_refuses_a_config_of_another_run_and_a_precision_the_run_did_not_train_at(tmp_path):
    from tests.cli_helpers import one_error_line

    run = tmp_path / "rnc"
    sets = _sets(["task.pretrain_epochs=1"])
    r = CliRunner().invoke(app, ["train", "abalone_rnc", *sets, "--out", str(run), "--no-progress"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["train", "abalone_lds", "--resume", "--out", str(run), "--no-progress"])
    line = one_error_line(r)
    assert "holds a run of recipe 'rnc'" in line and "not of recipe 'dir'" in line
    r = CliRunner().invoke(app, ["train", "abalone_rnc", "--resume", "--out", str(run), "--precision", "64-true"])
    assert "`trainer.precision` is '64-true' now, but was '32-true'" in one_error_line(r)
    args = ["train", "abalone_rnc", "--resume", "--out", str(run), "--precision", "32-true", "--no-progress"]
    r = CliRunner().invoke(app, args)  # the run's own precision: nothing left to train, evaluated again
    assert r.exit_code == 0, r.output
