"""End to end, at tiny sizes: a short run's site and group tables on a synthetic cohort with patients, and
``rankwise predict RUN --data RAW.csv --preprocess-out DIR`` for a run trained on ``rankwise preprocess`` output."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("lightning")
pytest.importorskip("nibabel")
pytest.importorskip("nilearn")
pytest.importorskip("torchio")

from typer.testing import CliRunner

from rankwise.brain_age import gap_by_site
from rankwise.cli import app
from tests.cli_helpers import one_error_line

TINY = [
    "model.options={nb_filter: 8, nb_block: 2, use_sex: true}",
    "data.options.shape=null",
    "data.batch_size=8",
    "trainer.max_epochs=1",
    "task.stages=1",
    "trainer.num_threads=1",
    "trainer.enable_progress_bar=false",
    "report.plots=false",
]


def _invoke(*args: str) -> str:
    res = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.output


def _sets(*sets: str) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


def test_a_short_run_reports_the_gap_per_site_and_group(tmp_path: Path) -> None:
    cohort = tmp_path / "cohort"
    _invoke(
        "data", "make", "brain-age-synthetic", "--n", "40", "--spacing", "6", "--patients", "0.3", "--out", str(cohort)
    )
    run = tmp_path / "run"
    csv_path = cohort / "participants.csv"
    sets = [f"data.options.csv={csv_path}", f"data.options.cache_dir={tmp_path / 'cache'}", *TINY]
    sets += ["study.group_column=group", "study.harmonize=combat"]
    printed = _invoke("train", "brain_age_tsan_synthetic", "--out", str(run), *_sets(*sets))
    metrics = json.loads((run / "metrics.json").read_text())
    study = metrics["study"]
    n_test = metrics["test"]["n"]
    assert sum(r["n"] for r in study["sites"].values()) == n_test
    assert sum(r["n"] for r in study["groups"].values()) == n_test
    assert study["reference_group"] == "control" and study["combat"]["fitted_on"] == "train"
    # the table before harmonisation, recomputed from predictions.csv and the cohort CSV
    rows = {r["subject"]: r for r in csv.DictReader(csv_path.open())}
    test = [r for r in csv.DictReader((run / "predictions.csv").open()) if r["split"] == "test"]
    if study["gap"] == "gap_corrected_gap":
        gap = np.array([float(r["pred_corrected_gap"]) - float(r["age"]) for r in test])
        expected = gap_by_site(gap, [rows[r["subject"]]["site"] for r in test])
        for site, row in expected.items():
            assert study["sites_unharmonized"][site]["mean"] == pytest.approx(row["mean"], abs=1e-3)
    report = (run / "report.md").read_text()
    assert "## Gap per site (`site`)" in report and "## Gap per group (`group`)" in report
    for out in (printed, _invoke("evaluate", str(run))):
        assert "gap mean" in out and "AUC" in out and "control (reference)" in out


@pytest.fixture(scope="module")
def preprocessed_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three raw scans preprocessed to ``mni152_6mm`` (train / val / test) and a tiny run trained on them."""
    from rankwise.data import make_brain_age_synthetic

    root = tmp_path_factory.mktemp("rawrun")
    raw = make_brain_age_synthetic(root / "raw", n=3, spacing=6.0, seed=5, raw=True, raw_voxel_mm=(2.5, 3.0))
    rows = list(csv.DictReader(raw.open()))
    for r, split in zip(rows, ("train", "val", "test")):
        r["split"] = split
    with raw.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    _invoke("preprocess", str(raw), "--out", str(root / "pre"), "--template", "mni152_6mm", "--no-progress")
    run = root / "run"
    sets = [f"data.options.csv={root / 'pre' / 'participants.csv'}", f"data.options.cache_dir={root / 'cache'}", *TINY]
    sets += ["loss.regularizers=[]"]
    _invoke("train", "brain_age_tsan_synthetic", "--out", str(run), *_sets(*sets))
    return {"root": root, "raw": raw, "rows": rows, "run": run}


def test_a_raw_cohort_is_preprocessed_with_the_run_s_template_then_predicted(preprocessed_run: dict[str, Any]) -> None:
    root, run = preprocessed_run["root"], preprocessed_run["run"]
    record = json.loads((run / "data.json").read_text())
    assert record["summary"]["meta"]["preprocessed"] == {"template": "mni152_6mm", "registration": "affine"}
    new = root / "new"
    new.mkdir()
    scan = preprocessed_run["raw"].parent / preprocessed_run["rows"][2]["path"]
    raw_csv = new / "raw.csv"
    raw_csv.write_text(f"path,sex,subject\n{scan},{preprocessed_run['rows'][2]['sex']},new-1\n")
    before = sorted(p.name for p in new.iterdir())
    line = one_error_line(CliRunner().invoke(app, ["predict", str(run), "--data", str(raw_csv)]))
    assert "raw scans" in line and "mni152_6mm" in line and "--preprocess-out" in line
    assert sorted(p.name for p in new.iterdir()) == before
    clash = new / "clash"
    clash.mkdir()
    (clash / "participants.csv").write_text("path,age\nx.nii.gz,3\n")
    args = ["predict", str(run), "--data", str(raw_csv), "--preprocess-out"]
    line = one_error_line(CliRunner().invoke(app, [*args, str(clash)]))
    assert "is not a CSV that `rankwise preprocess` wrote" in line
    out_csv = new / "predictions.csv"
    _invoke(*args, str(new / "pre"), "--out", str(out_csv))
    assert sorted(p.name for p in new.iterdir()) == sorted([*before, "clash", "pre", "predictions.csv"])
    written = list(csv.DictReader(out_csv.open()))
    assert [w["subject"] for w in written] == ["new-1"] and written[0]["raw_path"] == str(scan)
    # the same scan through the training cohort's own preprocessing predicts the same age
    direct = root / "direct.csv"
    _invoke("predict", str(run), "--data", str(root / "pre" / "participants.csv"), "--out", str(direct))
    same = [r for r in csv.DictReader(direct.open()) if r["subject"] == preprocessed_run["rows"][2]["subject"]]
    assert float(written[0]["prediction"]) == pytest.approx(float(same[0]["prediction"]), abs=0.05)
    line = one_error_line(
        CliRunner().invoke(
            app,
            [
                "predict",
                str(run),
                "--data",
                str(new / "pre" / "participants.csv"),
                "--preprocess-out",
                str(new / "again"),
            ],
        )
    )
    assert "already preprocessed" in line and not (new / "again").exists()
