"""The schema-backed config: pydantic models, strict types, the reference read from the JSON schema."""

from __future__ import annotations

import pytest

pytest.importorskip("yaml")

from pydantic import Field

from rankwise.recipes import config_fields, config_from_dict
from rankwise.recipes.config import (
    Config,
    ConfigError,
    OptimizerConfig,
    Options,
    model_fields_doc,
    validate_section,
)
from rankwise.recipes.registry import register_recipe


@pytest.mark.parametrize(
    "value,match",
    [
        ("3", r"`trainer\.max_epochs` must be an integer, got '3'"),
        (1.5, r"`trainer\.max_epochs` must be an integer, got 1\.5"),
        (2.0, r"`trainer\.max_epochs` must be an integer, got 2\.0"),
        (True, r"`trainer\.max_epochs` must be an integer, got True"),
        (0, r"`trainer\.max_epochs` must be >= 1, got 0"),
    ],
)
def test_an_integer_field_is_strict(value, match):
    with pytest.raises(ConfigError, match=match):
        config_from_dict({"trainer": {"max_epochs": value}})


def test_yaml_conveniences_and_strict_booleans_and_strings():
    cfg = config_from_dict({"optimizer": {"lr": "1e-4"}, "trainer": {"precision": 16}, "data": {"options": None}})
    assert (cfg.optimizer.lr, cfg.trainer.precision, cfg.data.options) == (1e-4, "16", {})
    with pytest.raises(ConfigError, match=r"`run\.name` must be a string, got 3"):
        config_from_dict({"run": {"name": 3}})
    with pytest.raises(ConfigError, match=r"`report\.tsne` must be true or false, got 'no'"):
        config_from_dict({"report": {"tsne": "no"}})
    with pytest.raises(ConfigError, match=r"unknown option `data\.options\.1`; "):
        config_from_dict({"data": {"options": {1: 2}}})  # a YAML number as a key is a name
    with pytest.raises(ConfigError, match=r"`schedule\.milestones` must be a list, got int 3"):
        config_from_dict({"schedule": {"milestones": 3}})


def test_validate_section_names_list_entries_and_nested_keys():
    raw = {"loss": {"regularizers": [{"name": "ranksim", "weight": 1, "optionz": {}}]}}
    with pytest.raises(
        ConfigError, match=r"unknown config key `loss\.regularizers\.ranksim\.optionz`; did you mean 'options'"
    ):
        config_from_dict(raw)
    with pytest.raises(ConfigError, match=r"`opt\.lr` must be > 0, got -1\.0"):
        validate_section(OptimizerConfig, {"lr": -1}, "opt")
    with pytest.raises(ConfigError, match=r"`opt` must be a mapping, got list \[1\]"):
        validate_section(OptimizerConfig, [1], "opt")


def test_the_reference_is_the_json_schema():
    schema = Config.model_json_schema()
    props = schema["$defs"]["OptimizerConfig"]["properties"]
    rows = {r.key: r for r in config_fields()}
    lr = rows["optimizer.lr"]
    assert (lr.type, lr.default, lr.range, lr.doc) == ("float", 1e-3, "> 0", props["lr"]["description"])
    assert rows["optimizer.momentum"].range == ">= 0, < 1"
    assert rows["schedule.milestones"].type == "list[int]" and rows["schedule.milestones"].range == ">= 1"
    assert rows["trainer.num_threads"].type == "int | null" and rows["trainer.num_threads"].range == ">= 1"
    assert rows["optimizer.name"].type == "'adam' | 'adamw' | 'sgd' | 'lars'"
    assert "report.tsne" in rows and "run.tsne" not in rows and "loss.lds.ks" not in rows
    dir_rows = {r.key: r for r in config_fields("dir")}
    assert dir_rows["task.lds.ks"].range == ">= 1" and dir_rows["task.fds.momentum"].range == ">= 0, <= 1"

    class Toy(Options):
        k: int = Field(3, description="neighbours", ge=1, le=9)
        names: list[str] = Field(default_factory=lambda: ["a"], description="names")

    assert [tuple(r) for r in model_fields_doc(Toy, "task")] == [
        ("task.k", "int", 3, "neighbours", ">= 1, <= 9"),
        ("task.names", "list[str]", ["a"], "names", ""),
    ]


def test_a_recipe_registers_an_options_model():
    from rankwise.recipes import Recipe

    class Bad(Recipe):
        name, description, options = "bad_options_recipe", "x", dict

        def fit(self, run):
            return {}

        def evaluate(self, run, checkpoint):
            return {}

    with pytest.raises(TypeError, match=r"`recipe\.options` must be a subclass of rankwise\.recipes\.config\.Options"):
        register_recipe(Bad())


def test_step_budget_options_list_their_steps_in_place_with_their_unit():
    """``task.steps`` / ``task.steps_per_epoch`` are declared once (:class:`StepBudget`); each recipe's
    reference rows name its own unit and keep the keys after the recipe's chosen field."""
    from rankwise.recipes.config import StepBudget
    from rankwise.recipes.dknn import DKNNOptions
    from rankwise.recipes.retrieval import RetrievalOptions
    from rankwise.recipes.sorting import MedianOptions, SortOptions

    for cls, unit, after in (
        (DKNNOptions, "episodes", "n_samples"),
        (RetrievalOptions, "steps", "samples_per_class"),
        (SortOptions, "batches", "bn_recalibration"),
        (MedianOptions, "batches", "bn_recalibration"),
    ):
        assert issubclass(cls, StepBudget)
        rows = {d.key: d for d in model_fields_doc(cls, "task")}
        assert rows["task.steps"].doc == f"training {unit}, in epochs of at most steps_per_epoch"
        assert rows["task.steps_per_epoch"].doc == f"{unit} per epoch (a checkpoint after each)"
        assert (rows["task.steps"].default, rows["task.steps_per_epoch"].default) == (300, 100)
        keys = list(cls.model_fields)
        assert keys[keys.index(after) + 1 : keys.index(after) + 3] == ["steps", "steps_per_epoch"]
        assert list(cls.model_json_schema()["properties"]) == keys
        with pytest.raises(ConfigError, match=r"`task\.steps_per_epoch` must be >= 1, got 0"):
            validate_section(cls, {"steps_per_epoch": 0}, "task")
        with pytest.raises(ConfigError, match=r"`task\.steps` must be an integer, got 2\.5"):
            validate_section(cls, {"steps": 2.5}, "task")
    assert MedianOptions.model_fields["median_objective"] is not None  # the subclass's own field stays
    with pytest.raises(TypeError, match=r"`after` must name one of its fields, got 'nope'"):

        class _Bad(StepBudget, after="nope"):
            a: int = 1


def test_the_stored_reference_of_the_built_in_recipes_is_current():
    """`config_fields(RECIPE)` of a built-in recipe reads the stored rows: they are the rows read from the
    recipes, presets and components now (else: `python -m rankwise.recipes._write_reference` writes them again)."""
    from rankwise.recipes import get_recipe, list_recipes
    from rankwise.recipes.config._reference import REFERENCE_FILE, live_config_fields, reference_text

    assert REFERENCE_FILE.read_text(encoding="utf-8") == reference_text(list_recipes(), recipes=get_recipe), (
        "the stored field reference is stale: run `python -m rankwise.recipes._write_reference`"
    )
    for recipe in ("dir", "brain_age", "ltr"):
        assert config_fields(recipe) == live_config_fields(recipe, recipes=get_recipe)
