"""The feature count of LETOR files through a preset: inherited, set by the user, sparse, and recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

pytest.importorskip("lightning")
pytest.importorskip("sklearn")

from typer.testing import CliRunner

from rankwise.cli import app
from rankwise.data import DataFormatError, load_letor, load_letor_preset
from rankwise.recipes import config_from_dict, load_config
from rankwise.recipes.config import config_to_dict, inherited_options
from tests.cli_helpers import one_error_line

runner = CliRunner()

#: ``--set`` overrides that make an MSLR / Yahoo preset train in a second or two
TINY = [
    "model.options.hidden=[8]",
    "model.options.feature_dim=8",
    "data.batch_size=8",
    "data.num_workers=0",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=2",
    "trainer.num_threads=1",
    "task.slate_length=10",
    "report.plots=false",
]


def _sets(items: list[str]) -> list[str]:
    return [a for item in items for a in ("--set", item)]


def _write_letor(folder: Path, indices: list[int], *, names=("train.txt", "vali.txt", "test.txt"), seed=0) -> Path:
    """Three LETOR files of 2-4 queries whose documents hold the feature ``indices`` (1-based)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for name, queries in zip(names, (4, 2, 2)):
        lines = []
        for q in range(queries):
            for _ in range(5):
                feats = " ".join(f"{i}:{rng.normal():.4f}" for i in indices)
                lines.append(f"{rng.integers(0, 3)} qid:{q + 1} {feats}")
        (folder / name).write_text("\n".join(lines) + "\n")
    return folder


def _input_width(run_dir: Path) -> int:
    """The input width of the trained scorer: the columns of its first linear layer in best.ckpt."""
    state = torch.load(run_dir / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    first = next(v for k, v in state.items() if k.startswith("net.") and v.ndim == 2)
    return int(first.shape[1])


def _saved_num_features(run_dir: Path) -> int:
    return yaml.safe_load((run_dir / "config.yaml").read_text())["data"]["options"]["num_features"]


def _warnings(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.startswith("warning:")]


# ------------------------------------------------------------------------------------- provenance


def test_only_values_a_bundled_preset_gave_are_inherited(tmp_path: Path) -> None:
    cfg = load_config("mslr_web10k_listnet", ["data.options.path=mine", "data.options.fold=null"])
    assert inherited_options(cfg) == {"num_features"}
    cfg = load_config("mslr_web10k_listnet", ["data.options.path=mine", "data.options.num_features=46"])
    assert "num_features" not in inherited_options(cfg) and "fold" in inherited_options(cfg)
    cfg = load_config("mslr_web10k_listnet", ["data.options={path: mine, num_features: 46}"])
    assert inherited_options(cfg) == frozenset()  # the whole mapping is the user's
    mine = tmp_path / "mine.yaml"
    mine.write_text("extends: mslr_web10k_listnet\ndata: {options: {path: mine, fold: null}}\n")
    assert inherited_options(load_config(str(mine))) == {"num_features"}
    mine.write_text("extends: mslr_web10k_listnet\ndata: {options: {path: mine, num_features: 46}}\n")
    assert inherited_options(load_config(str(mine))) == {"fold"}
    outer = tmp_path / "outer.yaml"  # a user file extending a user file extending the preset
    outer.write_text("extends: mine.yaml\nrun: {seed: 3}\n")
    assert inherited_options(load_config(str(outer))) == {"fold"}
    # a config rebuilt from a mapping (a run directory's config.yaml) states every value itself
    assert inherited_options(config_from_dict(config_to_dict(cfg))) == frozenset()


# ------------------------------------------------------------------------------------- loader


def test_a_preset_count_is_kept_only_when_it_fits_the_files(tmp_path: Path) -> None:
    own = _write_letor(tmp_path / "own", list(range(1, 47)))
    data = load_letor_preset(136, path=str(own))  # MSLR's 136 on 46-feature files: the files' count
    assert data.num_features == 46 and data.train.x.shape[1] == 46
    assert data.meta["resolved_options"] == {"num_features": 46} and "does not fit" in data.meta["notes"][0]
    kept = load_letor_preset(60, path=str(own))  # within [46, 92]: kept, silently, padded with zeros
    assert kept.num_features == 60 and kept.meta["notes"] == []
    assert torch.equal(kept.train.x[:, :46], data.train.x) and not kept.train.x[:, 46:].any()
    wide = _write_letor(tmp_path / "wide", [1, 20, 150])
    above = load_letor_preset(136, path=str(wide))  # an index above the preset's count: the files' count
    assert above.num_features == 150 and "150" in above.meta["notes"][0]


def test_an_explicit_count_is_checked_against_the_files(tmp_path: Path) -> None:
    own = _write_letor(tmp_path / "own", list(range(1, 47)))
    with pytest.raises(DataFormatError, match=r"train\.txt, row 1: feature index 41 is above `num_features` = 40"):
        load_letor(str(own), num_features=40)
    with pytest.raises(DataFormatError, match=r"data\.options\.num_features"):
        load_letor(str(own), num_features=40)
    far = load_letor(str(own), num_features=136)  # kept, with a note
    assert far.num_features == 136 and "90 of them always 0" in far.meta["notes"][0]
    assert load_letor(str(own), num_features=46).meta["notes"] == []
    assert load_letor(str(own)).num_features == 46


def test_yahoo_like_sparse_indices_below_the_count_are_normal(tmp_path: Path) -> None:
    sparse = sorted(np.random.default_rng(1).choice(np.arange(1, 691), size=60, replace=False).tolist())
    names = ("set1.train.txt", "set1.valid.txt", "set1.test.txt")
    root = _write_letor(tmp_path / "yahoo", sparse, names=names)
    opts: dict[str, Any] = {"train": names[0], "val": names[1], "test": names[2]}
    explicit = load_letor(str(root), **opts, num_features=700)
    preset = load_letor_preset(700, path=str(root), **opts)
    for data in (explicit, preset):
        assert data.num_features == 700 and data.meta["notes"] == []
        assert data.meta["max_feature_index"] == max(sparse)


# ------------------------------------------------------------------------------------- command line


def test_own_files_through_the_mslr_preset_record_their_feature_count(tmp_path: Path) -> None:
    own = _write_letor(tmp_path / "own_ltr", list(range(1, 47)))
    run_dir = tmp_path / "run"
    args = ["train", "mslr_web10k_listnet", "--no-progress", "-o", str(run_dir)]
    r = runner.invoke(app, [*args, *_sets([f"data.options.path={own}", "data.options.fold=null", *TINY])])
    assert r.exit_code == 0, r.output
    (warning,) = _warnings(r.output)
    assert "`data.options.num_features` = 136 of the preset" in warning and "using 46" in warning
    assert _saved_num_features(run_dir) == 46 and _input_width(run_dir) == 46
    again = runner.invoke(app, ["evaluate", str(run_dir), "--no-plots"])  # reads the recorded 46
    assert again.exit_code == 0 and not _warnings(again.output), again.output


def test_an_index_above_an_explicit_count_is_one_error_line(tmp_path: Path) -> None:
    own = _write_letor(tmp_path / "own_ltr", list(range(1, 47)))
    run_dir = tmp_path / "run"
    sets = [f"data.options.path={own}", "data.options.fold=null", "data.options.num_features=40", *TINY]
    r = runner.invoke(app, ["train", "mslr_web10k_listnet", "--no-progress", "-o", str(run_dir), *_sets(sets)])
    line = one_error_line(r)
    assert line.startswith(f"error: {own / 'train.txt'}, row 1: feature index 41 is above `num_features` = 40")
    assert "`data.options.num_features`" in line
    assert not run_dir.exists()


def test_an_explicit_count_far_above_the_files_is_kept_with_one_warning(tmp_path: Path) -> None:
    own = _write_letor(tmp_path / "own_ltr", list(range(1, 47)))
    run_dir = tmp_path / "run"
    sets = [f"data.options.path={own}", "data.options.fold=null", "data.options.num_features=136", *TINY]
    r = runner.invoke(app, ["train", "mslr_web10k_listnet", "--no-progress", "-o", str(run_dir), *_sets(sets)])
    assert r.exit_code == 0, r.output
    (warning,) = _warnings(r.output)
    assert "136 is far above the largest feature index" in warning and "(46)" in warning
    assert _saved_num_features(run_dir) == 136 and _input_width(run_dir) == 136


@pytest.mark.parametrize(
    ("preset", "indices", "layout", "width"),
    [
        ("mslr_web10k_listnet", list(range(1, 137)), "Fold1", 136),  # MSLR-WEB10K's dense 136 features
        ("yahoo_ltr_listnet", list(range(3, 690, 7)), "set1", 700),  # Yahoo's sparse 700-index space
    ],
)
def test_the_presets_own_data_keeps_the_presets_count(tmp_path, preset, indices, layout, width) -> None:
    if layout == "Fold1":
        _write_letor(tmp_path / "data" / "Fold1", indices)
    else:
        _write_letor(tmp_path / "data", indices, names=("set1.train.txt", "set1.valid.txt", "set1.test.txt"))
    run_dir = tmp_path / "run"
    sets = [f"data.options.path={tmp_path / 'data'}", *TINY]
    r = runner.invoke(app, ["train", preset, "--no-progress", "-o", str(run_dir), *_sets(sets)])
    assert r.exit_code == 0, r.output
    assert not _warnings(r.output), r.output
    assert _saved_num_features(run_dir) == width and _input_width(run_dir) == width


def test_compare_records_the_files_count_in_every_seeds_config(tmp_path: Path) -> None:
    from rankwise.recipes.runner import compare

    own = _write_letor(tmp_path / "own_ltr", list(range(1, 47)))
    sets = [f"data.options.path={own}", "data.options.fold=null", *TINY]
    with pytest.warns(UserWarning, match="using 46"):
        res = compare(["mslr_web10k_listnet"], seeds=[0, 1], out=tmp_path / "cmp", overrides=sets)
    for run_dir in res.run_dirs["mslr_web10k_listnet"]:  # the second seed reuses the loaded data
        assert _saved_num_features(run_dir) == 46 and _input_width(run_dir) == 46
