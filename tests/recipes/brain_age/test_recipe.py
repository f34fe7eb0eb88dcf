"""End to end: the synthetic cohort command, then both TSAN stages of ``brain_age_tsan_synthetic`` at a tiny budget."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lightning")
pytest.importorskip("nibabel")
pytest.importorskip("nilearn")
pytest.importorskip("torchio")

from typer.testing import CliRunner

from rankwise.cli import app

TINY = [
    "model.options={nb_filter: 8, nb_block: 2, use_sex: true}",
    "data.options.shape=null",
    "data.batch_size=8",
    "trainer.max_epochs=1",
    "task.stage2_epochs=1",
    "trainer.num_threads=1",
    "trainer.enable_progress_bar=false",
]


def _invoke(*args: str) -> str:
    res = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.output


def test_synthetic_cohort_trains_both_stages(tmp_path: Path) -> None:
    cohort = tmp_path / "cohort"
    _invoke("data", "make", "brain-age-synthetic", "--n", "24", "--spacing", "6", "--out", str(cohort))
    rows = list(csv.DictReader(open(cohort / "participants.csv")))
    assert len(rows) == 24 and all(20 <= float(r["age"]) <= 90 and r["sex"] in "MF" for r in rows)
    run = tmp_path / "run"
    sets = [f"data.options.csv={cohort / 'participants.csv'}", f"data.options.cache_dir={tmp_path / 'cache'}", *TINY]
    _invoke("train", "brain_age_tsan_synthetic", "--out", str(run), *[a for s in sets for a in ("--set", s)])
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["recipe"] == "brain_age" and metrics["method"] == "tsan"
    for f in ("stage1/best.ckpt", "checkpoints/best.ckpt", "logs/stage1/metrics.csv", "logs/metrics.csv"):
        assert (run / f).is_file(), f
    for f in ("pred_vs_age", "bag_vs_age", "mae_by_decade", "inputs_montage", "stage1_curves", "training_curves"):
        assert (run / "plots" / f"{f}.png").is_file(), f
    preds = list(csv.DictReader(open(run / "predictions.csv")))
    by_split = {s: [r for r in preds if r["split"] == s] for s in ("val", "test")}
    subjects = {s: {r["subject"] for r in v} for s, v in by_split.items()}
    assert not subjects["val"] & subjects["test"] and len(preds) == metrics["test"]["n"] + metrics["val"]["n"]
    ages = {r["subject"]: float(r["age"]) for r in rows}
    assert all(abs(float(r["age"]) - ages[r["subject"]]) < 1e-3 for r in preds)
    # the metrics, recomputed from predictions.csv with numpy (fit on val, apply to test)
    va, vp = (np.array([float(r[k]) for r in by_split["val"]]) for k in ("age", "pred"))
    ta, tp = (np.array([float(r[k]) for r in by_split["test"]]) for k in ("age", "pred"))
    t = metrics["test"]
    assert t["mae"] == pytest.approx(np.abs(tp - ta).mean(), abs=2e-3)
    if np.ptp(vp) <= 1e-4 * np.abs(vp).max():  # a tiny run may predict one age: no correction is fitted
        assert t["corr_bag_age_gap"] is None and t["mae_prediction"] is None
        assert all(np.isnan(float(r[f"pred_corrected_{m}"])) for r in by_split["test"] for m in ("gap", "prediction"))
    else:
        slope, icpt = np.polyfit(va, vp - va, 1)
        gap = tp - (slope * ta + icpt)
        assert t["corr_bag_age_gap"] == pytest.approx(np.corrcoef(gap - ta, ta)[0, 1], abs=1e-3)
        np.testing.assert_allclose([float(r["pred_corrected_gap"]) for r in by_split["test"]], gap, atol=2e-3)
    if t["mae_prediction"] is not None:  # refused when the slope is within two standard errors of 0
        a, b = np.polyfit(va, vp, 1)
        np.testing.assert_allclose(
            a * np.array([float(r["pred_corrected_prediction"]) for r in by_split["test"]]) + b, tp, atol=2e-3
        )  # c = (pred - b) / a, checked as a * c + b = pred (well conditioned when the slope a is small)
    assert t["epoch_seconds"] > 0 and np.isfinite(t["stage1_mae"])
    # re-evaluation from the run directory gives the same numbers
    said = [ln for ln in _invoke("evaluate", str(run)).splitlines() if ln.startswith("warning:")]
    if t["corr_bag_age_gap"] is None:  # the reason is one warning line
        assert any(ln.startswith("warning: no 'gap' bias correction: `fit_pred` varies by") for ln in said), said
    again = json.loads((run / "metrics.json").read_text())
    assert again["test"]["mae"] == pytest.approx(t["mae"], abs=1e-6)


@pytest.mark.slow
def test_two_stages_under_ddp_on_two_cpu_processes(tmp_path: Path) -> None:
    """``--devices 2 --strategy ddp``: both stages train on both processes (the unused head of the
    authors' ScaleDense is frozen, so DDP does not wait for its gradient); rank 0 evaluates."""
    import os
    import subprocess
    import sys

    from rankwise.data import make_brain_age_synthetic

    csv_path = make_brain_age_synthetic(tmp_path / "cohort", n=16, spacing=6.0)
    run = tmp_path / "run"
    sets = [
        f"data.options.csv={csv_path}",
        f"data.options.cache_dir={tmp_path / 'cache'}",
        *TINY,
        "data.batch_size=4",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.strategy=ddp",
    ]
    cmd = [
        sys.executable,
        "-m",
        "rankwise.cli",
        "train",
        "brain_age_tsan_synthetic",
        "--out",
        str(run),
        "--no-progress",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    res = subprocess.run(
        cmd + [a for s in sets for a in ("--set", s)], capture_output=True, text=True, env=env, timeout=900
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    metrics = json.loads((run / "metrics.json").read_text())
    assert np.isfinite(metrics["test"]["mae"]) and np.isfinite(metrics["test"]["stage1_mae"])
    assert (run / "stage1" / "best.ckpt").is_file() and (run / "checkpoints" / "best.ckpt").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["kill-stage", "term-stage"])
def test_tsan_killed_between_its_stages_resumes_to_the_uninterrupted_metrics(tmp_path: Path, kind: str) -> None:
    from tests.recipes.test_recipe_training import _cli
    from tests.recipes.test_stages import _killed_at_stage_then_resumed

    cohort = tmp_path / "cohort"
    _invoke("data", "make", "brain-age-synthetic", "--n", "24", "--spacing", "6", "--out", str(cohort))
    sets = [f"data.options.csv={cohort / 'participants.csv'}", f"data.options.cache_dir={tmp_path / 'cache'}", *TINY]
    sets += ["model.options={nb_filter: 4, nb_block: 2, use_sex: true}", "report.plots=false"]
    ref = tmp_path / "ref"
    # the reference in a fresh process too, as the killed and the resumed runs (the test process's
    # state, e.g. an earlier run's thread count, changes float32 sums of the first stage)
    done = _cli(
        [
            "train",
            "brain_age_tsan_synthetic",
            "--out",
            str(ref),
            "--no-progress",
            *[a for s in sets for a in ("--set", s)],
        ]
    )
    assert done.returncode == 0, done.stderr[-2000:]
    ref_metrics = json.loads((ref / "metrics.json").read_text())
    _killed_at_stage_then_resumed(tmp_path, kind, "brain_age_tsan_synthetic", sets, "stage1", ref_metrics)
