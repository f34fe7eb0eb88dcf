"""The ``rankwise`` command line, through typer's CliRunner (tiny abalone runs)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("typer")
pytest.importorskip("lightning")
pytest.importorskip("sklego")

from typer.testing import CliRunner

from rankwise.cli import ENV_DEMO_QUICK, app
from tests.cli_helpers import TINY as CLI_TINY

TINY = [*CLI_TINY, "trainer.log_every_n_steps=1"]


def _sets(extra=()):
    out = []
    for s in [*TINY, *extra]:
        out += ["--set", s]
    return out


runner = CliRunner()


def invoke(args, **kw):
    return runner.invoke(app, args, catch_exceptions=False, **kw)


def test_help_lists_every_command():
    r = invoke(["--help"])
    assert r.exit_code == 0
    for cmd in ["demo", "train", "evaluate", "compare", "data", "presets", "config", "sodeep"]:
        assert cmd in r.output
    r = invoke(["train", "--help"])
    for opt in ["--set", "--resume", "--devices", "--accelerator", "--strategy", "--num-nodes", "--out"]:
        assert opt in r.output
    assert invoke(["sodeep", "--help"]).exit_code == 0


def test_version_prints_the_package_version():
    import rankwise

    r = invoke(["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"rankwise {rankwise.__version__}"
    assert "--version" in invoke(["--help"]).output
    r = subprocess.run([sys.executable, "-m", "rankwise.cli", "--version"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == f"rankwise {rankwise.__version__}", r.stderr


def test_console_script_entry_point():
    r = subprocess.run(
        [sys.executable, "-c", "from rankwise.cli import main; main(['presets'])"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and "abalone_vanilla" in r.stdout


def test_config_command_lists_the_fields_of_the_schema(monkeypatch):
    from rankwise.recipes import config_fields

    monkeypatch.delenv("COLUMNS", raising=False)  # a log that is not a terminal: rows are not wrapped

    r = invoke(["config", "dir"])
    assert r.exit_code == 0, r.output
    rows = [ln for ln in r.output.splitlines() if "task.fds.momentum" in ln]
    assert len(rows) == 1 and "float" in rows[0] and "0.9" in rows[0] and ">= 0, <= 1" in rows[0], r.output
    assert all(f.key in r.output for f in config_fields("dir"))
    assert "task.lds" not in invoke(["config"]).output  # the shared sections only
    assert "dict[str, Any]" in r.output and "list[RegularizerConfig]" in r.output  # no markup eaten
    bad = invoke(["config", "dri"])
    lines = bad.output.strip().splitlines()
    assert bad.exit_code == 2 and len(lines) == 1, bad.output
    assert lines[0].startswith("error: `recipe`: unknown recipe 'dri'; did you mean 'dir'"), bad.output


def test_presets_and_data_commands(tmp_path):
    r = invoke(["presets"])
    assert r.exit_code == 0 and "agedb_dir_ranksim" in r.output and "abalone_lds" in r.output
    r = invoke(["data", "list"])
    assert r.exit_code == 0 and "abalone" in r.output
    png = tmp_path / "hist.png"
    r = invoke(["data", "show", "abalone", "--option", "per_label=10", "--plot", str(png)])
    assert r.exit_code == 0, r.output
    assert "train/val/test" in r.output and "many" in r.output and "few" in r.output
    assert png.is_file() and png.stat().st_size > 1000
    r = invoke(["data", "show", "abalon"])
    assert r.exit_code == 2 and "abalone" in r.output


def test_train_evaluate_compare(tmp_path):
    run = tmp_path / "run"
    r = invoke(
        [
            "train",
            "abalone_ranksim",
            *_sets(),
            "--out",
            str(run),
            "--no-progress",
            "--accelerator",
            "cpu",
            "--devices",
            "1",
            "--precision",
            "32-true",
        ]
    )
    assert r.exit_code == 0, r.output
    assert "MAE" in r.output and "few" in r.output
    m = json.loads((run / "metrics.json").read_text())
    cfg_text = (run / "config.yaml").read_text()
    assert "max_epochs: 2" in cfg_text and "ranksim" in cfg_text and "recipe: dir" in cfg_text
    assert "accelerator: cpu" in cfg_text and "devices: 1" in cfg_text
    meta = json.loads((run / "meta.json").read_text())
    assert meta["status"] == "completed" and "git_hash" in meta

    r = invoke(["evaluate", str(run), "--no-plots"])
    assert r.exit_code == 0, r.output
    assert json.loads((run / "metrics.json").read_text())["test"] == m["test"]

    # existing run dirs are compared as they are; presets are trained per seed
    out = tmp_path / "cmp"
    r = invoke(["compare", str(run), "abalone_vanilla", "--seeds", "0", *_sets(), "--out", str(out)])
    assert r.exit_code == 0, r.output
    report = (out / "report.md").read_text()
    assert "| method |" in report and "abalone_vanilla" in report and "run" in report
    assert (out / "plots" / "shots.png").is_file()
    assert (out / "runs" / "abalone_vanilla" / "seed0" / "metrics.json").is_file()
    assert "Every config trained with `--set model.options.hidden=" in report  # the overrides it ran with
    assert json.loads((out / "results.json").read_text())["overrides"] == TINY

    # a finished run of the comparison is reused only for the same config: other settings are refused
    before = (out / "runs" / "abalone_vanilla" / "seed0" / "metrics.json").read_bytes()
    again = ["compare", "abalone_vanilla", "--seeds", "0", "--out", str(out)]
    r = invoke([*again, *_sets(["trainer.max_epochs=3"])])
    assert r.exit_code == 2
    assert "`trainer.max_epochs` 2 there, 3 now" in r.output and "--overwrite" in r.output
    assert (out / "runs" / "abalone_vanilla" / "seed0" / "metrics.json").read_bytes() == before
    r = invoke([*again, *_sets(["trainer.num_threads=2"])])  # hardware only: reused as it is
    assert r.exit_code == 0, r.output
    assert (out / "runs" / "abalone_vanilla" / "seed0" / "metrics.json").read_bytes() == before


def test_bad_config_exits_with_a_named_key(tmp_path):
    r = invoke(["train", "abalone_vanilla", "--set", "optimizer.lrr=0.1", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2
    assert "optimizer.lrr" in r.output and "did you mean 'lr'" in r.output
    r = invoke(["train", "no_such_preset"])
    assert r.exit_code == 2 and "rankwise presets" in r.output
    r = invoke(["evaluate", str(tmp_path)])
    assert r.exit_code == 2 and "not a run directory" in r.output


def test_nan_loss_exits_with_a_clear_message(tmp_path):
    # a learning rate that makes the weights overflow after the first step: the loss becomes inf/nan
    r = invoke(
        ["train", "abalone_vanilla", *_sets(["optimizer.lr=1e30"]), "--out", str(tmp_path / "nan"), "--no-progress"]
    )
    assert r.exit_code == 1
    text = " ".join(r.output.split())
    assert "error: the training loss became" in text and "Traceback" not in text
    assert json.loads((tmp_path / "nan" / "meta.json").read_text())["status"] == "failed"


@pytest.mark.slow
def test_demo_quick_mode(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_DEMO_QUICK, "1")
    out = tmp_path / "demo"
    r = invoke(["demo", "--out", str(out)])
    assert r.exit_code == 0, r.output
    for label in ["L1 (vanilla)", "+LDS (sqrt_inv)", "Balanced MSE (BMC)"]:
        assert label in r.output
    assert "RankSim" not in r.output  # it does not help abalone at any weight (docs/results.md section 6)
    assert "[1/3 runs, " in r.output and "ETA" in r.output and "[3/3 runs, " in r.output  # a line per run
    for col in ["MAE", "GM", "many", "medium", "few"]:
        assert col in r.output
    report = (out / "report.md").read_text()
    assert "Total demo time" in report and "abalone_balanced_mse" in report
    assert (out / "plots" / "per_label_mae.png").is_file()
    assert (out / "runs" / "abalone_vanilla" / "seed0" / "plots" / "similarity.png").is_file()


def test_result_tables_are_not_cut_in_an_80_column_log(capsys, monkeypatch) -> None:
    """The many/medium/few table fits a plain 80-column log; a cell is never cut to '1.35 ± 0.…'."""
    from rankwise import cli

    monkeypatch.setenv("COLUMNS", "80")  # what rich assumes for a log that is not a terminal

    header = ["MAE", "n", "all", "many", "medium", "few"]
    rows = [["Balanced MSE (BMC)", "3", "2.48 ± 0.03", "1.51 ± 0.01", "2.54 ± 0.07", "5.08 ± 0.04"]]
    cli._print_tables([(header, rows)], "abalone")
    out = capsys.readouterr().out
    assert "…" not in out
    for cell in rows[0]:
        assert cell in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_config_of_a_recipe_lists_the_options_inside_its_dict_fields(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    r = invoke(["config", "brain_age"])
    assert r.exit_code == 0, r.output
    keys = {ln.split("│")[1].strip() for ln in r.output.splitlines() if ln.count("│") > 2}
    for key in (
        "data.options.shape",
        "data.options.spacing",
        "model.options.nb_filter",
        "model.options.nb_block",
        "loss.regularizers.spearman.options.ranker",
        "loss.regularizers.spearman.options.fallback",
        "loss.regularizers.pairwise_difference.options.pairs",
    ):
        assert key in keys, key
    row = next(ln for ln in r.output.splitlines() if "model.options.nb_filter " in ln)
    assert "int" in row and "8" in row and "scale_dense" in row


def test_presets_show_prints_yaml_that_reads_back_as_the_preset():
    import yaml

    from rankwise.recipes import load_config
    from rankwise.recipes.config import load_raw

    for name in ("brain_age_tsan", "brain_age_tsan_synthetic", "abalone_lds"):
        r = invoke(["presets", "show", name])
        assert r.exit_code == 0, r.output
        assert yaml.safe_load(r.output) == load_raw(name)
        assert load_config(yaml.safe_load(r.output)).recipe == load_config(name).recipe
    bad = invoke(["presets", "show", "brain_age_tsn"])
    lines = bad.output.strip().splitlines()
    assert bad.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), bad.output
    assert "brain_age_tsan" in lines[0]


def test_progress_lines_of_a_comparison_estimate_the_time_left() -> None:
    from rankwise.cli import _eta, _runs_line

    assert _runs_line(1, 4, 10.0) == "[1/4 runs, 10 s, ETA 30 s]"
    assert _runs_line(3, 4, 150.0) == "[3/4 runs, 150 s, ETA 50 s]"
    assert _runs_line(4, 4, 80.4) == "[4/4 runs, 80 s, done]"
    assert _eta(125.0) == "ETA 2 min 5 s" and _eta(-1.0) == "ETA 0 s"
