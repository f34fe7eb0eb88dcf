"""`rankwise predict` / :func:`rankwise.recipes.predict`: a trained run's predictions for the rows of a new
file equal the test predictions of its evaluation when the file holds its own test rows (csv: features by
name, standardized with the training statistics; image_csv: the test transform), and every way it can go
wrong is one ``error:`` line."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("typer")
pytest.importorskip("lightning")

from typer.testing import CliRunner

from rankwise.cli import app
from rankwise.recipes import load_config, predict, write_predictions
from rankwise.recipes.own_data import own_data_config
from rankwise.recipes.runner import evaluate, train
from tests.cli_helpers import TINY, cli_in_fresh_interpreter, one_error_line

runner = CliRunner()


def invoke(args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def _read(path: Path) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    return rows[0], rows[1:]


def _write(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return path


def _test_predictions(run: Path) -> np.ndarray:
    """The run's test predictions as ``rankwise evaluate`` computes them (rewrites predictions.npz)."""
    evaluate(run, plots=False)
    with np.load(run / "predictions.npz") as z:
        return z["pred"]


def _split_indices(run: Path) -> dict[str, np.ndarray]:
    """The split of the run's data, reloaded from its config."""
    from rankwise.recipes import rundir
    from rankwise.recipes.registry import get_recipe
    from rankwise.recipes.runner import load_run_config

    cfg = load_run_config(run)
    return rundir.load_data(cfg, get_recipe(cfg.recipe)).meta["indices"]


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """A numeric table (features on very different scales, so standardization matters) and its rows."""
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(300):
        a, b, c = rng.normal(size=3) * [1.0, 10.0, 100.0] + [0.0, 5.0, 50.0]
        rows.append([f"{a:.4f}", f"{b:.3f}", f"{c:.2f}", f"{20 + 3 * a + 0.2 * b + 0.01 * c + rng.normal():.3f}"])
    path = _write(tmp_path_factory.mktemp("table") / "houses.csv", ["a", "b", "c", "y"], rows)
    return path, rows


@pytest.fixture(scope="module")
def runs(tmp_path_factory, table):
    """Tiny runs on the table: dir (LDS, own-data route), rrt and rnc (presets switched to the CSV)."""
    path, _ = table
    root = tmp_path_factory.mktemp("predict_runs")
    cfg, _ = own_data_config(path, "y", "lds", overrides=TINY)
    out = {"dir": train(cfg, out=root / "dir", progress=False, verbose=False).run_dir}
    data = ["data.name=csv", f"data.options.path={path}", "data.options.target=y"]
    for name, extra in (("rrt", [f"task.init_checkpoint={out['dir']}"]), ("rnc", ["task.pretrain_epochs=1"])):
        cfg = load_config(f"abalone_{name}", [*TINY, *data, *extra])
        with pytest.warns(UserWarning):  # the preset's data options are replaced by the table's
            out[name] = train(cfg, out=root / name, progress=False, verbose=False).run_dir
    return out


@pytest.fixture(scope="module")
def test_rows_file(tmp_path_factory, table, runs):
    """The dir run's own test rows, in the split's order, as a new CSV with the target column."""
    _, rows = table
    test = _split_indices(runs["dir"])["test"]
    return _write(tmp_path_factory.mktemp("new") / "test_rows.csv", ["a", "b", "c", "y"], [rows[i] for i in test])


@pytest.mark.parametrize("name", ["dir", "rrt", "rnc"])
def test_predictions_of_the_test_rows_equal_the_evaluations(runs, table, tmp_path, name):
    _, rows = table
    run = tmp_path / "run"
    shutil.copytree(runs[name], run, ignore=shutil.ignore_patterns(".lock"))
    test = _split_indices(run)["test"]
    new = _write(tmp_path / "mine.csv", ["a", "b", "c", "y"], [rows[i] for i in test])
    cols = predict(run, new)
    expected = _test_predictions(run)
    assert list(cols) == ["a", "b", "c", "y", "prediction"]
    assert cols["a"] == [rows[i][0] for i in test] and cols["y"] == [rows[i][3] for i in test]  # text as read
    assert len(expected) == len(test) > 0
    np.testing.assert_allclose(np.asarray(cols["prediction"], dtype=np.float64), expected, rtol=1e-6, atol=1e-5)
    assert np.ptp(expected) > 0  # not a constant model: the inputs matter


def test_standardization_uses_the_training_rows_statistics(runs, table, test_rows_file):
    """The plain network on features standardized by hand with the mean/std of the TRAINING rows."""
    import torch

    from rankwise.recipes import rundir
    from rankwise.recipes.registry import get_recipe
    from rankwise.recipes.regression.recipe import build_net
    from rankwise.recipes.runner import load_run_config

    _, rows = table
    run = runs["dir"]
    cfg = load_run_config(run)
    data = rundir.load_data(cfg, get_recipe("dir"))
    idx = data.meta["indices"]
    x = np.asarray([[float(v) for v in r[:3]] for r in rows])
    mean, std = x[idx["train"]].mean(axis=0), x[idx["train"]].std(axis=0)
    assert np.ptp(std) > 10  # scales far apart: standardizing with other statistics would show
    net = build_net(rundir.Run(cfg, run, data, plots=False))
    rundir.Run(cfg, run, data, plots=False).load(net, "best")
    net.eval()
    with torch.no_grad():
        by_hand = net(torch.as_tensor((x[idx["test"]] - mean) / std, dtype=torch.float32)).numpy()
        wrong = net(torch.as_tensor((x[idx["test"]] - x.mean(axis=0)) / x.std(axis=0), dtype=torch.float32)).numpy()
    cols = predict(run, test_rows_file)
    np.testing.assert_allclose(np.asarray(cols["prediction"], dtype=np.float64), by_hand, rtol=1e-5, atol=1e-4)
    # with the statistics of all rows instead, the predictions differ: the test can tell them apart
    assert not np.allclose(wrong, by_hand, atol=1e-4)


def test_a_file_without_the_target_with_other_columns_in_another_order(runs, table, tmp_path, test_rows_file):
    _, expected_rows = _read(test_rows_file)
    want = np.asarray(predict(runs["dir"], test_rows_file)["prediction"], dtype=np.float64)
    # no target, columns reordered, a text column, and a column already named "prediction"
    header = ["id", "c", "prediction", "a", "b"]
    rows = [[f"house-{i}", r[2], "old", r[0], r[1]] for i, r in enumerate(expected_rows)]
    new = _write(tmp_path / "new.csv", header, rows)
    r = invoke(["predict", runs["dir"], "--data", new, "--out", tmp_path / "out.csv"])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert lines == [f"{len(rows)} row(s) predicted: {tmp_path / 'out.csv'}"], r.output  # no target: no MAE
    got_header, got = _read(tmp_path / "out.csv")
    assert got_header == [*header, "prediction_1"]
    assert [g[:-1] for g in got] == rows  # the input as it was
    np.testing.assert_allclose(np.asarray([g[-1] for g in got], dtype=np.float64), want, rtol=1e-6)


def test_cli_default_output_and_the_mae_of_a_file_with_targets(runs, tmp_path, test_rows_file):
    run = tmp_path / "run"
    shutil.copytree(runs["dir"], run, ignore=shutil.ignore_patterns(".lock"))
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    r = invoke(["predict", run, "--data", test_rows_file])
    assert r.exit_code == 0, r.output
    out = run / "predictions" / "test_rows.csv"
    _, got = _read(out)
    pred = np.asarray([g[-1] for g in got], dtype=np.float64)
    y = np.asarray([g[3] for g in got], dtype=np.float64)
    mae = np.mean(np.abs(pred - y))
    assert (
        r.output.strip()
        == f"{len(got)} row(s) predicted: {out}; MAE {mae:.4g} on the {len(got)} row(s) with a target value"
    )
    # the test MAE of the run's metrics is the same number (its own test rows, its best checkpoint)
    saved = json.loads((run / "metrics.json").read_text())["test"]["all"]["mae"]
    assert mae == pytest.approx(saved, rel=1e-5)
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p != out and p.name != ".lock"}
    assert after == {p: b for p, b in before.items() if p.name != ".lock"}  # nothing else written


def test_overwrite_replaces_only_the_output_file(runs, tmp_path, test_rows_file):
    out_dir = tmp_path / "outs"
    out_dir.mkdir()
    out = out_dir / "p.csv"
    out.write_text("mine\n")
    neighbour = out_dir / "keep.txt"
    neighbour.write_text("keep")
    line = one_error_line(invoke(["predict", runs["dir"], "--data", test_rows_file, "--out", out]))
    assert str(out) in line and "--overwrite" in line
    assert out.read_text() == "mine\n"  # untouched
    r = invoke(["predict", runs["dir"], "--data", test_rows_file, "--out", out, "--overwrite"])
    assert r.exit_code == 0, r.output
    assert _read(out)[0] == ["a", "b", "c", "y", "prediction"]
    assert sorted(p.name for p in out_dir.iterdir()) == ["keep.txt", "p.csv"] and neighbour.read_text() == "keep"


def test_write_predictions_refuses_an_existing_file_and_writes_float32_exactly(tmp_path):
    cols = {"x": ["1", "2"], "prediction": np.asarray([0.1, 123.456], dtype=np.float32)}
    path = write_predictions(cols, tmp_path / "a" / "p.csv")
    header, rows = _read(path)
    assert header == ["x", "prediction"] and [r[0] for r in rows] == ["1", "2"]
    assert np.array_equal(np.asarray([r[1] for r in rows], dtype=np.float32), cols["prediction"])
    nan = write_predictions({"x": ["1", "2"], "p": np.asarray([np.nan, 2.0])}, tmp_path / "nan.csv")
    assert nan.read_bytes() == b"x,p\n1,\n2,2.0\n"  # NaN: an empty cell; Unix line ends
    with pytest.raises(ValueError, match="exists; pass --overwrite"):
        write_predictions(cols, path)
    write_predictions({"x": ["3"], "prediction": [1.5]}, path, overwrite=True)
    assert _read(path)[1] == [["3", "1.5"]]
    assert sorted(p.name for p in path.parent.iterdir()) == ["p.csv"]  # no temporary file left
    with pytest.raises(ValueError, match="one length"):
        write_predictions({"x": ["1"], "y": [1, 2]}, tmp_path / "b.csv")


def test_checkpoint_option_chooses_the_file(runs, tmp_path, test_rows_file):
    """``--checkpoint last`` predicts with last.ckpt: here best.ckpt with its head's bias raised by 1."""
    import torch

    run = tmp_path / "run"
    shutil.copytree(runs["dir"], run, ignore=shutil.ignore_patterns(".lock"))
    ckpt = torch.load(run / "checkpoints" / "best.ckpt", weights_only=True)
    ckpt["state_dict"]["head.bias"] += 1.0
    torch.save(ckpt, run / "checkpoints" / "last.ckpt")
    best = np.asarray(predict(run, test_rows_file, checkpoint="best")["prediction"], dtype=np.float64)
    last = np.asarray(predict(run, test_rows_file, checkpoint="last")["prediction"], dtype=np.float64)
    default = np.asarray(predict(run, test_rows_file)["prediction"], dtype=np.float64)
    assert np.array_equal(default, best)  # the recipe's choice, as `rankwise evaluate`
    np.testing.assert_allclose(last - best, 1.0, atol=1e-4)


def test_header_only_file_gives_zero_rows(runs, tmp_path):
    new = _write(tmp_path / "empty.csv", ["b", "a", "c"], [])
    r = invoke(["predict", runs["dir"], "--data", new, "--out", tmp_path / "o.csv"])
    assert r.exit_code == 0, r.output
    assert r.output.strip() == f"0 row(s) predicted: {tmp_path / 'o.csv'}"
    assert _read(tmp_path / "o.csv") == (["b", "a", "c", "prediction"], [])


def test_user_errors_are_one_line(runs, tmp_path, test_rows_file):
    run = runs["dir"]
    out = tmp_path / "o.csv"

    def fails(args):
        return one_error_line(invoke(["predict", *args, "--out", out]))

    missing = _write(tmp_path / "missing.csv", ["a", "c"], [["1", "2"]])
    line = fails([run, "--data", missing])
    assert str(missing) in line and "'b'" in line and "missing feature column" in line
    bad = _write(tmp_path / "bad.csv", ["a", "b", "c"], [["1", "2", "3"], ["1", "x2", "3"]])
    line = fails([run, "--data", bad])
    assert f"{bad}, row 3: column 'b': cannot parse 'x2' as a number" in line
    short = _write(tmp_path / "short.csv", ["a", "b", "c"], [["1", "2"]])
    assert f"{short}, row 2: expected 3 fields, got 2" in fails([run, "--data", short])
    assert "data file not found" in fails([run, "--data", tmp_path / "nope.csv"])
    assert "not a run directory" in fails([tmp_path / "no_run", "--data", test_rows_file])
    assert "--checkpoint must be 'best' or 'last'" in fails([run, "--data", test_rows_file, "--checkpoint", "first"])
    unfinished = tmp_path / "unfinished"
    shutil.copytree(run, unfinished, ignore=shutil.ignore_patterns(".lock", "checkpoints"))
    line = fails([unfinished, "--data", test_rows_file])
    assert "cannot predict" in line and "checkpoints/best.ckpt" in line
    line = one_error_line(invoke(["predict", run, "--data", test_rows_file, "--out", tmp_path]))  # a folder
    assert "is a directory" in line
    moved = tmp_path / "moved"
    shutil.copytree(run, moved, ignore=shutil.ignore_patterns(".lock"))
    cfg = yaml.safe_load((moved / "config.yaml").read_text())
    cfg["data"]["options"]["path"] = str(tmp_path / "gone.csv")
    (moved / "config.yaml").write_text(yaml.safe_dump(cfg))
    line = fails([moved, "--data", test_rows_file])  # config.yaml's data section is not the one trained
    assert "`data.options.path`" in line and str(tmp_path / "gone.csv") in line
    (moved / "data.json").unlink()  # a run without its data record reads its training file
    line = fails([moved, "--data", test_rows_file])
    assert "cannot read the run's training data" in line and f"{tmp_path / 'gone.csv'}: data file not found" in line
    blocked = tmp_path / "a_file"
    blocked.write_text("x")
    line = one_error_line(invoke(["predict", run, "--data", test_rows_file, "--out", blocked / "p.csv"]))
    assert f"cannot write {blocked / 'p.csv'}" in line and blocked.read_text() == "x"
    line = one_error_line(invoke(["predict", run, "--data", test_rows_file, "--out", test_rows_file, "--overwrite"]))
    assert "would replace the input file" in line
    assert not out.exists()


def _config_only_run(path: Path, preset: str, overrides: list[str] = ()) -> Path:
    from rankwise.recipes.rundir import RunDir

    path.mkdir()
    RunDir(path, None).write_config(load_config(preset, list(overrides)))
    return path


def test_recipes_and_datasets_that_cannot_predict(tmp_path, test_rows_file, monkeypatch):
    sort_run = _config_only_run(tmp_path / "sort", "large_mnist_softsort")
    line = one_error_line(invoke(["predict", sort_run, "--data", test_rows_file]))
    assert "recipe 'sort' cannot predict from a file" in line
    can = line.split("the recipes that can: ")[1].split(", ")
    assert {"dir", "rrt", "rnc", "supcon", "retrieval"} <= set(can) and "sort" not in can and "dknn" not in can
    # a dir run on text pairs (its data are not needed to refuse it)
    from rankwise.recipes.rundir import _lifecycle

    monkeypatch.setattr(_lifecycle, "load_data", lambda cfg, recipe: None)
    text_run = _config_only_run(tmp_path / "text", "sts_b_dir_vanilla")
    line = one_error_line(invoke(["predict", text_run, "--data", test_rows_file]))
    assert "datasets abalone, agedb_dir, csv, image_csv, imdb_wiki_dir;" in line and "'stsb_dir'" in line
    assert not (sort_run / "predictions").exists() and not (text_run / "predictions").exists()


def test_cli_predict_imports_no_lightning(runs, tmp_path, test_rows_file):
    out = tmp_path / "p.csv"
    args = [str(runs["dir"]), "--data", str(test_rows_file), "--out", str(out)]
    probe, output = cli_in_fresh_interpreter(["predict", *args])
    assert probe == {"code": 0, "heavy": []}, output
    assert _read(out)[0][-1] == "prediction" and len(_read(out)[1]) == len(_read(test_rows_file)[1])


# ------------------------------------------------------------------------------------------ image_csv


#: overrides that train a tiny image regressor on 16x16 images in a second
_IMAGE_TINY = [
    "data.options.image_size=16",
    "model.backbone=small_cnn",
    "model.options={in_channels: 3, feature_dim: 8}",
    "data.num_workers=0",
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=2",
    "trainer.num_threads=1",
    "report.plots=false",
]


def _faces(root: Path, n: int, *, seed: int) -> list[list[str]]:
    """``n`` 12x12 images in ``root/img`` whose brightness follows an age; rows ``[img/i.png, age]``."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    (root / "img").mkdir()
    rows = []
    for i in range(n):
        age = int(rng.integers(20, 80))
        arr = np.clip(rng.normal(age * 3, 20, size=(12, 12, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(arr).save(root / "img" / f"{i}.png")
        rows.append([f"img/{i}.png", str(age)])
    return rows


@pytest.fixture(scope="module")
def image_run(tmp_path_factory):
    """A tiny image_csv run (60 12x12 images whose brightness is the target, a small CNN)."""
    root = tmp_path_factory.mktemp("faces")
    rows = _faces(root, 60, seed=1)
    listing = _write(root / "faces.csv", ["file", "age"], rows)
    sets = ["data.options.image_column=file", *_IMAGE_TINY]
    cfg, _ = own_data_config(listing, "age", "vanilla", dataset="image_csv", overrides=sets)
    run = train(cfg, out=root / "run", progress=False, verbose=False).run_dir
    return run, listing, rows


def test_image_predictions_of_the_test_rows_equal_the_evaluations(image_run, tmp_path):
    run, listing, rows = image_run
    test = _split_indices(run)["test"]
    # the new list lives in another folder: its paths are relative to it (as the loader resolves them)
    (tmp_path / "img").symlink_to(listing.parent / "img")
    new = _write(tmp_path / "new.csv", ["note", "file"], [[f"n{i}", rows[i][0]] for i in test])
    cols = predict(run, new)
    assert list(cols) == ["note", "file", "prediction"] and cols["file"] == [rows[i][0] for i in test]
    expected = _test_predictions(run)
    assert len(expected) == len(test) > 0
    np.testing.assert_allclose(np.asarray(cols["prediction"], dtype=np.float64), expected, rtol=1e-5, atol=1e-4)


def test_missing_image_is_one_error_naming_file_row_and_image(image_run, tmp_path):
    run, listing, rows = image_run
    new = _write(tmp_path / "new.csv", ["file"], [[str(listing.parent / rows[0][0])], ["img/none.png"]])
    line = one_error_line(invoke(["predict", run, "--data", new, "--out", tmp_path / "o.csv"]))
    assert f"{new}, row 3: image file not found: {tmp_path / 'img' / 'none.png'}" in line
    nocol = _write(tmp_path / "nocol.csv", ["path"], [[rows[0][0]]])
    line = one_error_line(invoke(["predict", run, "--data", nocol, "--out", tmp_path / "o.csv"]))
    assert str(nocol) in line and "missing column(s) ['file']" in line
    assert not (tmp_path / "o.csv").exists()


@pytest.mark.filterwarnings("ignore::rankwise.recipes.common.DataDefaultsWarning")  # 48 images: empty shot groups
def test_agedb_style_run_predicts_images_under_its_root(tmp_path):
    """A preset of the DIR image benchmarks (split file ``age,path,split``, images under ``root``): the
    new list's paths are relative to the run's ``data.options.root``, wherever the list is."""
    root = tmp_path / "agedb"
    root.mkdir()
    rows = _faces(root, 48, seed=2)
    splits = ["train"] * 32 + ["val"] * 8 + ["test"] * 8
    split_file = _write(root / "agedb.csv", ["age", "path", "split"], [[a, p, s] for (p, a), s in zip(rows, splits)])
    cfg = load_config(
        "agedb_dir_vanilla",
        [
            f"data.options.csv={split_file}",
            f"data.options.root={root}",
            "data.batch_size=16",
            *_IMAGE_TINY,
        ],
    )
    run = train(cfg, out=tmp_path / "run", progress=False, verbose=False).run_dir
    elsewhere = tmp_path / "lists"
    elsewhere.mkdir()
    new = _write(elsewhere / "new.csv", ["path", "age"], [r for r, s in zip(rows, splits) if s == "test"])
    r = invoke(["predict", run, "--data", new])
    assert r.exit_code == 0, r.output
    _, got = _read(run / "predictions" / "new.csv")
    pred = np.asarray([g[-1] for g in got], dtype=np.float64)
    np.testing.assert_allclose(pred, _test_predictions(run), rtol=1e-5, atol=1e-4)
    mae = np.mean(np.abs(pred - np.asarray([g[1] for g in got], dtype=np.float64)))
    assert f"MAE {mae:.4g} on the 8 row(s)" in r.output  # the column `age` is the target


def test_abalone_run_predicts_rows_of_the_abalone_table(tmp_path):
    """An abalone preset's run: the table's columns by name (``rings`` optional), the one-hot sex and
    the measurements standardized with the training rows' statistics, as the loader builds them."""
    import zipfile

    from rankwise.data import abalone_path

    pytest.importorskip("sklego")
    run = train(load_config("abalone_lds", TINY), out=tmp_path / "run", progress=False, verbose=False).run_dir
    with zipfile.ZipFile(abalone_path()) as zf:
        text = zf.read(zf.namelist()[0]).decode()
    header, *rows = list(csv.reader(text.splitlines()))
    test = _split_indices(run)["test"]
    order = [header.index(c) for c in ("shell_weight", "sex", "length", "diameter", "height")]
    order += [header.index(c) for c in ("whole_weight", "shucked_weight", "viscera_weight")]
    new = _write(tmp_path / "shells.csv", [header[i] for i in order], [[rows[t][i] for i in order] for t in test])
    cols = predict(run, new)
    assert list(cols)[-1] == "prediction" and "rings" not in cols
    np.testing.assert_allclose(np.asarray(cols["prediction"], dtype=np.float64), _test_predictions(run), rtol=1e-5)


def test_mae_counts_only_the_rows_with_a_numeric_target():
    from rankwise.recipes.runner import predictions_mae

    cols = {
        "y": ["1", "x", "3", " ", "nan"],
        "prediction": ["9", "9", "9", "9", "9"],  # the file's own column of that name
        "prediction_1": np.asarray([2.0, 5.0, 4.5, 7.0, 1.0], dtype=np.float32),
        "note": ["a", "b", "c", "d", "e"],
    }
    assert predictions_mae(cols, "y") == (pytest.approx((1.0 + 1.5) / 2), 2)
    assert predictions_mae({**cols, "y": ["", "x", "-", "", ""]}, "y") is None
    assert predictions_mae(cols, "price") is None


def test_out_never_replaces_the_runs_own_files_or_its_training_file(runs, table, tmp_path, test_rows_file):
    """--overwrite replaces a predictions file, never a file the run needs (config, checkpoints, data)."""
    run = tmp_path / "run"
    shutil.copytree(runs["dir"], run, ignore=shutil.ignore_patterns(".lock"))
    data = tmp_path / "train.csv"
    shutil.copyfile(table[0], data)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["data"]["options"]["path"] = str(data)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    record = json.loads((run / "data.json").read_text())  # the run as trained on `data`
    record["data"]["options"]["path"] = str(data)
    record["files"] = [{**f, "path": str(data)} for f in record["files"]]
    (run / "data.json").write_text(json.dumps(record))
    before = {p: p.read_bytes() for p in [data, *run.rglob("*")] if p.is_file()}
    for out in (run / "config.yaml", run / "metrics.json", run / "checkpoints" / "best.ckpt", run / "new.csv"):
        line = one_error_line(invoke(["predict", run, "--data", test_rows_file, "--out", out, "--overwrite"]))
        assert str(out) in line and "run directory" in line and "predictions" in line
    line = one_error_line(invoke(["predict", run, "--data", test_rows_file, "--out", data, "--overwrite"]))
    assert str(data) in line and "training data" in line
    assert {p: p.read_bytes() for p in [data, *run.rglob("*")] if p.is_file()} == before
    r = invoke(["predict", run, "--data", test_rows_file, "--out", run / "predictions" / "p.csv"])
    assert r.exit_code == 0, r.output  # the run's predictions folder is where they belong


def test_a_symlink_as_out_is_an_existing_file_and_overwrite_writes_through_it(runs, tmp_path, test_rows_file):
    dangling = tmp_path / "dangling.csv"
    dangling.symlink_to(tmp_path / "elsewhere.csv")
    line = one_error_line(invoke(["predict", runs["dir"], "--data", test_rows_file, "--out", dangling]))
    assert str(dangling) in line and "--overwrite" in line
    assert dangling.is_symlink() and not (tmp_path / "elsewhere.csv").exists()
    target = tmp_path / "kept" / "target.csv"
    target.parent.mkdir()
    target.write_text("old\n")
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    r = invoke(["predict", runs["dir"], "--data", test_rows_file, "--out", link, "--overwrite"])
    assert r.exit_code == 0, r.output
    assert link.is_symlink() and link.resolve() == target.resolve()  # the link stays a link ...
    assert _read(target)[0] == ["a", "b", "c", "y", "prediction"]  # ... and its file holds the predictions
    assert sorted(p.name for p in target.parent.iterdir()) == ["target.csv"]


def test_out_naming_a_folder_writes_nothing(runs, tmp_path, test_rows_file):
    """``--out folder/`` (a trailing separator) and the run's predictions folder itself name folders."""
    run = tmp_path / "run"
    shutil.copytree(runs["dir"], run, ignore=shutil.ignore_patterns(".lock", "predictions"))
    for out in (f"{tmp_path / 'new_folder'}/", str(run / "predictions")):
        line = one_error_line(invoke(["predict", run, "--data", test_rows_file, "--out", out]))
        assert out.rstrip("/") in line and "folder" in line
    assert not (tmp_path / "new_folder").exists() and not (run / "predictions").exists()


def test_a_run_in_use_is_refused_with_advice_that_fits_predict(runs, tmp_path, test_rows_file):
    from rankwise.recipes.rundir import RunDir

    run = tmp_path / "run"
    shutil.copytree(runs["dir"], run, ignore=shutil.ignore_patterns(".lock"))
    held = RunDir.lock_existing(run)  # as a training process holds it
    try:
        line = one_error_line(invoke(["predict", run, "--data", test_rows_file, "--out", tmp_path / "o.csv"]))
    finally:
        held.close()
    assert f"run directory {run} is in use by another rankwise process" in line
    assert "--out" not in line and "wait for it to finish" in line  # predict's --out is not the run's
    assert not (tmp_path / "o.csv").exists()


def test_a_run_of_a_semicolon_table_reads_new_files_with_its_delimiter(table, tmp_path):
    path, rows = table
    semi = tmp_path / "semi.csv"
    semi.write_text("\n".join(";".join(r) for r in [["a", "b", "c", "y"], *rows]) + "\n")
    cfg, _ = own_data_config(semi, "y", "vanilla", overrides=[*TINY, "data.options.delimiter=;"])
    run = train(cfg, out=tmp_path / "run", progress=False, verbose=False).run_dir
    cols = predict(run, semi)
    assert cols["a"] == [r[0] for r in rows] and len(cols["prediction"]) == len(rows)
    line = one_error_line(invoke(["predict", run, "--data", path, "--out", tmp_path / "o.csv"]))
    assert str(path) in line and "missing feature column" in line
    assert "the run reads files delimited by ';'" in line and "data.options.delimiter" in line
    assert not (tmp_path / "o.csv").exists()
