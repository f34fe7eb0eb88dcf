"""``--overwrite`` of a run directory (``rankwise.recipes.rundir._directory``): it deletes only the files
rankwise writes there, and refuses (one error line, nothing deleted) a directory holding anything else."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("typer")
pytest.importorskip("lightning")
pytest.importorskip("sklego")

from typer.testing import CliRunner

from rankwise.cli import app
from rankwise.recipes.rundir import RunDir, RunDirError, is_rankwise_run_dir
from rankwise.recipes.rundir._directory import PLOT_NAMES, rankwise_files
from tests.cli_helpers import TINY, one_error_line

SRC = Path(__file__).resolve().parents[3] / "src" / "rankwise"
runner = CliRunner()


def _train_args(out: Path, *extra: str) -> list[str]:
    sets = [a for s in [*TINY, "report.plots=true"] for a in ("--set", s)]
    return ["train", "abalone_vanilla", *sets, "--out", str(out), "--no-progress", *extra]


def _snapshot(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root``: a file's bytes, a folder as ``"dir"``, a link as its target."""
    out: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = "-> " + str(p.readlink())
        elif p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = p.read_bytes()
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("trained") / "run"
    r = runner.invoke(app, _train_args(run), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return run


@pytest.fixture
def run(trained, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(trained, copy, symlinks=True)
    return copy


def test_a_trained_run_holds_only_rankwise_files(trained):
    files, folders = rankwise_files(trained)
    assert {"config.yaml", "meta.json", "data.json", "metrics.json"} <= {p.name for p in files}
    assert any(p.parent.name == "plots" for p in files)  # the plots it drew are its own
    assert trained / "checkpoints" in folders and is_rankwise_run_dir(trained)


@pytest.mark.parametrize("user_file", ["MY_NOTES.txt", "plots/mine/keep.txt", "checkpoints/my.ckpt", "logs/x.csv"])
def test_overwrite_refuses_a_run_holding_a_file_of_the_user(run, user_file):
    (run / user_file).parent.mkdir(parents=True, exist_ok=True)
    (run / user_file).write_text("mine")
    before = _snapshot(run)
    line = one_error_line(runner.invoke(app, _train_args(run, "--overwrite"), catch_exceptions=False))
    first = user_file if user_file.count("/") < 2 else str(Path(user_file).parent)  # plots/mine: a folder
    assert f": {first} is a " in line and "did not write" in line and "choose another --out" in line, line
    assert _snapshot(run) == before  # nothing deleted, nothing written


def test_overwrite_refuses_a_symlink_and_leaves_its_target(run, tmp_path):
    target = tmp_path / "outside"
    (target / "data").mkdir(parents=True)
    (target / "data" / "scan.nii").write_text("precious")
    (run / "plots" / "linked").symlink_to(target, target_is_directory=True)
    (run / "checkpoints" / "best.ckpt").unlink()
    (run / "checkpoints" / "best.ckpt").symlink_to(target / "data" / "scan.nii")  # a rankwise name, as a link
    before = _snapshot(run)
    line = one_error_line(runner.invoke(app, _train_args(run, "--overwrite"), catch_exceptions=False))
    assert "checkpoints/best.ckpt is a symbolic link" in line
    assert _snapshot(run) == before and (target / "data" / "scan.nii").read_text() == "precious"


def test_overwrite_replaces_a_run_of_only_rankwise_files(run):
    # files of the old run that this one does not write again: a killed write's temporary file, a stage
    # folder, an evaluation on changed data, a prediction
    (run / ".metrics.json.tmp4242").write_text("half")
    (run / "pretrain").mkdir()
    (run / "pretrain" / "last.ckpt").write_bytes(b"old")
    (run / "pretrain" / "done").write_text("[1.0]")
    (run / "changed_data" / "plots").mkdir(parents=True)
    (run / "changed_data" / "metrics.json").write_text("{}")
    (run / "changed_data" / "plots" / "tsne.png").write_bytes(b"png")
    (run / "predictions").mkdir()
    (run / "predictions" / "new.csv").write_text("prediction\n1\n")
    r = runner.invoke(app, _train_args(run, "--overwrite"), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    for gone in (".metrics.json.tmp4242", "pretrain", "changed_data", "predictions"):
        assert not (run / gone).exists(), gone
    assert json.loads((run / "meta.json").read_text())["status"] == "completed"
    assert (run / "checkpoints" / "best.ckpt").is_file() and (run / "metrics.json").is_file()


@pytest.mark.parametrize(
    "meta",
    [
        {"rankwise_version": "0.1.0"},
        {"rankwise_version": "0.1.0", "status": "completed"},
        {"rankwise_version": 1, "command": "x", "torch_version": "2", "started": "2026"},
    ],
)
def test_a_forged_meta_json_is_not_a_run_directory(tmp_path, meta):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "meta.json").write_text(json.dumps(meta))
    (victim / "config.yaml").write_text("run: {}\n")
    (victim / "thesis.tex").write_text("keep me")
    assert not is_rankwise_run_dir(victim)
    with pytest.raises(RunDirError, match="not a rankwise run directory"):
        RunDir.open(victim, resume=False, overwrite=True)
    line = one_error_line(runner.invoke(app, _train_args(victim, "--overwrite"), catch_exceptions=False))
    assert "not a rankwise run directory" in line
    assert (victim / "thesis.tex").read_text() == "keep me" and (victim / "meta.json").is_file()


def test_a_meta_json_without_its_config_is_not_a_run_directory(trained, tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    shutil.copy(trained / "meta.json", d / "meta.json")
    assert not is_rankwise_run_dir(d)
    shutil.copy(trained / "config.yaml", d / "config.yaml")
    assert is_rankwise_run_dir(d)


def test_every_plot_a_recipe_draws_is_in_the_layout():
    """``PLOT_NAMES`` lists each ``*.png`` name the recipes write (a new plot missing from it would make
    ``--overwrite`` refuse that recipe's runs)."""
    names = set()
    for py in (SRC / "recipes").rglob("*.py"):
        names |= set(re.findall(r"""["']([a-z][a-z_]*\.png)["']""", py.read_text()))
    assert "tsne.png" in names and "training_curves.png" in names  # the scan finds them
    assert names - PLOT_NAMES == set()
