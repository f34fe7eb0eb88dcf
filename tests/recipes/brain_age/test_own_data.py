"""``rankwise train --data participants.csv --target age --method tsan``: NIfTI volumes on the own-data route."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning")
pytest.importorskip("nibabel")
pytest.importorskip("nilearn")
pytest.importorskip("torchio")

import yaml
from typer.testing import CliRunner

from rankwise.cli import app
from rankwise.data.synthetic_mri import make_brain_age_synthetic
from rankwise.recipes.own_data import own_data_config


@pytest.fixture(scope="module")
def cohort(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny synthetic cohort whose label column is called ``age_at_scan`` and whose paths are absolute."""
    root = tmp_path_factory.mktemp("cohort")
    src = make_brain_age_synthetic(root / "vols", n=16, spacing=8.0, seed=3)
    rows = list(csv.DictReader(open(src)))
    out = root / "participants.csv"
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "age_at_scan", "sex", "subject"])
        for r in rows:
            w.writerow([str(root / "vols" / r["path"]), r["age"], r["sex"], r["subject"]])
    return out


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fixed measured step (the route measures one at the configured grid; here, no network runs)."""
    from rankwise.recipes.brain_age import memory

    cost = memory.StepCost("scale_dense", 2400.0, 4 * 10**8, 1.4e-4, (48, 57, 48))
    monkeypatch.setattr(memory, "measure_step", lambda cfg, shape, device="cpu": cost)
    gib = memory.Available(20.0 * 2**30, "MemAvailable")
    monkeypatch.setattr(memory, "available_memory", lambda device="cpu": gib)


def test_a_nifti_csv_selects_the_brain_age_presets(cohort: Path, tmp_path: Path, measured: None) -> None:
    cfg, d = own_data_config(cohort, "age_at_scan", "tsan", options={"cache_dir": str(tmp_path / "c")})
    assert cfg.recipe == "brain_age" and cfg.data.name == "nifti"
    opts = cfg.data.options
    assert opts["csv"] == str(cohort) and opts["target"] == "age_at_scan"
    assert opts["shape"] == [91, 109, 91]  # the preset's grid is kept on the user's data
    assert cfg.model.backbone == "scale_dense" and len(cfg.loss.regularizers) == 2
    # data-derived: 16 subjects -> 11 training rows (seeded split by subject); batch 8 (the smallest the
    # route gives volumes), of which 80% of 20 GiB holds 4 measured steps at 91x109x91: batch 4
    assert d.n_train == 11 and cfg.data.batch_size == 4 and cfg.trainer.max_epochs == d.max_epochs
    assert d.batch_size == 4 and "of 20.0 GiB available" in d.describe() and "per epoch" in d.describe()
    mse, _ = own_data_config(cohort, "age_at_scan", "mse", options={"cache_dir": str(tmp_path / "c")})
    assert mse.loss.regularizers == []
    sfcn, _ = own_data_config(cohort, "age_at_scan", "sfcn", options={"cache_dir": str(tmp_path / "c")})
    assert sfcn.model.backbone == "sfcn"


def test_train_on_a_nifti_csv_from_the_command_line(cohort: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    sets = [
        f"data.options.cache_dir={tmp_path / 'cache'}",
        "data.options.shape=null",
        "model.options={nb_filter: 4, nb_block: 2, use_sex: true}",
        "data.batch_size=4",
        "trainer.max_epochs=1",
        "task.stage2_epochs=1",
        "trainer.num_threads=1",
        "task.montage=0",
    ]
    args = ["train", "--data", str(cohort), "--target", "age_at_scan", "--method", "mse", "--out", str(run)]
    res = CliRunner().invoke(app, [*args, *[a for s in sets for a in ("--set", s)], "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "defaults from" in res.output
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["recipe"] == "brain_age" and metrics["method"] == "tsan"  # both stages, MSE only
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["data"]["name"] == "nifti" and saved["data"]["options"]["target"] == "age_at_scan"
    preds = list(csv.DictReader(open(run / "predictions.csv")))
    ages = {r["subject"]: float(r["age_at_scan"]) for r in csv.DictReader(open(cohort))}
    assert preds and all(abs(float(p["age"]) - ages[p["subject"]]) < 1e-3 for p in preds)


def test_a_bad_method_or_target_is_one_error_line(cohort: Path, tmp_path: Path) -> None:
    base = ["train", "--data", str(cohort), "--set", f"data.options.cache_dir={tmp_path / 'c'}"]
    res = CliRunner().invoke(app, [*base, "--target", "age_at_scan", "--method", "lds"])
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        "error: unknown --method 'lds'; did you mean 'dldl'? valid methods: "
        "cdw_ce, coral, corn, dldl, mean_variance, mse, sfcn, sord, tsan"
    ]
    res = CliRunner().invoke(app, [*base, "--target", "age", "--method", "tsan"])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "age" in lines[0] and "missing column" in lines[0]


def _train(cohort: Path, tmp_path: Path, *sets: str) -> Any:
    small = [
        f"data.options.cache_dir={tmp_path / 'cache'}",
        "data.options.shape=null",
        "model.options={nb_filter: 2, nb_block: 2, use_sex: true}",
        "trainer.max_epochs=1",
        "task.stage2_epochs=1",
        "trainer.num_threads=1",
        "task.montage=0",
        "data.num_workers=0",
        *sets,
    ]
    args = ["train", "--data", str(cohort), "--target", "age_at_scan", "--method", "tsan", "--out", str(tmp_path / "r")]
    return CliRunner().invoke(app, [*args, *[a for s in small for a in ("--set", s)], "--no-progress"])


def test_a_cohort_smaller_than_the_sorters_trains_tsan_with_a_note(cohort: Path, tmp_path: Path) -> None:
    """11 training subjects: the route's batch (8) and the batch of 32 (their one batch, shorter than the
    sorter) have no bundled SoDeep sorter: the Spearman term ranks them with its fallback, said once."""
    for sets in ((), ("data.batch_size=32",)):
        res = _train(cohort, tmp_path / str(len(sets)), *sets)
        assert res.exit_code == 0, res.output
        notes = [ln for ln in res.output.splitlines() if ln.startswith("note:")]
        assert len(notes) == 1 and "32, 64, 128" in notes[0] and "'isotonic'" in notes[0], res.output
        length = "11" if sets else "8"
        assert f"training batches of {length} rank with its fallback" in notes[0]
        assert (tmp_path / str(len(sets)) / "r" / "metrics.json").is_file()


def test_a_sodeep_term_without_a_fallback_is_one_error_line(cohort: Path, tmp_path: Path) -> None:
    res = _train(cohort, tmp_path, "data.batch_size=4", "loss.regularizers.spearman.options.fallback=null")
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert lines[-1].startswith("error: `loss.regularizers.spearman.options.ranker` 'sodeep'"), res.output
    assert "data.batch_size=4 x 1 device(s) = 4" in lines[-1] and "fallback=isotonic" in lines[-1]


def test_the_defaults_line_shows_the_values_set(cohort: Path, tmp_path: Path) -> None:
    res = _train(cohort, tmp_path, "data.batch_size=4", "trainer.max_epochs=2", "report.many_shot=5")
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if ln.startswith("defaults from"))
    assert "batch size 4 (--set; the data's 8)" in line and "2 epochs (--set; the data's 200)" in line
    assert "many-shot > 5 (--set; the data's" in line
    assert re.search(r"about [\d.]+ (s|min|h) per epoch", line) and "GiB available" in line, line


def test_a_step_over_the_memory_is_one_error_line_before_training(
    cohort: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rankwise.recipes.brain_age import memory

    tiny = memory.Available(0.5 * 2**30, "MemAvailable")
    monkeypatch.setattr(memory, "available_memory", lambda device="cpu": tiny)
    res = _train(cohort, tmp_path, "data.batch_size=4")
    assert res.exit_code == 2, res.output
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in res.output, res.output
    assert "needs about" in errors[0] and "0.5 GiB is available (MemAvailable)" in errors[0]
    assert "data.batch_size=4" in errors[0] and "lower data.options.shape" in errors[0]
    assert "or set trainer.memory_check=false to train anyway" in errors[0]
    assert not list((tmp_path / "r").rglob("*.ckpt"))  # refused before training


def test_memory_check_false_trains_anyway(cohort: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rankwise.recipes.brain_age import memory

    tiny = memory.Available(0.5 * 2**30, "MemAvailable")
    monkeypatch.setattr(memory, "available_memory", lambda device="cpu": tiny)
    res = _train(cohort, tmp_path, "data.batch_size=4", "trainer.memory_check=false")
    assert res.exit_code == 0, res.output
    assert "error:" not in res.output and list((tmp_path / "r").rglob("*.ckpt"))


def test_the_label_column_is_an_option(cohort: Path, tmp_path: Path) -> None:
    from rankwise.data.nifti import load_nifti_csv, looks_like_nifti_csv

    data = load_nifti_csv(str(cohort), target="age_at_scan", cache_dir=str(tmp_path))
    ages = sorted(float(r["age_at_scan"]) for r in csv.DictReader(open(cohort)))
    got = sorted([*data.train_labels, *data.val_labels, *data.test_labels])
    assert data.label_name == "age_at_scan" and got == pytest.approx(ages)
    assert looks_like_nifti_csv(cohort)
    table = tmp_path / "table.csv"
    table.write_text("path,age\nimg.png,40\n")
    assert not looks_like_nifti_csv(table) and not looks_like_nifti_csv(tmp_path / "missing.csv")


def test_a_preset_grid_that_crops_the_users_volumes_is_a_warning(cohort: Path, tmp_path: Path) -> None:
    """A ``shape`` whose centred crop cuts into the brains (a preset's grid on volumes of another voxel
    size) reaches the run as a DataDefaultsWarning (the CLI's ``warning:`` line) naming the option."""
    from rankwise.recipes.common import DataDefaultsWarning
    from rankwise.recipes.registry import get_recipe
    from rankwise.recipes.rundir._lifecycle import load_data

    options = {"cache_dir": str(tmp_path / "c"), "shape": [8, 8, 8]}
    cfg, _ = own_data_config(cohort, "age_at_scan", "mse", options=options)
    with pytest.warns(DataDefaultsWarning, match=r"`data\.options\.shape` \[8, 8, 8\] keeps less than 90%"):
        data = load_data(cfg, get_recipe(cfg.recipe))
    assert data.train[0][0]["volume"].shape == (1, 8, 8, 8)
