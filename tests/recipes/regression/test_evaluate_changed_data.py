"""`rankwise evaluate --allow-changed-data` of a DIR run whose model's shape depends on the training labels
(LDS bins, FDS statistics, CORAL classes): the training file gains rows of a new label range, and the
run is evaluated on it with the network it was trained with (into RUN_DIR/changed_data/); a failure
says that the data changed and leaves no changed_data/ folder behind."""

from __future__ import annotations

import csv
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("lightning")

from rankwise.cli import app
from rankwise.recipes.registry import get_recipe
from rankwise.recipes.regression.net import DIRNet
from rankwise.recipes.rundir import load_data, load_state_dict
from rankwise.recipes.runner import load_run_config
from tests.cli_helpers import one_error_line

runner = CliRunner()

SMALL = ["--set", "trainer.max_epochs=1", "--set", "model.options.hidden=[16]", "--set", "trainer.num_threads=1"]


def invoke(args: list[object]):  # type: ignore[no-untyped-def]
    return runner.invoke(app, [str(a) for a in args])


def _rows(n: int, seed: int, labels: range) -> list[list[str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        y = rng.choice(labels)
        xs = [y / 10 + rng.gauss(0, 0.5), rng.gauss(0, 1), rng.uniform(-1, 1), rng.gauss(y / 20, 1)]
        out.append([*(f"{v:.4f}" for v in xs), str(y)])
    return out


def _write(path: Path, rows: list[list[str]], mode: str = "w") -> None:
    with open(path, mode, newline="") as fh:
        w = csv.writer(fh)
        if mode == "w":
            w.writerow(["x1", "x2", "x3", "x4", "y"])
        w.writerows(rows)


@pytest.fixture(scope="module", params=["lds", "fds", "coral"])
def changed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A run trained on labels 0..50, its training data as loaded then, and its training file with 10
    rows of labels 91..100 appended since."""
    root = tmp_path_factory.mktemp(f"changed_{request.param}")
    train = root / "train.csv"
    _write(train, _rows(300, 0, range(0, 51)))
    run = root / "run"
    r = invoke(["train", "--data", train, "--target", "y", "--method", request.param, *SMALL, "--out", run])
    assert r.exit_code == 0, r.output
    cfg = load_run_config(run)
    trained = load_data(cfg, get_recipe(cfg.recipe))
    _write(train, [[f"{i / 10:.4f}", "0.1", "0.2", "0.3", str(y)] for i, y in enumerate(range(91, 101))], "a")
    return {"run": run, "train": train, "trained": trained, "method": request.param}


def _trained_model_on(run: Path, trained: object, x: torch.Tensor) -> np.ndarray:
    """The predictions for ``x`` of the run's best checkpoint in a network built from the data it was
    trained on (loaded before the file changed)."""
    cfg = load_run_config(run)
    net = DIRNet(
        cfg,
        input_dim=trained.input_dim,  # type: ignore[attr-defined]
        bin_width=trained.bin_width,  # type: ignore[attr-defined]
        train_labels=trained.train_labels,  # type: ignore[attr-defined]
        meta=trained.meta,  # type: ignore[attr-defined]
    )
    net.load_state_dict(load_state_dict(run / "checkpoints" / "best.ckpt"), strict=True)
    net.eval()
    with torch.no_grad():
        return net(x).float().reshape(-1).numpy()


def test_allow_changed_data_evaluates_the_trained_model_on_the_changed_rows(changed):
    run = changed["run"]
    assert isinstance(run, Path)
    metrics = (run / "metrics.json").read_bytes()
    r = invoke(["evaluate", run, "--no-plots", "--allow-changed-data"])
    assert r.exit_code == 0, r.output
    assert "warning:" in r.output and "changed since training" in r.output
    assert (run / "metrics.json").read_bytes() == metrics
    result = json.loads((run / "changed_data" / "metrics.json").read_text())
    assert result["changed_data"] is True
    with np.load(run / "changed_data" / "predictions.npz") as z:
        pred, label = z["pred"], z["label"]
    cfg = load_run_config(run)
    now = load_data(cfg, get_recipe(cfg.recipe))
    assert np.max(now.train_labels) > 90 or np.max(now.test_labels) > 90 or np.max(now.val_labels) > 90
    x, y = now.test.x, now.test.y
    assert np.array_equal(label, y.numpy().astype(np.float32))
    ref = _trained_model_on(run, changed["trained"], x)
    np.testing.assert_allclose(pred, ref, rtol=1e-5, atol=1e-5)
    assert result["test"]["all"]["count"] == len(label)
    assert result["test"]["all"]["mae"] == pytest.approx(float(np.mean(np.abs(ref - label))), rel=1e-5)


def _break_record(run: Path) -> bytes:
    """data.json with half its training labels (a model built from it does not fit the checkpoint); the
    file as it was."""
    path = run / "data.json"
    saved = path.read_bytes()
    record = json.loads(saved)
    labels = record["summary"]["attributes"]["train_labels"]
    labels["__ndarray__"] = [v for v in labels["__ndarray__"] if v < 25]
    path.write_text(json.dumps(record))
    return saved


@pytest.mark.parametrize("existing", [False, True])
def test_a_failed_changed_data_evaluation_says_the_data_changed_and_leaves_no_new_folder(changed, existing):
    run = changed["run"]
    assert isinstance(run, Path)
    out = run / "changed_data"
    if existing:  # an earlier evaluation's results stay
        r = invoke(["evaluate", run, "--no-plots", "--allow-changed-data"])
        assert r.exit_code == 0, r.output
        before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    else:
        shutil.rmtree(out, ignore_errors=True)
    saved = _break_record(run)
    try:
        line = one_error_line(invoke(["evaluate", run, "--no-plots", "--allow-changed-data"]))
    finally:
        (run / "data.json").write_bytes(saved)
    assert "data changed since training" in line, line
    assert "does not fit" in line  # what does not fit is named too
    if existing:
        assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    else:
        assert not out.exists()


def test_without_allow_changed_data_the_changed_file_is_refused(changed):
    run = changed["run"]
    assert isinstance(run, Path)
    line = one_error_line(invoke(["evaluate", run, "--no-plots"]))
    assert str(changed["train"]) in line and "changed since training" in line and "--allow-changed-data" in line


def test_another_number_of_input_columns_is_one_line_saying_the_data_changed(changed):
    run, train = changed["run"], changed["train"]
    assert isinstance(run, Path) and isinstance(train, Path)
    shutil.rmtree(run / "changed_data", ignore_errors=True)
    saved = train.read_bytes()
    lines = saved.decode().splitlines()
    train.write_text("\n".join([f"x0,{lines[0]}", *(f"1,{ln}" for ln in lines[1:])]) + "\n")
    try:
        line = one_error_line(invoke(["evaluate", run, "--no-plots", "--allow-changed-data"]))
    finally:
        train.write_bytes(saved)
    assert "data changed since training" in line and "`input_dim` is 5" in line, line
    assert not (run / "changed_data").exists()
