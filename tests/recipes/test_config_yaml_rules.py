"""Config files and ``--set`` values are read by the YAML 1.2 core schema; ``config.yaml`` reads back the same."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("yaml")

from rankwise.recipes import load_config
from rankwise.recipes.config import ConfigError, config_to_dict, dump_yaml, parse_yaml


@pytest.mark.parametrize(
    "text,value",
    [
        ("10", 10),
        ("010", 10),
        ("-010", -10),
        ("+5", 5),
        ("0o10", 8),
        ("0x10", 16),
        ("0x1F", 31),
        ("1:30", "1:30"),
        ("1_000", "1_000"),
        ("0b11", "0b11"),
        ("1e3", 1000.0),
        ("1.0e-4", 1e-4),
        ("1.", 1.0),
        (".5", 0.5),
        ("-.inf", -math.inf),
        (".Inf", math.inf),
        ("true", True),
        ("True", True),
        ("TRUE", True),
        ("FALSE", False),
        ("tRUE", "tRUE"),
        ("yes", "yes"),
        ("no", "no"),
        ("on", "on"),
        ("Off", "Off"),
        ("y", "y"),
        ("n", "n"),
        ("null", None),
        ("Null", None),
        ("~", None),
        ("", None),
        ("2024-01-31", "2024-01-31"),
        ("[no, 010, 1:30]", ["no", 10, "1:30"]),
        ("{a: &x 1, <<: {b: 2}}", {"a": 1, "b": 2}),
    ],
)
def test_plain_scalars_follow_the_yaml_1_2_core_schema(text, value):
    assert parse_yaml(text, "x") == value
    assert type(parse_yaml(text, "x")) is type(value)


def test_nan_and_tagged_values_outside_the_schema():
    assert math.isnan(parse_yaml(".NaN", "x"))
    for text in ("!!int 0b1", "!!int 1:30", "!!float abc", "!!bool yes"):
        with pytest.raises(ConfigError, match=r"^x: invalid YAML: .* of YAML 1\.2"):
            parse_yaml(text, "x")


def test_set_values_follow_yaml_1_2():
    cfg = load_config("abalone_vanilla", ["run.seed=010", "trainer.max_epochs=0x10", "report.plots=TRUE"])
    assert (cfg.run.seed, cfg.trainer.max_epochs, cfg.report.plots) == (10, 16, True)
    assert load_config("abalone_vanilla", ["run.seed=0o10", "optimizer.lr=1e-3"]).run.seed == 8
    with pytest.raises(ConfigError, match=r"`trainer\.max_epochs` must be an integer, got '1:30'"):
        load_config("abalone_vanilla", ["trainer.max_epochs=1:30"])
    with pytest.raises(ConfigError, match=r"`report\.plots` must be true or false, got 'no'"):
        load_config("abalone_vanilla", ["report.plots=no"])
    with pytest.raises(ConfigError, match=r"`trainer\.max_epochs` must be an integer, got 1000\.0"):
        load_config("abalone_vanilla", ["trainer.max_epochs=1e3"])


@pytest.mark.parametrize("text", ["no", "2024", "1:30", "true", "null", "1e3", "010", " 2024 "])
def test_a_string_field_keeps_the_text_set(text):
    cfg = load_config("abalone_ranksim", [f"run.name={text}", f"description={text}"])
    assert cfg.run.name == cfg.description == text.strip()
    # the field's type decides: a number, boolean or null field reads the value, a quoted string stays a string
    assert load_config("abalone_vanilla", ['run.name="2024"', "model.weights=null"]).model.weights is None
    assert load_config("abalone_vanilla", ["trainer.precision=16"]).trainer.precision == "16"


def test_a_string_field_in_a_file_is_typed_by_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("extends: abalone_vanilla\nrun:\n  name: no\n  seed: 010\n")
    cfg = load_config(path)
    assert (cfg.run.name, cfg.run.seed) == ("no", 10)
    path.write_text("extends: abalone_vanilla\nrun:\n  name: 2024\n")
    with pytest.raises(ConfigError, match=r"`run\.name` must be a string, got 2024 \(quote it in YAML"):
        load_config(path)
    path.write_text("extends: abalone_vanilla\nrun:\n  name: '2024'\n")
    assert load_config(path).run.name == "2024"


def test_the_dumped_config_reads_back_the_same_values():
    names = ["no", "2024", "1:30", "1e3", "null", "yes", "0o10", "True", "2024-01-31", "~"]
    for name in names:
        cfg = load_config("abalone_ranksim", [f"run.name={name}", f"description={name}"])
        saved = config_to_dict(cfg)
        text = dump_yaml(saved)
        assert parse_yaml(text, "config.yaml") == saved
        assert f"name: '{name}'" in text  # quoted for a YAML 1.1 reader too
        assert load_config(parse_yaml(text, "config.yaml")).run.name == name


def test_parsing_the_same_text_again_gives_fresh_data():
    """A text read before gives equal data that the caller may change without changing a later read."""
    text = "data:\n  name: abalone\n  options: {a: [1, 2]}\n"
    first = parse_yaml(text, "first")
    first["data"]["options"]["a"].append(3)
    first["data"]["name"] = "changed"
    assert parse_yaml(text, "second") == {"data": {"name": "abalone", "options": {"a": [1, 2]}}}
    assert parse_yaml(text, "third") is not parse_yaml(text, "fourth")
