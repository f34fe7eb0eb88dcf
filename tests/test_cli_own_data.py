"""A newcomer's route through the command line: their own CSV, `data show`, help, progress, tables, presets."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

pytest.importorskip("typer")
pytest.importorskip("lightning")
pytest.importorskip("sklearn")
pytest.importorskip("yaml")

import yaml
from typer.testing import CliRunner

from rankwise.cli import app
from tests.cli_helpers import one_error_line

runner = CliRunner()

TINY = [
    "--set",
    "trainer.max_epochs=1",
    "--set",
    "trainer.limit_train_batches=2",
    "--set",
    "trainer.num_threads=1",
    "--set",
    "report.plots=false",
    "--no-progress",
]


def invoke(args):
    return runner.invoke(app, args, catch_exceptions=False)


@pytest.fixture(scope="module")
def diabetes(tmp_path_factory):
    """sklearn's diabetes data (442 rows, integer targets 25..346) as a CSV nobody here wrote."""
    from sklearn.datasets import load_diabetes

    path = tmp_path_factory.mktemp("own") / "diabetes.csv"
    load_diabetes(as_frame=True, scaled=False).frame.to_csv(path, index=False)
    return path


def _train_bins(run_dir, width):
    """Training labels of a run (from the CSV and the saved split indices is not stored: recompute the split)."""
    import pandas as pd

    from rankwise.data import random_split_indices

    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    y = pd.read_csv(cfg["data"]["options"]["path"])["target"].to_numpy(dtype=float)
    train, _, test = random_split_indices(len(y), val_fraction=0.1, test_fraction=0.2, seed=0)
    return np.floor(y[train] / width).astype(int), np.floor(y[test] / width).astype(int)


def _check_data_driven(run_dir, output):
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert "abalone" not in cfg["description"].lower() and "diabetes.csv" in cfg["description"]
    assert cfg["data"]["name"] == "csv" and set(cfg["data"]["options"]) == {"path", "target"}  # no per_label
    # 310 training rows: the largest power of two <= 310 / 8 is 32
    assert cfg["data"]["batch_size"] == 32
    # bins of 20 (about sqrt(442) = 21 bins over 25..346, rounded to 1/2/5 x 10^k); many-shot above the
    # mean training count of an occupied bin, few-shot below a fifth of it
    train_bins, test_bins = _train_bins(run_dir, 20.0)
    mean = len(train_bins) / len(np.unique(train_bins))
    assert cfg["report"]["many_shot"] == pytest.approx(mean) and cfg["report"]["few_shot"] == pytest.approx(mean / 5)
    counts = {b: int((train_bins == b).sum()) for b in np.unique(train_bins)}
    n = np.array([counts.get(b, 0) for b in test_bins])
    m = json.loads((run_dir / "metrics.json").read_text())["test"]
    assert m["many"]["count"] == int((n > mean).sum()) > 0
    assert m["few"]["count"] == int((n < mean / 5).sum())
    assert m["many"]["count"] + m["medium"]["count"] + m["few"]["count"] == 88


def test_own_csv_route_derives_bins_thresholds_batch_and_epochs(diabetes, tmp_path):
    run = tmp_path / "lds"
    r = invoke(["train", "--data", str(diabetes), "--target", "target", "--method", "lds", "--out", str(run), *TINY])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith("defaults from")]
    assert len(lines) == 1, r.output  # printed once
    # 310 // 32 = 9 steps per epoch (the last partial batch is dropped): 1000 / 9 -> 111 epochs, which
    # the line names beside the value --set gave, the one the run uses
    assert "bin width 20;" in lines[0] and "batch size 32;" in lines[0]
    assert "; 1 epochs (--set; the data's 111) (310 training rows)" in lines[0]
    assert "many-shot > 18.2" in lines[0] and "few-shot < 3.65" in lines[0]
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["trainer"]["max_epochs"] == 1  # --set wins over the derived 111
    assert cfg["task"]["lds"] == {"reweight": "sqrt_inv", "lds": True, "kernel": "gaussian", "ks": 5, "sigma": 2.0}
    assert "expected_time" not in cfg or cfg["expected_time"] == ""
    _check_data_driven(run, r.output)


def test_preset_switched_to_a_csv_rederives_and_warns(diabetes, tmp_path):
    run = tmp_path / "set"
    r = invoke(
        [
            "train",
            "abalone_lds",
            "--set",
            "data.name=csv",
            "--set",
            f"data.options.path={diabetes}",
            "--set",
            "data.options.target=target",
            "--out",
            str(run),
            *TINY,
        ]
    )
    assert r.exit_code == 0, r.output
    warning = [ln for ln in r.output.splitlines() if ln.startswith("warning:")]
    assert len(warning) == 1 and "per_label" in warning[0] and "data.batch_size 256 -> 32" in warning[0], r.output
    _check_data_driven(run, r.output)


def test_empty_shot_group_of_the_test_split_warns(diabetes, tmp_path):
    args = ["train", "--data", str(diabetes), "--target", "target", "--method", "vanilla", *TINY]
    r = invoke([*args, "--out", str(tmp_path / "a"), "--set", "report.many_shot=1000"])
    assert r.exit_code == 0, r.output
    warning = [ln for ln in r.output.splitlines() if ln.startswith("warning:")]
    assert len(warning) == 1 and "no many-shot example" in warning[0], r.output
    m = json.loads((tmp_path / "a" / "metrics.json").read_text())["test"]
    assert m["many"]["count"] == 0
    r = invoke([*args, "--out", str(tmp_path / "b")])  # the data's own thresholds: every group has examples
    assert r.exit_code == 0 and "warning:" not in r.output, r.output


def test_data_route_needs_a_target_and_a_known_method(diabetes, tmp_path):
    r = invoke(["train", "--data", str(diabetes), "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and r.output.count("error:") == 1 and "--target" in r.output
    r = invoke(
        ["train", "--data", str(diabetes), "--target", "target", "--method", "lsd", "--out", str(tmp_path / "x")]
    )
    line = one_error_line(r)
    assert "unknown --method 'lsd'; did you mean 'lds'" in line and "valid methods: balanced_mse," in line
    r = invoke(["train", "abalone_lds", "--data", str(diabetes), "--target", "target"])
    assert r.exit_code == 2 and r.output.startswith("error:")
    assert not (tmp_path / "x").exists()


def test_image_csv_route(tmp_path):
    """Images in folders listed by a CSV of paths and targets train through the same route."""
    from PIL import Image

    rng = np.random.default_rng(0)
    (tmp_path / "img").mkdir()
    rows = ["file,age"]
    for i in range(60):
        age = int(rng.integers(20, 80))
        arr = np.full((12, 12, 3), age * 3, dtype=np.uint8)
        Image.fromarray(arr).save(tmp_path / "img" / f"{i}.png")
        rows.append(f"img/{i}.png,{age}")
    (tmp_path / "faces.csv").write_text("\n".join(rows) + "\n")
    run = tmp_path / "run"
    r = invoke(
        [
            "train",
            "--data",
            str(tmp_path / "faces.csv"),
            "--target",
            "age",
            "--dataset",
            "image_csv",
            "--method",
            "vanilla",
            "--out",
            str(run),
            "--set",
            "data.options.image_column=file",
            "--set",
            "data.options.image_size=16",
            "--set",
            "model.backbone=resnet18",
            "--set",
            "data.num_workers=0",
            *TINY,
        ]
    )
    assert r.exit_code == 0, r.output
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["data"]["name"] == "image_csv" and cfg["data"]["batch_size"] == 16  # 42 training rows: floor at 16
    assert "faces.csv" in cfg["description"] and "AgeDB" not in cfg["description"]
    m = json.loads((run / "metrics.json").read_text())["test"]
    assert m["all"]["count"] == 12  # 20 % of 60


def test_data_kind_hook_registers_another_csv_loader(diabetes):
    """A loader of a CSV with other option names joins the route through register_own_data."""
    from rankwise.data import DATASET_SPECS, dataset_spec, load_csv, register_dataset
    from rankwise.recipes import own_data

    def load_listing(listing, label):
        return load_csv(listing, label)

    register_dataset("listing", modality="table")(load_listing)
    try:
        own_data.register_own_data("listing", file_option="listing", target_option="label", presets="abalone")
        assert dataset_spec("listing").own_data is own_data.own_datasets()["listing"]
        cfg, d = own_data.own_data_config(diabetes, "target", "vanilla", dataset="listing")
    finally:
        DATASET_SPECS.pop("listing")
    assert cfg.data.name == "listing" and cfg.data.options == {"listing": str(diabetes), "label": "target"}
    assert (d.bin_width, d.batch_size) == (20.0, 32)
    assert "listing" not in own_data.own_datasets()


def test_data_show_csv_without_options_shows_the_syntax():
    r = invoke(["data", "show", "csv"])
    assert r.exit_code == 2
    err = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "-O path=... -O target=..." in err[0], r.output
    assert "Traceback" not in r.output


def test_data_show_prints_plain_text_and_the_datasets_thresholds(diabetes):
    r = invoke(["data", "show", "csv", "-O", f"path={diabetes}", "-O", "target=target"])
    assert r.exit_code == 0, r.output
    for markup in ("``", ":class:`", ":func:`", ":math:`"):
        assert markup not in r.output
    # the doctest line is whole (rich markup would eat "[...]" and wrapping would split it)
    assert '>>> rows = ["x1,x2,y"] + [f"{a:.3f},{b:.3f},{int(50 + 100 * a * a)}" for a, b in rng.random((400, 2))]' in (
        r.output
    )
    hist = {}
    for ln in r.output.splitlines():
        parts = ln.split()
        if len(parts) >= 3 and parts[2] in ("many", "med", "few") and parts[1].isdigit():
            hist[float(parts[0])] = (int(parts[1]), parts[2])
    assert hist, r.output
    mean = sum(c for c, _ in hist.values()) / sum(1 for c, _ in hist.values() if c)
    for count, shot in hist.values():  # the data's thresholds (about 18 / 3.6), not 100 / 20
        assert shot == ("many" if count > mean else "few" if count < mean / 5 else "med")
    assert any(shot == "many" for _, shot in hist.values())


def test_flags_print_as_flags_and_arguments_as_names():
    for args in (["--help"], ["train", "--help"], ["evaluate", "--help"], ["data", "show", "--help"]):
        out = invoke(args).output
        assert "<bool>" not in out, args
        assert not re.search(r"\{\w+\}", out.split("\n\n")[0] + out), args
    assert "Usage: rankwise train [OPTIONS] [CONFIG]" in invoke(["train", "--help"]).output
    assert "Usage: rankwise compare [OPTIONS] SOURCES..." in invoke(["compare", "--help"]).output
    assert "Usage: rankwise data show [OPTIONS] NAME" in invoke(["data", "show", "--help"]).output
    assert re.search(r"--debug\s+show the traceback", invoke(["--help"]).output)


def test_progress_bar_counts_epochs_like_the_epoch_lines(tmp_path):
    """The per-epoch lines say "epoch 25/25" for the last of 25 epochs; so must the progress bar."""
    from rankwise.recipes import load_config
    from rankwise.recipes.rundir import Run

    run = Run(load_config("abalone_vanilla"), tmp_path, None, progress=True)
    trainer = run.trainer(max_epochs=25, loggers=False)
    bar = trainer.progress_bar_callback
    bar._trainer = trainer  # what Lightning's setup does
    assert bar._get_train_description(24).strip() == "Epoch 25/25"  # current_epoch is 0-based
    assert bar._get_train_description(0).strip() == "Epoch 1/25"


def test_tables_are_not_wrapped_when_the_output_is_not_a_terminal(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    out = invoke(["presets"]).output
    row = next(ln for ln in out.splitlines() if "abalone_balanced_mse_gai " in ln)
    assert "own param group, lr 0.01)." in row  # the whole description on the preset's line


def test_presets_show_recipe_dataset_time_and_a_real_sentence(monkeypatch):
    from rankwise.recipes.config import list_presets, load_raw

    monkeypatch.delenv("COLUMNS", raising=False)
    out = invoke(["presets"]).output
    header = next(ln for ln in out.splitlines() if "preset " in ln and "recipe" in ln)
    assert "dataset" in header and "time (2 CPU cores)" in header
    for name, desc in list_presets().items():
        raw = load_raw(name)
        assert raw.get("expected_time"), name
        words = re.findall(r"[A-Za-z]+", desc.split(":", 1)[-1])
        assert len(words) >= 3, (name, desc)  # a sentence, not "softsort."
        assert not re.search(r"seed 00\d", desc), name
        row = next(ln for ln in out.splitlines() if f" {name} " in ln)
        assert raw["expected_time"] in row and str(raw.get("recipe", "dir")) in row


def test_own_data_defaults_follow_the_data_size():
    """Batch size and epochs from the training rows (independent arithmetic)."""
    from types import SimpleNamespace

    from rankwise.recipes.own_data import data_defaults

    for n, batch in ((100, 16), (310, 32), (3813, 256), (100_000, 256)):
        labels = np.arange(n, dtype=float) % 50
        d = data_defaults(SimpleNamespace(train_labels=labels, bin_width=1.0, shot_thresholds=None))
        assert d.batch_size == batch
        steps = max(1, n // batch)
        assert d.max_epochs == min(max(round(1000 / steps), 10), 200)
        assert d.many_shot == pytest.approx(n / 50) and d.few_shot == pytest.approx(n / 250)
        assert math.isclose(d.bin_width, 1.0)


@pytest.mark.parametrize("route", ["data", "preset"])
def test_a_misspelt_data_option_names_the_key_and_the_close_one(diabetes, tmp_path, route):
    preset = ["abalone_vanilla", "--set", "data.name=csv", "--set", f"data.options.path={diabetes}"]
    args = ["train", *(["--data", str(diabetes)] if route == "data" else preset)]
    args += ["--target", "target"] if route == "data" else ["--set", "data.options.target=target"]
    r = invoke([*args, "--set", "data.options.splt=dir", "--out", str(tmp_path / "x")])
    line = one_error_line(r)
    assert "unknown option `data.options.splt`; did you mean 'split'" in line, line
    assert "valid keys:" in line and "test_fraction" in line and "unexpected keyword" not in line
    assert not (tmp_path / "x").exists()
