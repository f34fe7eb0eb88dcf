"""Ordinal heads in the DIR recipes: classes from the data, predictions in the label's units, the CLI route."""

from __future__ import annotations

import csv
import json
import re

import numpy as np
import pytest
import torch

from rankwise._binning import LabelClasses

pytest.importorskip("typer")
pytest.importorskip("lightning")
pytest.importorskip("yaml")

import yaml
from typer.testing import CliRunner

from rankwise.cli import app

runner = CliRunner()

TINY = [
    "--set",
    "trainer.max_epochs=2",
    "--set",
    "trainer.num_threads=1",
    "--set",
    "report.plots=false",
    "--no-progress",
]

#: the ordinal methods of the own-table route and whether they predict a class (else an expectation)
METHODS = {
    "coral": True,
    "corn": True,
    "condor": True,
    "cdw_ce": True,
    "sord": True,
    "mean_variance": False,
    "dldl": False,
}


def invoke(args: list[str]) -> object:
    return runner.invoke(app, args, catch_exceptions=False)


@pytest.fixture(scope="module")
def grades(tmp_path_factory: pytest.TempPathFactory) -> object:
    """A table nobody here wrote: 4 features, an integer grade 3..9 that grows with them (with noise)."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(240, 4))
    grade = np.clip(np.round(6 + 1.5 * x[:, 0] - x[:, 1] + 0.5 * rng.normal(size=240)), 3, 9).astype(int)
    path = tmp_path_factory.mktemp("own") / "grades.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["a", "b", "c", "d", "grade"])
        for row, g in zip(x, grade):
            w.writerow([*(f"{v:.6f}" for v in row), g])
    return path


def test_label_classes_of_integer_and_continuous_labels() -> None:
    lc = LabelClasses.fit(np.array([3.0, 9.0, 4.0, 4.0]), 2.0)  # integers: one class per integer, whatever the bins
    assert (lc.num_classes, lc.integer) == (7, True)
    y = torch.tensor([3.0, 4.0, 9.0, 12.0, -1.0, 6.4, 6.6])
    assert lc.classes(y).tolist() == [0, 1, 6, 6, 0, 3, 4]  # beyond the range: the end classes; nearest integer
    assert lc.values(torch.arange(7)).tolist() == [3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    assert lc.describe() == "7 classes: labels 3 .. 9 (one class per integer)"
    lc = LabelClasses.fit(np.array([0.12, 0.7, 2.34]), 0.5)  # continuous: the run's label bins, their centres
    assert (lc.num_classes, lc.integer) == (5, False)
    assert lc.classes(torch.tensor([0.12, 0.5, 0.7, 2.34])).tolist() == [0, 1, 1, 4]
    assert lc.values(torch.tensor([0, 4])).tolist() == [0.25, 2.25]
    assert lc.classes(torch.tensor([0.7], dtype=torch.float32)).tolist() == [1]  # the binning rule of every dtype
    with pytest.raises(ValueError, match="at least two classes; every training label is 5"):
        LabelClasses.fit(np.array([5.0, 5.0]), 1.0)
    with pytest.raises(ValueError, match="finite"):
        LabelClasses.fit(np.array([1.0, np.nan]), 1.0)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_own_table_trains_an_ordinal_head_and_predicts_grades(grades: object, tmp_path: object, method: str) -> None:
    run = tmp_path / method  # type: ignore[operator]
    r = invoke(["train", "--data", str(grades), "--target", "grade", "--method", method, "--out", str(run), *TINY])
    assert r.exit_code == 0, r.output  # type: ignore[attr-defined]
    notes = [ln for ln in r.output.splitlines() if ln.startswith("note: ordinal head")]  # type: ignore[attr-defined]
    assert notes == [f"note: ordinal head {method}: 7 classes: labels 3 .. 9 (one class per integer)"]
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["loss"]["name"] == method
    m = json.loads((run / "metrics.json").read_text())["test"]
    o = m["ordinal"]
    assert o["num_classes"] == 7 and set(o) >= {"exact_acc", "off_by_one_acc", "qwk", "kendall", "rmse"}
    assert 0 <= o["exact_acc"] <= o["off_by_one_acc"] <= 1
    pred = np.load(run / "predictions.npz")["pred"]
    assert pred.min() >= 3 and pred.max() <= 9  # in the grade's units, inside the classes
    if METHODS[method]:
        np.testing.assert_array_equal(pred, np.round(pred))  # a class: an integer grade
    # exact accuracy is the share of test rows whose predicted class is the grade
    label = np.load(run / "predictions.npz")["label"]
    np.testing.assert_allclose(o["exact_acc"], np.mean(np.round(pred) == label), atol=1e-12)
    # predictions for new rows: the same network, the same classes
    r = invoke(["predict", str(run), "--data", str(grades)])
    assert r.exit_code == 0, r.output  # type: ignore[attr-defined]
    with (run / "predictions" / "grades.csv").open() as f:
        rows = list(csv.DictReader(f))
    p = np.array([float(row["prediction"]) for row in rows])
    assert len(p) == 240 and p.min() >= 3 and p.max() <= 9
    # evaluate gives the metrics training wrote
    before = json.loads((run / "metrics.json").read_text())["test"]
    r = invoke(["evaluate", str(run)])
    assert r.exit_code == 0, r.output  # type: ignore[attr-defined]
    assert json.loads((run / "metrics.json").read_text())["test"]["ordinal"] == before["ordinal"]


def test_continuous_target_is_binned_with_the_runs_bin_width(grades: object, tmp_path: object) -> None:
    """A continuous label: the classes are the run's label bins, predictions their centres."""
    import pandas as pd

    df = pd.read_csv(grades)  # type: ignore[arg-type]
    df["score"] = df["grade"] * 1.37 + 0.01 * np.arange(len(df)) % 0.5
    path = tmp_path / "scores.csv"  # type: ignore[operator]
    df.drop(columns="grade").to_csv(path, index=False)
    run = tmp_path / "run"  # type: ignore[operator]
    r = invoke(["train", "--data", str(path), "--target", "score", "--method", "coral", "--out", str(run), *TINY])
    assert r.exit_code == 0, r.output  # type: ignore[attr-defined]
    width = float(re.search(r"label bin width ([0-9.e+-]+);", r.output).group(1))  # type: ignore[union-attr,attr-defined]
    note = next(ln for ln in r.output.splitlines() if ln.startswith("note: ordinal head"))  # type: ignore[attr-defined]
    assert f"bins of width {width:g}" in note
    pred = np.load(run / "predictions.npz")["pred"]
    centres = (np.floor(pred / width + 2**-10) + 0.5) * width
    np.testing.assert_allclose(pred, centres, rtol=0, atol=1e-4)


def test_ordinal_loss_as_a_regularizer_is_refused(grades: object, tmp_path: object) -> None:
    r = invoke(
        [
            "train",
            "abalone_vanilla",
            "--set",
            "loss.regularizers=[{name: coral, weight: 1.0}]",
            "--out",
            str(tmp_path / "x"),  # type: ignore[operator]
            "--no-progress",
        ]
    )
    assert r.exit_code == 2  # type: ignore[attr-defined]
    assert "it can be the task loss" in r.output  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["coral", "corn", "condor", "cdw_ce", "dldl"])
def test_ordinal_head_starts_from_the_training_labels_distribution(name: str) -> None:
    """With the input ignored, the head's probabilities are the (smoothed) class frequencies."""
    from rankwise.losses import get_loss_entry
    from rankwise.recipes.regression.net import ordinal_prior_bias

    counts = torch.tensor([5.0, 0.0, 12.0, 30.0, 3.0], dtype=torch.float64)
    p = (counts + 1) / (counts.sum() + 5)
    entry = get_loss_entry(name)
    assert entry.ordinal is not None
    b = ordinal_prior_bias(counts, entry.ordinal, layer=entry.ordinal.layer)
    above = 1 - torch.cumsum(p, 0)[:-1]  # P(y > k)
    if entry.ordinal.outputs == "classes":
        torch.testing.assert_close(torch.softmax(b, 0), p)
    elif entry.ordinal.layer == "coral":
        torch.testing.assert_close(torch.sigmoid(b), above)
    else:  # conditional thresholds: P(y > k) is the product of the first k + 1
        torch.testing.assert_close(torch.cumprod(torch.sigmoid(b), 0), above)


def test_compare_prints_each_note_once_and_reports_the_label_classes(tmp_path: object) -> None:
    out = tmp_path / "cmp"  # type: ignore[operator]
    r = invoke(
        ["compare", "abalone_coral", "--seeds", "0,1", "--out", str(out), *TINY, "--set", "trainer.max_epochs=1"]
    )
    assert r.exit_code == 0, r.output  # type: ignore[attr-defined]
    notes = [ln for ln in r.output.splitlines() if ln.startswith("note: ordinal head coral")]  # type: ignore[attr-defined]
    assert len(notes) == 1, r.output  # type: ignore[attr-defined]
    headers = [ln for ln in (out / "report.md").read_text().splitlines() if ln.startswith("| method")]
    assert headers[0].endswith("| Pearson |")  # the shot-group table
    assert "(many > 100, few < 20 training examples per label bin)" in (out / "report.md").read_text()
    assert headers[1] == "| method | seeds | K | QWK | exact acc | ±1 acc | Kendall | RMSE |"
    row = next(ln for ln in (out / "report.md").read_text().splitlines() if ln.startswith("| abalone_coral | 2 | 29 |"))
    runs = [json.loads((out / "runs" / "abalone_coral" / f"seed{s}" / "metrics.json").read_text()) for s in (0, 1)]
    qwk = np.mean([m["test"]["ordinal"]["qwk"] for m in runs])
    assert f"| {qwk:.3f} ± " in row
    assert "classes" in r.output and "Kendall" in r.output  # the printed table too  # type: ignore[attr-defined]


def test_class_metrics_round_predictions_as_the_metrics_do() -> None:
    """A run's ordinal block is ``ordinal_metrics`` of the predictions' class positions: nearest class, halves
    to even, Kendall on the predictions as they are."""
    from rankwise.metrics import ordinal_metrics
    from rankwise.recipes.regression.net import class_metrics

    train = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 5.0])
    pred = np.array([1.4995, 2.4992, 3.2, 4.0, 5.0, 2.5, 0.2, 7.0])
    label = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 2.0, 1.0, 5.0])
    m = class_metrics(pred, label, train, 1.0)
    assert m is not None and m["num_classes"] == 5
    ref = ordinal_metrics(torch.tensor(pred - 1), torch.tensor(label - 1), num_classes=5)
    for k in ("exact_acc", "off_by_one_acc", "qwk", "kendall"):
        assert m[k] == pytest.approx(ref[k], abs=1e-12), k
    # 1.4995, 2.4992, 3.2, 4 and 5 are their classes; 2.5 is position 1.5, rounded to even: grade 3; 0.2 and 7
    # lie outside the classes (the accuracies do not clip, the kappa does)
    assert m["exact_acc"] == 5 / 8
    assert class_metrics(pred, label, np.array([3.0, 3.0]), 1.0) is None  # one training class: not measured


def test_a_single_class_or_a_bad_loss_option_is_one_error_line_before_training(
    grades: object, tmp_path: object
) -> None:
    import pandas as pd

    df = pd.read_csv(grades)  # type: ignore[arg-type]
    df["grade"] = 4
    one = tmp_path / "one.csv"  # type: ignore[operator]
    df.to_csv(one, index=False)
    r = invoke(["train", "--data", str(one), "--target", "grade", "--method", "coral", "--out", str(tmp_path / "a")])  # type: ignore[operator]
    assert r.exit_code == 2  # type: ignore[attr-defined]
    assert r.output.strip().splitlines()[-1] == (  # type: ignore[attr-defined]
        "error: `loss.name` coral: an ordinal head needs training labels in at least two classes; "
        "every training label is 4"
    )
    bad = ["--set", "loss.name=unimodal_ce", "--set", "loss.options.distribution=triangular"]
    bad += ["--set", "loss.options.alpha2=0.6", "--no-progress"]
    out = str(tmp_path / "b")  # type: ignore[operator]
    r = invoke(["train", "--data", str(grades), "--target", "grade", "--method", "cdw_ce", "--out", out, *bad])
    assert r.exit_code == 2, r.output  # type: ignore[attr-defined]
    last = r.output.strip().splitlines()[-1]  # type: ignore[attr-defined]
    assert last.startswith("error: `loss.options` of 'unimodal_ce' for the data's 7 classes:") and "alpha2" in last
    assert "epoch 1/" not in r.output  # type: ignore[attr-defined]


def test_sord_proximities_and_list_options_come_from_a_config() -> None:
    """SORD's ``prox=True`` gets the training classes from the run, a YAML list becomes the class-weight
    tensor, and both move with the module without entering its state dict."""
    from rankwise.losses import sord_loss
    from rankwise.recipes import config_from_dict
    from rankwise.recipes.loss_terms import build_task_loss, check_loss_config

    cfg = config_from_dict({"loss": {"name": "sord", "options": {"prox": True, "weight": [1, 2.5, 1]}}})
    check_loss_config(cfg.loss)  # the run supplies the training classes: not refused as missing
    tc = torch.tensor([0, 0, 1, 2, 2, 2])
    term = build_task_loss(cfg.loss, num_classes=3, train_classes=tc)
    module = term.loss
    assert torch.equal(module.train_targets, tc) and module.weight.dtype == torch.get_default_dtype()
    logits, y = torch.tensor([[2.0, 0.5, -1.0], [0.0, 0.3, 1.2]]), torch.tensor([0, 2])
    want = sord_loss(logits, y, prox=True, train_targets=tc, weight=torch.tensor([1.0, 2.5, 1.0]))
    torch.testing.assert_close(module(logits=logits, targets=y), want)
    assert module.to(torch.float64).weight.dtype == torch.float64 and not module.state_dict()
    # integers stay integers (a class list), floats become the default float dtype
    ints = build_task_loss(
        config_from_dict({"loss": {"name": "sord", "options": {"weight": [1, 2, 1]}}}).loss, num_classes=3
    )
    assert ints.loss.weight.dtype == torch.int64
