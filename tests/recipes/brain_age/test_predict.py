"""Brain-age predictions for a new cohort from a trained run (``BrainAgeRecipe.predict_file``).

One tiny TSAN run (both stages, one epoch each) on an 8 mm synthetic cohort; every test predicts a
CSV with it and checks the numbers against the run's own ``predictions.csv`` / ``metrics.json``.
"""

from __future__ import annotations

import csv
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("lightning")
pytest.importorskip("nibabel")
pytest.importorskip("nilearn")
pytest.importorskip("torchio")

from rankwise.data import DataFileNotFoundError, DataFormatError
from rankwise.data.nifti import load_nifti_cohort
from rankwise.data.synthetic_mri import make_brain_age_synthetic
from rankwise.recipes import CheckpointError, evaluate, load_config, predict, train
from rankwise.recipes.common import DataDefaultsWarning

#: the 8 mm synthetic volumes' own grid: the crop to it keeps all of them, and cuts finer volumes
GRID = [23, 27, 23]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("predict")
    src = make_brain_age_synthetic(root / "cohort", n=20, spacing=8.0, seed=5)
    sets = [
        f"data.options.csv={src}",
        f"data.options.cache_dir={root / 'cache'}",
        f"data.options.shape={GRID}",
        "model.options={nb_filter: 4, nb_block: 2, use_sex: true}",
        "data.batch_size=4",
        "trainer.max_epochs=1",
        "task.stage2_epochs=1",
        "trainer.num_threads=1",
        "task.montage=0",
    ]
    run_dir = root / "run"
    train(load_config("brain_age_tsan_synthetic", overrides=sets), out=run_dir, progress=False, plots=False)
    evaluate(run_dir, plots=False)  # rewrites predictions.csv from the best checkpoints
    preds = list(csv.DictReader(open(run_dir / "predictions.csv")))
    rows = {r["subject"]: r for r in csv.DictReader(open(src))}
    return {
        "root": root,
        "run": run_dir,
        "src": src,
        "rows": rows,
        "test": [r for r in preds if r["split"] == "test"],
        "metrics": json.loads((run_dir / "metrics.json").read_text()),
    }


def _predict_file(run_dir: Path, path: Path, checkpoint: str | None = None) -> dict[str, Any]:
    """The recipe's ``predict_file`` hook through :func:`rankwise.recipes.predict` (what ``rankwise predict`` calls)."""
    return predict(run_dir, path, checkpoint=checkpoint)


def _write(path: Path, header: list[str], rows: list[list[Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def _rel(trained: dict[str, Any], subject: str, folder: Path) -> str:
    """The subject's volume relative to ``folder`` (the new CSV's folder, not the training CSV's)."""
    vol = trained["src"].parent / trained["rows"][subject]["path"]
    return str(Path("..") / vol.relative_to(trained["root"]))  # folder is a child of root


def _col(table: dict[str, Any], name: str) -> np.ndarray:
    return np.asarray(table[name], dtype=np.float64)


def test_the_run_s_own_test_subjects_reproduce_predictions_csv(trained: dict[str, Any]) -> None:
    test = trained["test"]
    assert len(test) >= 3
    folder = trained["root"] / "new"
    rows = trained["rows"]
    subjects = [r["subject"] for r in test]
    header = ["path", "age", "sex", "site", "subject"]
    new = _write(
        folder / "same.csv",
        header,
        [[_rel(trained, s, folder), rows[s]["age"], rows[s]["sex"], rows[s]["site"], s] for s in subjects],
    )
    before = {f: (trained["run"] / f).read_bytes() for f in ("predictions.csv", "metrics.json")}
    user_files = sorted(trained["src"].parent.iterdir()) + sorted(folder.iterdir())
    cache = set((trained["root"] / "cache").iterdir())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DataDefaultsWarning)
        table = _predict_file(trained["run"], new)
    said = [str(w.message) for w in caught if issubclass(w.category, DataDefaultsWarning)]
    assert not [m for m in said if "centred crop" in m]  # these volumes fit the run's grid: no crop note
    assert list(table) == [
        *header,  # the file's columns as read, then what the run computes, the prediction last
        "stage1_prediction",
        "gap",
        "prediction_corrected_gap",
        "prediction_corrected_prediction",
        "gap_corrected_gap",
        "gap_corrected_prediction",
        "prediction",
    ]
    assert table["subject"] == subjects and table["site"] == [rows[s]["site"] for s in subjects]
    assert table["path"] == [_rel(trained, s, folder) for s in subjects]
    assert table["age"] == [rows[s]["age"] for s in subjects]
    age = np.array([float(r["age"]) for r in test])
    np.testing.assert_allclose(_col(table, "age"), age, atol=1e-3)
    pred = _col(table, "prediction")
    np.testing.assert_allclose(pred, [float(r["pred"]) for r in test], atol=1e-5)
    for method in ("gap", "prediction"):
        expected = np.array([float(r[f"pred_corrected_{method}"] or "nan") for r in test])
        np.testing.assert_allclose(_col(table, f"prediction_corrected_{method}"), expected, atol=1e-5)
        np.testing.assert_allclose(_col(table, f"gap_corrected_{method}"), expected - age, atol=1e-3)
        if not np.isfinite(expected).all():  # this tiny run's validation predictions may be constant
            assert any(m.startswith(f"no {method!r} bias correction: ") for m in said), said
    np.testing.assert_allclose(_col(table, "gap"), pred - age, atol=1e-3)
    # stage 1's predictions: the run's stage-1 test MAE, from metrics.json
    stage1_mae = np.abs(_col(table, "stage1_prediction") - age).mean()
    assert stage1_mae == pytest.approx(trained["metrics"]["test"]["stage1_mae"], abs=1e-3)
    assert not np.allclose(_col(table, "stage1_prediction"), pred)  # stage 2 changed them
    # nothing of the run or of the user's folders changed; the volumes were cached already (training)
    assert {f: (trained["run"] / f).read_bytes() for f in before} == before
    assert sorted(trained["src"].parent.iterdir()) + sorted(folder.iterdir()) == user_files
    assert set((trained["root"] / "cache").iterdir()) == cache


def test_unknown_ages_other_order_and_extra_columns(trained: dict[str, Any]) -> None:
    test = trained["test"]
    folder = trained["root"] / "noage"
    rows = trained["rows"]
    subjects = [r["subject"] for r in test][::-1]
    header = ["diagnosis", "subject", "sex", "path", "split", "site"]
    new = _write(
        folder / "patients.csv",
        header,
        [["AD", s, rows[s]["sex"], _rel(trained, s, folder), "train", rows[s]["site"]] for s in subjects],
    )
    table = _predict_file(trained["run"], new)
    by_subject = {r["subject"]: r for r in test}
    assert list(table)[: len(header)] == header and "age" not in table
    assert table["subject"] == subjects and table["diagnosis"] == ["AD"] * len(subjects)
    assert table["split"] == ["train"] * len(subjects)  # kept as text, not a split
    np.testing.assert_allclose(_col(table, "prediction"), [float(by_subject[s]["pred"]) for s in subjects], atol=1e-5)
    # the "prediction" correction inverts the validation line and needs no age; "gap" does
    expected = [float(by_subject[s]["pred_corrected_prediction"]) for s in subjects]
    np.testing.assert_allclose(_col(table, "prediction_corrected_prediction"), expected, atol=1e-5)
    for name in ("gap", "prediction_corrected_gap", "gap_corrected_gap", "gap_corrected_prediction"):
        assert np.isnan(_col(table, name)).all(), name
    # some ages known, some not, and no subject column: the rows with an age get their gaps
    # a column named like a computed one keeps its values; the computed one gets a suffix
    mixed = _write(
        folder / "mixed.csv",
        ["path", "age", "sex", "gap"],
        [
            [_rel(trained, s, folder), rows[s]["age"] if i % 2 else "", rows[s]["sex"], "x"]
            for i, s in enumerate(subjects)
        ],
    )
    part = _predict_file(trained["run"], mixed, "best")
    assert "subject" not in part and "site" not in part and part["gap"] == ["x"] * len(subjects)
    assert part["age"] == [rows[s]["age"] if i % 2 else "" for i, s in enumerate(subjects)]
    known = np.arange(len(subjects)) % 2 == 1
    ages = np.array([float(rows[s]["age"]) for s in subjects])
    np.testing.assert_allclose(_col(part, "gap_1")[known], (_col(part, "prediction") - ages)[known], atol=1e-3)
    assert np.isnan(_col(part, "gap_1")[~known]).all()
    gap = [float(by_subject[s]["pred_corrected_gap"]) for s in subjects]
    np.testing.assert_allclose(_col(part, "prediction_corrected_gap")[known], np.array(gap)[known], atol=1e-5)
    assert np.isnan(_col(part, "prediction_corrected_gap")[~known]).all()


def _shift_head(ckpt: Path, years: float) -> None:
    """Add ``years`` to the bias of the last layer of the sex head in a checkpoint of this test's run."""
    blob = torch.load(ckpt, weights_only=True)
    blob["state_dict"]["net.end_fc_with_gender.1.bias"] += years
    torch.save(blob, ckpt)


def test_the_checkpoint_option_picks_the_last_stage_s_checkpoint(trained: dict[str, Any], tmp_path: Path) -> None:
    """``last``: stage 2's last.ckpt, as ``evaluate --checkpoint last``; stage 1 always predicts from its best."""
    run = tmp_path / "run"
    shutil.copytree(trained["run"], run)
    _shift_head(run / "stage1" / "last.ckpt", 3.0)  # one epoch per stage: make last differ from best
    _shift_head(run / "checkpoints" / "last.ckpt", 3.0)
    evaluate(run, checkpoint="last", plots=False)
    test = [r for r in csv.DictReader(open(run / "predictions.csv")) if r["split"] == "test"]
    folder = trained["root"] / "last"
    rows = trained["rows"]
    new = _write(
        folder / "test.csv",
        ["path", "sex"],
        [[_rel(trained, r["subject"], folder), rows[r["subject"]]["sex"]] for r in test],
    )
    last = _predict_file(run, new, "last")
    best = _predict_file(run, new, "best")
    np.testing.assert_allclose(_col(last, "prediction"), [float(r["pred"]) for r in test], atol=1e-5)
    expected = [float(r["pred_corrected_prediction"]) for r in test]
    np.testing.assert_allclose(_col(last, "prediction_corrected_prediction"), expected, atol=1e-5)
    np.testing.assert_allclose(_col(best, "prediction"), [float(r["pred"]) for r in trained["test"]], atol=1e-5)
    assert np.abs(_col(last, "prediction") - _col(best, "prediction")).min() > 0.1
    np.testing.assert_allclose(_col(last, "stage1_prediction"), _col(best, "stage1_prediction"), atol=1e-6)
    (run / "checkpoints" / "last.ckpt").unlink()
    with pytest.raises(CheckpointError, match=r"cannot predict: .* has no checkpoints/last\.ckpt"):
        _predict_file(run, new, "last")


def test_bad_new_cohorts_are_one_clear_error(trained: dict[str, Any]) -> None:
    folder = trained["root"] / "bad"
    s = trained["test"][0]["subject"]
    good = [_rel(trained, s, folder), "40", "M"]
    missing = _write(folder / "missing.csv", ["path", "age", "sex"], [good, ["../gone/sub-9999.nii.gz", "50", "F"]])
    with pytest.raises(DataFileNotFoundError) as e:
        _predict_file(trained["run"], missing)
    assert str(e.value) == f"{missing}, row 3: volume {(folder / '../gone/sub-9999.nii.gz')} does not exist"
    corrupt = folder / "corrupt.nii.gz"
    corrupt.write_bytes(b"\x1f\x8b not a volume")
    broken = _write(folder / "broken.csv", ["path", "age", "sex"], [good, good, ["corrupt.nii.gz", "", "F"]])
    with pytest.raises(DataFormatError, match=r"broken\.csv, row 4: volume .*corrupt\.nii\.gz cannot be read"):
        _predict_file(trained["run"], broken)
    nosex = _write(folder / "nosex.csv", ["path", "age"], [good[:2]])
    with pytest.raises(DataFormatError, match=r"nosex\.csv, row 1: missing column `sex`: the run's network uses sex"):
        _predict_file(trained["run"], nosex)
    emptysex = _write(folder / "emptysex.csv", ["path", "age", "sex"], [good, [good[0], "41", ""]])
    with pytest.raises(DataFormatError, match=r"emptysex\.csv, row 3: empty `sex` \(.*\): the run's network uses sex"):
        _predict_file(trained["run"], emptysex)
    badage = _write(folder / "badage.csv", ["path", "age", "sex"], [[good[0], "old", "M"]])
    with pytest.raises(DataFormatError, match=r"badage\.csv, row 2: column 'age': cannot parse 'old' as a number"):
        _predict_file(trained["run"], badage)
    dup = _write(folder / "dup.csv", ["path", "note", "sex", "note"], [[good[0], "a", "M", "b"]])
    with pytest.raises(DataFormatError, match=r"dup\.csv, row 1: duplicated column name 'note': columns 2 and 4"):
        _predict_file(trained["run"], dup)  # the output would keep one of the two columns
    header_only = _write(folder / "header.csv", ["path", "age", "sex"], [])
    with pytest.raises(DataFormatError, match=r"header\.csv: the CSV has no data rows"):
        _predict_file(trained["run"], header_only)
    (folder / "empty.csv").write_text("")
    with pytest.raises(DataFormatError, match=r"empty\.csv: the CSV is empty"):
        _predict_file(trained["run"], folder / "empty.csv")
    # a volume whose preprocessed grid is not the run's (a run without `shape` keeps the native grid)
    with pytest.raises(
        DataFormatError, match=r"row 2: volume .* has shape \(23, 27, 23\) after preprocessing, the run"
    ):
        load_nifti_cohort(folder / "missing.csv", cache_dir=str(trained["root"] / "cache"), grid=[20, 20, 20])
    assert not (folder / "gone").exists() and corrupt.read_bytes() == b"\x1f\x8b not a volume"


def test_volumes_of_another_voxel_size_are_a_crop_warning(trained: dict[str, Any]) -> None:
    """4 mm volumes through the run's 8 mm grid (no `spacing`): the centred crop keeps the middle of the head."""
    fine = make_brain_age_synthetic(trained["root"] / "fine", n=2, spacing=4.0, seed=9)
    rows = list(csv.DictReader(open(fine)))
    new = _write(fine.parent / "fine.csv", ["path", "sex"], [[r["path"], r["sex"]] for r in rows])
    with pytest.warns(DataDefaultsWarning) as record:
        table = _predict_file(trained["run"], new)
    notes = [str(w.message) for w in record if w.category is DataDefaultsWarning and "centred crop" in str(w.message)]
    assert len(notes) == 1 and notes[0].startswith(f"{new}: the centred crop to `data.options.shape` [23, 27, 23] ")
    assert "keeps less than 90% of the voxels > 0 of 2 of 2 volumes (row " in notes[0]
    assert "voxel size 4 x 4 x 4 mm); the run's grid holds only part of these heads" in notes[0]
    assert np.isfinite(_col(table, "prediction")).all() and len(table["path"]) == 2
    shutil.rmtree(fine.parent)


@pytest.fixture(scope="module")
def sfcn(trained: dict[str, Any]) -> dict[str, Any]:
    """SFCN (one stage, no sex input) on the same cohort, padded to a grid its five poolings fit."""
    root = trained["root"]
    sets = [
        f"data.options.csv={trained['src']}",
        f"data.options.cache_dir={root / 'cache'}",
        "data.options.shape=[32, 32, 32]",
        "data.batch_size=4",
        "trainer.max_epochs=1",
        "trainer.num_threads=1",
        "task.montage=0",
    ]
    run_dir = root / "sfcn"
    train(load_config("brain_age_sfcn_synthetic", overrides=sets), out=run_dir, progress=False, plots=False)
    preds = list(csv.DictReader(open(run_dir / "predictions.csv")))
    return {"run": run_dir, "test": [r for r in preds if r["split"] == "test"]}


def test_sfcn_predicts_without_sex(trained: dict[str, Any], sfcn: dict[str, Any]) -> None:
    folder = trained["root"] / "sfcn_new"
    test = sfcn["test"]
    new = _write(
        folder / "nosex.csv",
        ["subject", "path", "age"],
        [[r["subject"], _rel(trained, r["subject"], folder), r["age"]] for r in test],
    )
    table = _predict_file(sfcn["run"], new)
    assert "stage1_prediction" not in table and list(table)[-1] == "prediction"
    np.testing.assert_allclose(_col(table, "prediction"), [float(r["pred"]) for r in test], atol=1e-5)
    for method in ("gap", "prediction"):
        # this tiny run's validation predictions may be too flat to fit a correction: then the run
        # and the prediction both leave it empty
        expected = [float(r[f"pred_corrected_{method}"] or "nan") for r in test]
        np.testing.assert_allclose(_col(table, f"prediction_corrected_{method}"), expected, atol=1e-5)


def test_the_command_writes_empty_cells_for_unknown_ages_and_prints_the_mae(trained: dict[str, Any]) -> None:
    """``rankwise predict`` on a cohort with some ages unknown: the CSV has empty cells where a value needs
    the age, and the printed MAE is over the rows with an age (the loader's ``age`` column)."""
    from typer.testing import CliRunner

    from rankwise.cli import app

    rows, folder = trained["rows"], trained["root"] / "cli"
    subjects = [r["subject"] for r in trained["test"]]
    new = _write(
        folder / "cohort.csv",
        ["subject", "path", "age", "sex"],
        [
            [s, _rel(trained, s, folder), rows[s]["age"] if i % 2 else "", rows[s]["sex"]]
            for i, s in enumerate(subjects)
        ],
    )
    out = folder / "out.csv"
    r = CliRunner().invoke(app, ["predict", str(trained["run"]), "--data", str(new), "--out", str(out)])
    assert r.exit_code == 0, r.output
    written = list(csv.DictReader(open(out)))
    assert [w["subject"] for w in written] == subjects
    known = [i % 2 == 1 for i in range(len(subjects))]
    assert all((w["gap"] == "") != k for w, k in zip(written, known))
    assert all(w["prediction"] not in ("", "nan") for w in written)
    errors = [abs(float(w["prediction"]) - float(rows[s]["age"])) for w, s, k in zip(written, subjects, known) if k]
    line = " ".join(r.output.split())
    assert f"{len(subjects)} row(s) predicted" in line
    assert f"MAE {np.mean(errors):.4g} on the {sum(known)} row(s) with a target value" in line


def test_predict_preprocesses_with_the_run_s_recorded_preprocessing(
    trained: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import rankwise.data.nifti as nifti
    from rankwise.data import NiftiPreprocessing

    record = json.loads((trained["run"] / "data.json").read_text())
    recorded = NiftiPreprocessing.from_dict(record["summary"]["meta"]["preprocessing"])
    assert recorded == NiftiPreprocessing(shape=GRID, cache_dir=str(trained["root"] / "cache"))
    seen: list[Any] = []
    real = nifti.load_nifti_cohort

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("preprocessing"))
        assert not set(kwargs) & {"shape", "spacing", "resize", "normalize", "cache_dir"}
        return real(*args, **kwargs)

    monkeypatch.setattr(nifti, "load_nifti_cohort", spy)
    folder = trained["root"] / "whole"
    subjects = [r["subject"] for r in trained["test"]][:2]
    new = _write(
        folder / "two.csv", ["path", "sex"], [[_rel(trained, s, folder), trained["rows"][s]["sex"]] for s in subjects]
    )
    table = _predict_file(trained["run"], new)
    assert len(table["prediction"]) == 2
    assert seen == [recorded]  # the training run's preprocessing, whole
