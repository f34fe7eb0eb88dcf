"""Typed configuration of a run: the shared sections, the recipe's ``task`` section, loading and ``--set``.

A run is described by a :class:`Config`: ``recipe`` (a name in the recipe registry, see
:mod:`rankwise.recipes.registry`), the shared sections ``data``, ``model``, ``optimizer``,
``schedule``, ``trainer``, ``run`` (and ``loss`` for the recipes that train a regressor), and
``task``: the options model that the recipe owns (``SortOptions`` for ``recipe: sort``, ...).

Every section is a pydantic model (:class:`Section`: unknown keys refused, strict types, finite
numbers, ranges as :func:`pydantic.Field` bounds, a one-line ``description`` per field), so the
reference of all fields (:func:`config_fields`, the documentation site) is read from their JSON
schema. :func:`validate_section` turns pydantic's first error into a one-line
:class:`ConfigError` naming the dotted key ("did you mean", the range, the choices).

Configs come from YAML files or package presets (``src/rankwise/recipes/presets/*.yaml``), may
``extends:`` another preset/file, and accept ``--set a.b=value`` overrides whose values are parsed
as YAML; files and values alike are read by the YAML 1.2 core schema (:func:`parse_yaml`: ``010``
is 10, ``no`` and ``1:30`` are strings), and a string field given ``--set`` keeps the text typed.
:func:`load_config` does ONE pass: read YAML -> apply ``--set`` -> build the typed config
-> the cross-field checks and the recipe's own. Recipes receive the typed objects. This module
imports no recipe and not the recipe registry: what resolves ``recipe:`` (:func:`load_config`,
:func:`config_from_dict`, :func:`apply_overrides`, :func:`override_value`, :func:`config_fields` of a
recipe) takes the registry's look-up as ``recipes``; ``rankwise.recipes.load_config``,
``config_from_dict`` and ``config_fields`` pass it.

Example:
    >>> from rankwise.recipes import get_recipe
    >>> cfg = load_config("abalone_ranksim", overrides=["trainer.max_epochs=2"], recipes=get_recipe)
    >>> cfg.recipe, cfg.trainer.max_epochs, cfg.loss.regularizers[0].name
    ('dir', 2, 'ranksim')
"""

from __future__ import annotations

from rankwise.recipes.config._checks import (
    check_kwargs as check_kwargs,
)
from rankwise.recipes.config._checks import (
    check_lds,
    check_lds_fds,
    config_changes,
    config_from_dict,
    config_to_dict,
    validate_section,
)
from rankwise.recipes.config._checks import (
    check_run_name as check_run_name,
)
from rankwise.recipes.config._loading import (
    PRESET_DIR as PRESET_DIR,
)
from rankwise.recipes.config._loading import (
    apply_overrides,
    dataset_switch,
    inherited_options,
    list_presets,
    load_config,
    load_raw,
    override_value,
    preset_path,
)
from rankwise.recipes.config._lookup import RecipeLookup
from rankwise.recipes.config._parsing import (
    MAX_CONFIG_BYTES,
    MAX_YAML_DEPTH,
    MAX_YAML_VALUES,
    ConfigError,
    UserError,
    dump_yaml,
    parse_yaml,
)
from rankwise.recipes.config._reference import FieldDoc, config_fields, model_fields_doc
from rankwise.recipes.config._sections import (
    OPTIONAL_SECTIONS as OPTIONAL_SECTIONS,
)
from rankwise.recipes.config._sections import (
    UNIVERSAL_SECTIONS as UNIVERSAL_SECTIONS,
)
from rankwise.recipes.config._sections import (
    Config,
    DataConfig,
    DatasetSwitch,
    FDSConfig,
    LDSConfig,
    LossConfig,
    ModelConfig,
    OptimizerConfig,
    Options,
    RegularizerConfig,
    ReportConfig,
    RunConfig,
    ScheduleConfig,
    Section,
    StepBudget,
    StudyConfig,
    TrainerConfig,
)

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_YAML_DEPTH",
    "MAX_YAML_VALUES",
    "Config",
    "ConfigError",
    "DataConfig",
    "DatasetSwitch",
    "FDSConfig",
    "FieldDoc",
    "LDSConfig",
    "LossConfig",
    "ModelConfig",
    "OptimizerConfig",
    "Options",
    "RecipeLookup",
    "RegularizerConfig",
    "ReportConfig",
    "RunConfig",
    "ScheduleConfig",
    "Section",
    "StepBudget",
    "StudyConfig",
    "TrainerConfig",
    "UserError",
    "apply_overrides",
    "check_lds",
    "check_lds_fds",
    "config_changes",
    "config_fields",
    "config_from_dict",
    "config_to_dict",
    "dataset_switch",
    "dump_yaml",
    "inherited_options",
    "list_presets",
    "load_config",
    "load_raw",
    "model_fields_doc",
    "override_value",
    "parse_yaml",
    "preset_path",
    "validate_section",
]
