"""`rankwise evaluate --allow-changed-data` of a brain-age run with an ordinal (CORAL) head after the
cohort's ages changed: the network is the one trained (its age classes from the training ages), so the
same volumes get the same predictions, now beside the changed ages, in RUN_DIR/changed_data/."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

pytest.importorskip("lightning")
pytest.importorskip("nibabel")
pytest.importorskip("nilearn")
pytest.importorskip("torchio")

from typer.testing import CliRunner

from rankwise.cli import app
from rankwise.data.synthetic_mri import make_brain_age_synthetic

SETS = [
    "data.batch_size=4",
    "trainer.max_epochs=1",
    "trainer.num_threads=1",
    "task.montage=0",
    "report.plots=false",
    "model.options={nb_filter: 4, nb_block: 2, use_sex: true}",
    "data.options.shape=null",
]


def _invoke(*args: str, code: int = 0) -> str:
    res = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert res.exit_code == code, res.output
    return res.output


def _rows(path: Path) -> dict[str, dict[str, str]]:
    with open(path, newline="") as fh:
        return {r["subject"]: r for r in csv.DictReader(fh)}


def test_a_coral_run_is_evaluated_on_shifted_ages_with_its_trained_classes(tmp_path: Path) -> None:
    participants = make_brain_age_synthetic(tmp_path / "cohort", n=16, spacing=8.0)
    run = tmp_path / "run"
    sets = [*SETS, f"data.options.csv={participants}", f"data.options.cache_dir={tmp_path / 'cache'}"]
    _invoke(
        "train",
        "brain_age_coral_synthetic",
        "--out",
        str(run),
        "--no-progress",
        *(a for s in sets for a in ("--set", s)),
    )
    metrics = (run / "metrics.json").read_bytes()
    with open(participants, newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:  # every age 25 years older: more age classes than the run was trained with
        r["age"] = f"{float(r['age']) + 25:.1f}"
    with open(participants, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    out = _invoke("evaluate", str(run), "--no-plots", "--allow-changed-data")
    assert "warning:" in out
    assert (run / "metrics.json").read_bytes() == metrics
    result = json.loads((run / "changed_data" / "metrics.json").read_text())
    assert result["changed_data"] is True
    before, after = _rows(run / "predictions.csv"), _rows(run / "changed_data" / "predictions.csv")
    same = [s for s in after if s in before and after[s]["split"] == before[s]["split"]]
    assert same
    for s in same:  # the trained network on the same volumes: the same predicted ages
        assert after[s]["pred"] == before[s]["pred"], s
        assert float(after[s]["age"]) == pytest.approx(float(before[s]["age"]) + 25, abs=1e-6)
