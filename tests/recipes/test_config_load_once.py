"""One config load reads each file of its ``extends:`` chain once; provenance lives on each config object."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from rankwise.recipes import config_from_dict, load_config
from rankwise.recipes.config import (
    ConfigError,
    _loading,
    config_to_dict,
    inherited_options,
)


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> tuple[collections.Counter[str], collections.Counter[str]]:
    reads: collections.Counter[str] = collections.Counter()
    parses: collections.Counter[str] = collections.Counter()
    read, parse = _loading._read_config_text, _loading.parse_yaml

    def counting_read(path: Path) -> str:
        reads[Path(path).name] += 1
        return read(path)

    def counting_parse(text: str, where: str) -> object:
        parses[where.rsplit("/", 1)[-1] if where.startswith("config file") else where] += 1
        return parse(text, where)

    monkeypatch.setattr(_loading, "_read_config_text", counting_read)
    monkeypatch.setattr(_loading, "parse_yaml", counting_parse)
    return reads, parses


def test_each_file_of_an_extends_chain_is_read_and_parsed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = tmp_path / "base.yaml"
    base.write_text("extends: mslr_web10k_listnet\ndata: {options: {fold: 2}}\n")
    mine = tmp_path / "mine.yaml"
    mine.write_text("extends: base.yaml\ntrainer: {max_epochs: 3}\n")
    reads, parses = _count_reads(monkeypatch)
    cfg = load_config(str(mine), ["data.options.path=elsewhere", "optimizer.lr=0.5"])
    assert (cfg.trainer.max_epochs, cfg.data.options["fold"], cfg.optimizer.lr) == (3, 2, 0.5)
    assert dict(reads) == {"mine.yaml": 1, "base.yaml": 1, "mslr_web10k_listnet.yaml": 1}
    files = {k: v for k, v in parses.items() if k.endswith(".yaml")}
    assert files == {"mine.yaml": 1, "base.yaml": 1, "mslr_web10k_listnet.yaml": 1}
    # the --set values went through the same guarded reader, once each
    assert parses["--set data.options.path"] == 1 and parses["--set optimizer.lr"] == 1
    assert inherited_options(cfg) == {"num_features"}


def test_a_cycle_is_refused_after_reading_each_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    reads, _ = _count_reads(monkeypatch)
    with pytest.raises(ConfigError, match="`extends` cycle"):
        load_config(str(tmp_path / "a.yaml"))
    assert dict(reads) == {"a.yaml": 1, "b.yaml": 1}


def test_provenance_lives_on_each_config(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text("extends: mslr_web10k_listnet\ndata: {options: {num_features: 46}}\n")
    a = load_config("mslr_web10k_listnet")
    b = load_config(str(mine), ["data.options.path=x"])
    c = load_config("mslr_web10k_listnet", ["data.options={path: y, fold: null}"])
    assert inherited_options(a) == {"num_features", "fold", "path"}
    assert inherited_options(b) == {"fold"}
    assert inherited_options(c) == frozenset()
    del b, c  # another config going away changes nothing of this one's
    assert inherited_options(a) == {"num_features", "fold", "path"}
    origin = a._provenance
    assert origin["data.options.num_features"] == ("preset", "mslr_web10k_listnet")
    d = load_config(str(mine), ["optimizer.lr=0.5"])
    assert d._provenance["data.options.num_features"] == ("file", str(mine))
    assert d._provenance["optimizer.lr"] == ("--set", "optimizer.lr=0.5")
    # a config built from a mapping (a saved config.yaml) has no preset values, and equals the loaded one
    e = config_from_dict(config_to_dict(a))
    assert e == a and inherited_options(e) == frozenset()


def test_a_preset_switched_to_a_csv_is_built_without_reading_the_data(tmp_path: Path) -> None:
    """The config of ``--set data.name=csv`` names the file; the run derives the data's values once it reads it."""
    import warnings

    import numpy as np

    from rankwise.data import get_dataset
    from rankwise.recipes.common import DataDefaultsWarning
    from rankwise.recipes.config import dataset_switch
    from rankwise.recipes.own_data import apply_data_defaults

    table = tmp_path / "table.csv"
    switched = ["data.name=csv", f"data.options.path={table}", "data.options.target=y", "trainer.max_epochs=3"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is said before the data are read
        cfg = load_config("abalone_lds", switched)  # the file does not exist yet: nothing reads it
    assert (cfg.data.name, cfg.data.options) == ("csv", {"path": str(table), "target": "y"})
    assert (cfg.data.batch_size, cfg.report.many_shot, cfg.expected_time) == (256, 100.0, "")  # the preset's
    switch = dataset_switch(cfg)
    assert switch is not None and (switch.old, switch.new) == ("abalone", "csv")
    assert switch.options == {"per_label": 10, "seed": 0}  # the preset's, dropped
    assert apply_data_defaults(cfg) is None and dataset_switch(cfg) is switch  # waits for the data

    rng = np.random.default_rng(0)
    rows = ["x,y"] + [f"{a:.4f},{int(50 + 100 * a * a)}" for a in rng.random(400)]
    table.write_text("\n".join(rows) + "\n")
    data = get_dataset("csv", **cfg.data.options)
    with pytest.warns(DataDefaultsWarning) as said:
        d = apply_data_defaults(cfg, data)
    assert d is not None and len(said) == 1
    text = str(said[0].message)
    assert text.startswith("data.name=csv replaces the preset's dataset abalone; its data.options")
    assert "data.batch_size 256 -> 32" in text and "trainer.max_epochs" not in text.split("replacing")[1]
    assert (cfg.data.batch_size, cfg.trainer.max_epochs) == (32, 3)  # --set wins over the data's epochs
    assert (cfg.report.many_shot, cfg.report.few_shot) == (d.many_shot, d.few_shot)
    assert cfg.description.startswith("table.csv, target y (280 training rows): ")
    assert dataset_switch(cfg) is None and apply_data_defaults(cfg, data) is None  # once


def test_the_trace_of_one_load_reads_each_file_once_and_no_data() -> None:
    """``tools/config_trace.py`` (``sys.setprofile``): one load of a 3-file chain + ``--set``, and of a preset
    switched to a CSV."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "config_trace", Path(__file__).resolve().parents[2] / "tools" / "config_trace.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.run()
    chain = out["extends_chain_and_one_set"]
    assert chain["file_reads"] == ["mine.yaml", "base.yaml", "mslr_web10k_listnet.yaml"]
    assert chain["yaml_parses"] == [*chain["file_reads"], "--set optimizer.lr"]
    switched = out["preset_switched_to_a_csv"]
    assert switched["datasets_loaded"] == [] and not any(m.endswith("own_data") for m in switched["modules"])
    assert sorted(switched["file_reads"]) == ["abalone_lds.yaml", "abalone_vanilla.yaml"]
