"""Ordinal heads in the brain-age recipe: ScaleDense + CORAL and SFCN + DLDL on a tiny synthetic cohort.

The classes, the decoded ages (within the classes, class ages for a class decoder), ``metrics.json``,
``rankwise evaluate`` and ``rankwise predict`` from the checkpoint's class map, the own-cohort route,
the age-difference term beside an expectation-decoded head, and the refused configs.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("lightning")
pytest.importorskip("nibabel")
pytest.importorskip("nilearn")
pytest.importorskip("torchio")

from typer.testing import CliRunner

from rankwise.cli import app
from rankwise.data.synthetic_mri import make_brain_age_synthetic

TINY = [
    "data.batch_size=4",
    "trainer.max_epochs=1",
    "trainer.num_threads=1",
    "task.montage=0",
    "report.plots=false",
]
SCALE_DENSE = ["model.options={nb_filter: 4, nb_block: 2, use_sex: true}", "data.options.shape=null"]
SFCN = [
    "model.options={channels: [4, 4, 4, 4, 4, 4], bins: 35, age_range: [20.0, 90.0], dropout: 0.5}",
    "data.options.shape=[32, 32, 32]",
]


def _invoke(*args: str, code: int = 0) -> str:
    res = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert res.exit_code == code, res.output
    return res.output


def _sets(*sets: str) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


@pytest.fixture(scope="module")
def cohort(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ordinal_cohort")
    return make_brain_age_synthetic(root / "cohort", n=16, spacing=8.0)


def _data(cohort: Path, cache: Path) -> list[str]:
    return [f"data.options.csv={cohort}", f"data.options.cache_dir={cache}"]


def _class_note(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.startswith("note: ordinal head")]


def _preds(run: Path) -> dict[str, np.ndarray]:
    rows = list(csv.DictReader(open(run / "predictions.csv")))
    return {k: np.array([float(r[k]) for r in rows]) for k in ("age", "pred")}


@pytest.fixture(scope="module")
def coral(cohort: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("coral")
    run = root / "run"
    sets = [*_data(cohort, root / "cache"), *SCALE_DENSE, *TINY]
    out = _invoke("train", "brain_age_coral_synthetic", "--out", str(run), "--no-progress", *_sets(*sets))
    return {"run": run, "output": out}


def test_scale_dense_coral_trains_and_predicts_class_ages(coral: dict[str, object], cohort: Path) -> None:
    from rankwise._binning import LabelClasses

    run = Path(str(coral["run"]))
    rows = list(csv.DictReader(open(run / "predictions.csv")))
    held_out = {r["subject"] for r in rows}
    ages = np.array([float(r["age"]) for r in csv.DictReader(open(cohort))])
    train_ages = [float(r["age"]) for r in csv.DictReader(open(cohort)) if r["subject"] not in held_out]
    lc = LabelClasses.fit(np.asarray(train_ages), 2.0)  # the preset's task.class_width
    assert _class_note(str(coral["output"])) == [f"note: ordinal head coral: {lc.describe()}"]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["recipe"] == "brain_age" and metrics["method"] == "scale_dense_coral"
    assert np.isfinite(metrics["test"]["mae"])
    p = _preds(run)
    centres = lc.values(torch.arange(lc.num_classes)).numpy()
    assert np.abs(p["pred"][:, None] - centres[None]).min(1).max() < 1e-4  # every prediction is a class age
    assert len(p["age"]) == metrics["test"]["n"] + metrics["val"]["n"] and ages.min() <= p["age"].min()
    state = torch.load(run / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    assert state["label_class_map"].tolist() == [lc.lo, lc.width, lc.num_classes]
    assert state["net.end_fc_with_gender.coral_bias"].shape == (lc.num_classes - 1,)  # CoralLayer on the 40 features
    assert state["net.end_fc_with_gender.coral_weights.weight"].shape == (1, 40)


def test_evaluate_and_predict_use_the_checkpoints_classes(coral: dict[str, object], cohort: Path) -> None:
    run = Path(str(coral["run"]))
    before = json.loads((run / "metrics.json").read_text())["test"]
    pred_before = _preds(run)["pred"]
    _invoke("evaluate", str(run))
    assert json.loads((run / "metrics.json").read_text())["test"]["mae"] == pytest.approx(before["mae"], abs=1e-6)
    np.testing.assert_allclose(_preds(run)["pred"], pred_before, atol=1e-5)
    _invoke("predict", str(run), "--data", str(cohort))
    rows = list(csv.DictReader(open(run / "predictions" / f"{cohort.stem}.csv")))
    p = np.array([float(r["prediction"]) for r in rows])
    assert len(p) == 16
    evaluated = {r["subject"]: float(r["pred"]) for r in csv.DictReader(open(run / "predictions.csv"))}
    new = {r["subject"]: float(r["prediction"]) for r in rows}
    assert all(new[s] == pytest.approx(v, abs=1e-4) for s, v in evaluated.items())  # the same network and classes
    state = torch.load(run / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    lo, width, k = state["label_class_map"].tolist()
    assert p.min() >= lo and p.max() <= lo + k * width
    np.testing.assert_allclose((p - lo) / width - 0.5, np.round((p - lo) / width - 0.5), atol=1e-4)


def test_sfcn_dldl_trains_over_sfcns_bins_with_the_age_difference_term(cohort: Path, tmp_path: Path) -> None:
    """SFCN's 35 two-year bins are the classes; DLDL decodes the expectation (a fractional class), on
    which TSAN's age-difference term trains beside the task loss."""
    run = tmp_path / "run"
    reg = "loss.regularizers=[{name: pairwise_difference, weight: 1.0, options: {pairs: all}}]"
    sets = [*_data(cohort, tmp_path / "cache"), *SFCN, *TINY, reg]
    out = _invoke("train", "brain_age_sfcn_dldl_synthetic", "--out", str(run), "--no-progress", *_sets(*sets))
    assert _class_note(out) == [
        "note: ordinal head dldl: 35 classes: bins of width 2 from 20 (class 0 = 21, class 34 = 89, the bin centres)"
    ]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["method"] == "sfcn_dldl" and np.isfinite(metrics["test"]["mae"])
    p = _preds(run)["pred"]
    assert p.min() >= 21 - 1e-4 and p.max() <= 89 + 1e-4  # the expectation over the bin centres
    log = list(csv.DictReader(open(run / "logs" / "metrics.csv")))
    values = [float(r["train/loss/pairwise_difference"]) for r in log if r.get("train/loss/pairwise_difference")]
    assert values and all(np.isfinite(values))
    state = torch.load(run / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    assert state["net.classifier.conv_6.1.weight"].shape == (35, 4)  # K class logits on the pooled features
    _invoke("evaluate", str(run))
    again = json.loads((run / "metrics.json").read_text())["test"]["mae"]
    assert again == pytest.approx(metrics["test"]["mae"], abs=1e-6)


def test_own_cohort_route_trains_an_ordinal_head(cohort: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    sets = [f"data.options.cache_dir={tmp_path / 'cache'}", *SCALE_DENSE, *TINY, "task.class_width=5"]
    args = ["train", "--data", str(cohort), "--target", "age", "--method", "corn", "--out", str(run)]
    out = _invoke(*args, "--no-progress", *_sets(*sets))
    notes = _class_note(out)
    assert len(notes) == 1 and notes[0].startswith("note: ordinal head corn: ") and "bins of width 5" in notes[0]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["method"] == "scale_dense_corn" and np.isfinite(metrics["test"]["mae"])


@pytest.mark.parametrize(
    ("preset", "sets", "message"),
    [
        (
            "brain_age_coral_synthetic",
            ["task.stages=2"],
            "error: `loss.name: coral` (an ordinal head) trains one stage: set `task.stages: 1`, got `task.stages: 2`",
        ),
        (
            "brain_age_coral_synthetic",
            ["loss.regularizers=[{name: spearman, weight: 1.0, options: {ranker: isotonic}}]"],
            "error: `loss.regularizers.spearman` applies to the predicted ages, which the `loss.name: coral` head "
            "decodes as a class (no gradient)",
        ),
        (
            "brain_age_tsan_synthetic",
            ["loss.name=regression_l1"],
            "error: `loss.name: regression_l1` trains ScaleDense's one stage: set `task.stages: 1`, got "
            "`task.stages: 2`",
        ),
    ],
)
def test_refused_configs_are_one_error_line(
    cohort: Path, tmp_path: Path, preset: str, sets: list[str], message: str
) -> None:
    out = _invoke("train", preset, "--out", str(tmp_path / "x"), *_sets(*_data(cohort, tmp_path), *sets), code=2)
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), out
