"""A run stands on its own: ``RUN_DIR/data.json`` records the data it was trained on (absolute paths, file
fingerprints, split digest, what prediction needs), ``predict`` needs no training file, and ``evaluate``,
``predict`` and ``train --resume`` refuse data that changed since training with one ``error:`` line."""

from __future__ import annotations

import csv
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("typer")
pytest.importorskip("lightning")

from typer.testing import CliRunner

from rankwise.cli import app
from rankwise.data import make_ltr_synthetic
from rankwise.recipes import predict
from rankwise.recipes.rundir._record import DataChangedError, RecordedData, RecordLacks, split_digest
from rankwise.recipes.runner import evaluate
from tests.cli_helpers import one_error_line

runner = CliRunner()

SMALL = ["--set", "trainer.max_epochs=1", "--set", "model.options.hidden=[16]", "--set", "trainer.num_threads=1"]


def invoke(args: list[object]):  # type: ignore[no-untyped-def]
    return runner.invoke(app, [str(a) for a in args])


def _table(path: Path, n: int, seed: int, shift: float = 0.0) -> Path:
    rng = random.Random(seed)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["a", "b", "y"])
        for _ in range(n):
            a, b = rng.uniform(0, 10) + shift, rng.uniform(-5, 5) * (1 + shift)
            w.writerow([f"{a:.4f}", f"{b:.4f}", f"{3 * a + b + rng.gauss(0, 1):.3f}"])
    return path


def _append(path: Path, rows: int, seed: int) -> None:
    extra = _table(path.with_name("extra.csv"), rows, seed, shift=5.0).read_text().splitlines()[1:]
    with open(path, "a") as fh:
        fh.write("\n".join(extra) + "\n")


def _predictions(path: Path) -> np.ndarray:
    with open(path, newline="") as fh:
        return np.array([float(r["prediction"]) for r in csv.DictReader(fh)])


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A vanilla run trained from the folder ``a`` on the relative path ``train.csv``, and its predictions
    of ``new.csv`` made right after training."""
    root = tmp_path_factory.mktemp("standalone")
    (root / "a").mkdir()
    _table(root / "a" / "train.csv", 400, 0)
    new = _table(root / "new.csv", 20, 7)
    run = root / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root / "a")
        r = invoke(["train", "--data", "train.csv", "--target", "y", "--method", "vanilla", *SMALL, "--out", run])
        assert r.exit_code == 0, r.output
        r = invoke(["predict", run, "--data", new, "--out", root / "ref.csv"])
        assert r.exit_code == 0, r.output
    return {"root": root, "run": run, "train": root / "a" / "train.csv", "new": new, "ref": root / "ref.csv"}


@pytest.fixture
def run(trained: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    """The trained run; its training file and config.yaml as trained again after the test. The current
    directory: a fresh folder."""
    saved = {p: p.read_bytes() for p in (trained["train"], trained["run"] / "config.yaml")}
    monkeypatch.chdir(tmp_path)
    yield trained
    for p, data in saved.items():
        p.write_bytes(data)
    shutil.rmtree(trained["run"] / "changed_data", ignore_errors=True)


def _predict_cli(t: dict[str, Path], out: Path, *extra: object) -> np.ndarray:
    r = invoke(["predict", t["run"], "--data", t["new"], "--out", out, *extra])
    assert r.exit_code == 0, r.output
    return _predictions(out)


def test_config_yaml_and_data_json_name_the_training_file_absolute(run):
    cfg = yaml.safe_load((run["run"] / "config.yaml").read_text())
    assert cfg["data"]["options"]["path"] == str(run["train"])
    record = json.loads((run["run"] / "data.json").read_text())
    assert record["data"]["options"]["path"] == str(run["train"])
    (f,) = record["files"]
    assert f["path"] == str(run["train"]) and f["size"] == run["train"].stat().st_size and len(f["sha256"]) == 64
    meta = record["summary"]["meta"]
    assert meta["feature_names"] == ["a", "b"] and "indices" not in meta
    attributes = record["summary"]["attributes"]
    assert attributes["modality"] == "table" and attributes["kind"] == "tabular"


def test_predict_from_a_directory_with_another_train_csv_gives_the_same_predictions(run, tmp_path):
    _table(tmp_path / "train.csv", 400, 5, shift=20.0)  # the same columns, other numbers
    got = _predict_cli(run, tmp_path / "got.csv")
    np.testing.assert_allclose(got, _predictions(run["ref"]), rtol=0, atol=1e-6)


def test_predict_needs_no_training_file(run, tmp_path):
    run["train"].unlink()
    got = _predict_cli(run, tmp_path / "got.csv")
    np.testing.assert_allclose(got, _predictions(run["ref"]), rtol=0, atol=1e-6)


def test_rows_appended_predict_unchanged_and_evaluate_refused_naming_the_file(run, tmp_path):
    metrics = (run["run"] / "metrics.json").read_bytes()
    _append(run["train"], 300, 9)
    got = _predict_cli(run, tmp_path / "got.csv")
    np.testing.assert_allclose(got, _predictions(run["ref"]), rtol=0, atol=1e-6)
    line = one_error_line(invoke(["evaluate", run["run"], "--no-plots"]))
    assert str(run["train"]) in line and "changed since training" in line and "--allow-changed-data" in line
    assert (run["run"] / "metrics.json").read_bytes() == metrics


def test_rows_shuffled_evaluate_refused(run):
    metrics = (run["run"] / "metrics.json").read_bytes()
    lines = run["train"].read_bytes().splitlines(keepends=True)
    body = lines[1:]
    random.Random(1).shuffle(body)
    run["train"].write_bytes(b"".join([lines[0], *body]))  # the same size
    line = one_error_line(invoke(["evaluate", run["run"], "--no-plots"]))
    assert str(run["train"]) in line and "other content" in line
    assert (run["run"] / "metrics.json").read_bytes() == metrics


def _edit(run_dir: Path, key: str, value: object) -> None:
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    cfg["data"]["options"][key] = value
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


@pytest.mark.parametrize(("key", "value"), [("seed", 123), ("target", "b"), ("standardize_features", False)])
def test_an_edited_data_option_is_refused_naming_the_key(run, tmp_path, key, value):
    metrics = (run["run"] / "metrics.json").read_bytes()
    _edit(run["run"], key, value)
    line = one_error_line(invoke(["evaluate", run["run"], "--no-plots"]))
    assert f"`data.options.{key}`" in line and repr(value) in line
    assert (run["run"] / "metrics.json").read_bytes() == metrics
    line = one_error_line(invoke(["predict", run["run"], "--data", run["new"], "--out", tmp_path / "p.csv"]))
    assert f"`data.options.{key}`" in line
    assert not (tmp_path / "p.csv").exists()


def test_allow_changed_data_evaluates_into_changed_data_and_keeps_metrics_json(run):
    metrics = (run["run"] / "metrics.json").read_bytes()
    predictions = (run["run"] / "predictions.npz").read_bytes()
    _append(run["train"], 300, 9)
    r = invoke(["evaluate", run["run"], "--no-plots", "--allow-changed-data"])
    assert r.exit_code == 0, r.output
    assert "warning:" in r.output and str(run["train"]) in r.output
    assert (run["run"] / "metrics.json").read_bytes() == metrics
    assert (run["run"] / "predictions.npz").read_bytes() == predictions
    changed = json.loads((run["run"] / "changed_data" / "metrics.json").read_text())
    assert changed["changed_data"] is True and "test" in changed


def test_evaluate_of_unchanged_data_rewrites_metrics_json_as_before(run):
    r = invoke(["evaluate", run["run"], "--no-plots"])
    assert r.exit_code == 0, r.output
    assert not (run["run"] / "changed_data").exists()


def test_a_rebuilt_split_that_differs_is_refused(run):
    record_path = run["run"] / "data.json"
    saved = record_path.read_bytes()
    try:
        record = json.loads(saved)
        record["split"] = "0" * 64  # as if the split rule had changed between versions
        record_path.write_text(json.dumps(record))
        line = one_error_line(invoke(["evaluate", run["run"], "--no-plots"]))
        assert "split rebuilt" in line
    finally:
        record_path.write_bytes(saved)


def test_resume_refuses_changed_data(run):
    meta_path = run["run"] / "meta.json"
    saved = meta_path.read_bytes()
    try:
        _append(run["train"], 300, 9)
        r = invoke(["train", "--data", run["train"], "--target", "y", "--resume", "--out", run["run"], "--no-progress"])
        line = one_error_line(r)
        assert str(run["train"]) in line and "changed since training" in line
    finally:
        meta_path.write_bytes(saved)


def test_recorded_data_lacks_what_the_record_does_not_hold():
    data = RecordedData({"attributes": {"input_dim": 3}, "meta": {"x": 1}, "lacks": ["indices"]})
    assert data.input_dim == 3 and data.meta["x"] == 1 and data.meta.get("y") is None
    with pytest.raises(RecordLacks):
        _ = data.train
    with pytest.raises(RecordLacks):
        data.meta.get("indices")


# ------------------------------------------------------------------------------------------ learning to rank

LTR = [
    "data.options.fold=null",
    "model.options.hidden=[16]",
    "model.options.feature_dim=16",
    "data.batch_size=8",
    "data.num_workers=0",
    "trainer.max_epochs=1",
    "trainer.num_threads=1",
    "task.slate_length=10",
    "report.plots=false",
]


@pytest.fixture(scope="module")
def ltr_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("standalone_ltr")
    own = make_ltr_synthetic(root / "own", train_queries=40, val_queries=10, test_queries=24, seed=3)
    run_dir = root / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        args = ["train", "mslr_web10k_listnet", "--out", run_dir, "--no-progress"]
        args += [a for s in ["data.options.path=own", *LTR] for a in ("--set", s)]
        r = invoke(args)
        assert r.exit_code == 0, r.output
    return run_dir, Path(own)


def test_ltr_predict_needs_no_training_file_and_appended_train_txt_is_refused(ltr_run, tmp_path):
    run_dir, own = ltr_run
    record = json.loads((run_dir / "data.json").read_text())
    assert record["data"]["options"]["path"] == str(own)
    assert {Path(f["path"]).name for f in record["files"]} == {"train.txt", "vali.txt", "test.txt"}
    assert record["summary"]["attributes"]["num_features"] == 46
    new = tmp_path / "new.txt"
    shutil.copy(own / "test.txt", new)
    ref = predict(run_dir, new)
    saved = (own / "train.txt").read_bytes()
    metrics = (run_dir / "metrics.json").read_bytes()
    try:
        lines = saved.decode().splitlines()
        (own / "train.txt").write_text("\n".join([*lines, *(ln.replace("qid:", "qid:9") for ln in lines[:100])]))
        got = predict(run_dir, new)
        np.testing.assert_array_equal(got["score"], ref["score"])
        np.testing.assert_array_equal(got["rank"], ref["rank"])
        line = one_error_line(invoke(["evaluate", run_dir, "--no-plots"]))
        assert str(own / "train.txt") in line
        assert (run_dir / "metrics.json").read_bytes() == metrics
        with pytest.raises(DataChangedError, match=r"train\.txt"):
            evaluate(run_dir, plots=False)
    finally:
        (own / "train.txt").write_bytes(saved)


def test_split_digest_follows_the_rows(tmp_path):
    from rankwise.data import load_csv

    path = _table(tmp_path / "t.csv", 100, 0)
    first = split_digest(load_csv(path, target="y"))
    assert split_digest(load_csv(path, target="y")) == first
    assert split_digest(load_csv(path, target="y", seed=1)) != first


def test_a_moved_cache_is_not_a_change_of_the_data() -> None:
    """``data.options.cache_dir`` says where derived files live: another one is no change of the data."""
    from rankwise.recipes import config_from_dict
    from rankwise.recipes.rundir import DataChangedError
    from rankwise.recipes.rundir._record import check_options

    record = {"data": {"name": "nifti", "options": {"csv": "/data/cohort.csv", "cache_dir": "/scratch/a"}}}
    moved = config_from_dict(
        {
            "recipe": "brain_age",
            "model": {"backbone": "scale_dense"},
            "data": {"name": "nifti", "options": {"csv": "/data/cohort.csv", "cache_dir": "/b"}},
        }
    )
    check_options(record, moved, action="evaluate")
    other = config_from_dict(
        {
            "recipe": "brain_age",
            "model": {"backbone": "scale_dense"},
            "data": {"name": "nifti", "options": {"csv": "/data/other.csv", "cache_dir": "/b"}},
        }
    )
    with pytest.raises(DataChangedError, match=r"`data\.options\.csv` is '/data/other\.csv'"):
        check_options(record, other, action="evaluate")
