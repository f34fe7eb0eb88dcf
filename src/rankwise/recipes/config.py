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
as YAML. :func:`load_config` does ONE pass: read YAML -> apply ``--set`` -> build the typed config
-> the cross-field checks and the recipe's own. Recipes receive the typed objects. This module
imports no recipe and not the recipe registry: the registry installs its lookup
(:func:`set_recipe_lookup`) when it is imported.

Example:
    >>> cfg = load_config("abalone_ranksim", overrides=["trainer.max_epochs=2"])
    >>> cfg.recipe, cfg.trainer.max_epochs, cfg.loss.regularizers[0].name
    ('dir', 2, 'ranksim')
"""

from __future__ import annotations

import copy
import difflib
import itertools
import math
import os
import re
import stat
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, NamedTuple, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

M = TypeVar("M", bound=BaseModel)

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_YAML_DEPTH",
    "MAX_YAML_VALUES",
    "Config",
    "ConfigError",
    "DataConfig",
    "FDSConfig",
    "FieldDoc",
    "LDSConfig",
    "LossConfig",
    "ModelConfig",
    "OptimizerConfig",
    "Options",
    "RegularizerConfig",
    "ReportConfig",
    "RunConfig",
    "ScheduleConfig",
    "Section",
    "StepBudget",
    "TrainerConfig",
    "UserError",
    "apply_overrides",
    "check_lds_fds",
    "config_fields",
    "config_from_dict",
    "config_to_dict",
    "current_key",
    "list_presets",
    "load_config",
    "load_raw",
    "model_fields_doc",
    "parse_yaml",
    "preset_path",
    "register_legacy_place",
    "set_recipe_lookup",
    "upgrade_legacy",
    "upgrade_saved",
    "validate_section",
]

#: a plain decimal number written as a string ("1e-4": YAML 1.1 reads it as a string); no "1_000", "nan"
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")

PRESET_DIR = Path(__file__).resolve().parent / "presets"

#: the sections every recipe reads; a recipe lists any other section it reads in ``Recipe.uses``
UNIVERSAL_SECTIONS = ("data", "model", "optimizer", "schedule", "trainer", "run", "report")
#: sections that only some recipes read
OPTIONAL_SECTIONS = ("loss",)


class UserError(ValueError):
    """An expected user error (bad config, run directory, checkpoint): the CLI prints one line, exits 2."""


class ConfigError(UserError):
    """A config key or value is invalid (the message names the dotted key)."""


#: the largest config file read (bytes); a bigger one is refused before it is parsed
MAX_CONFIG_BYTES = 1_000_000
#: the deepest nesting of mappings/lists in a YAML config, ``--set`` value or ``-O`` option
MAX_YAML_DEPTH = 64
#: the most values (scalars, mappings, lists) a YAML document may expand to, aliases expanded
MAX_YAML_VALUES = 100_000


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters (an error message stays one readable line)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _yaml_children(node: Any) -> list[Any]:
    import yaml

    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_expansion(root: Any, where: str) -> None:
    """Refuse a composed YAML node graph that expands beyond the documented limits, or into itself.

    Iterative post-order walk, each distinct node once: linear in the file, whatever the aliases.
    """
    import yaml

    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        k = id(node)
        if done:
            kids = _yaml_children(node)
            size[k] = 1 + sum(size[id(c)] for c in kids)
            nesting = 0 if isinstance(node, yaml.ScalarNode) else 1  # depth counts mappings and lists
            depth[k] = nesting + max((depth[id(c)] for c in kids), default=0)
            on_path.discard(k)
            if size[k] > MAX_YAML_VALUES:
                raise ConfigError(
                    f"{where}: the YAML expands to more than {MAX_YAML_VALUES:,} values through its aliases "
                    "(an alias bomb?); rankwise refuses it"
                )
            if depth[k] > MAX_YAML_DEPTH:
                raise ConfigError(f"{where}: the YAML is nested deeper than {MAX_YAML_DEPTH} levels (aliases expanded)")
            continue
        if k in size:
            continue
        if k in on_path:
            raise ConfigError(f"{where}: the YAML holds a recursive alias (a value that contains itself)")
        on_path.add(k)
        stack.append((node, True))
        stack.extend((c, False) for c in _yaml_children(node) if id(c) not in size)


def _yaml_problem(e: Exception) -> str:
    """A YAML error as one line: the problem and its line/column, never a snippet of the text."""
    import yaml

    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        return f"{e.problem or e.context or 'invalid YAML'}{where}"
    return type(e).__name__


def parse_yaml(text: str, where: str) -> Any:
    """``yaml.safe_load(text)`` within the documented limits; any problem is a one-line :class:`ConfigError`.

    ``where`` names the source in the message (a file, ``--set key``). Refused: more than
    :data:`MAX_CONFIG_BYTES` bytes, nesting deeper than :data:`MAX_YAML_DEPTH`, more than
    :data:`MAX_YAML_VALUES` values once aliases are expanded (an alias bomb), a recursive alias, a
    tag of a Python object (``!!python/object``: the safe loader constructs plain data only).
    """
    import yaml

    if len(text.encode("utf-8", "surrogatepass")) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{where}: the YAML is larger than {MAX_CONFIG_BYTES:,} bytes")
    try:
        level = 0
        for event in yaml.parse(text, Loader=yaml.SafeLoader):  # iterative: no recursion on deep input
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                level += 1
                if level > MAX_YAML_DEPTH:
                    raise ConfigError(f"{where}: the YAML is nested deeper than {MAX_YAML_DEPTH} levels")
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                level -= 1
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is None:
            return None
        _check_expansion(node, where)
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: invalid YAML: {_yaml_problem(e)}") from None
    except RecursionError:  # pragma: no cover - the depth limit comes first
        raise ConfigError(f"{where}: the YAML is nested too deeply") from None


# --------------------------------------------------------------------------------------------------
# schema: pydantic models (types, ranges via Field, unknown keys refused)


def _accepts(tp: Any, kind: type) -> bool:
    """Whether the annotation ``tp`` (a union included) takes values of ``kind`` and not of ``str``."""
    args = get_args(tp) if get_origin(tp) in (Union, types.UnionType) else (tp,)
    return kind in args and str not in args


def _unwrap(tp: Any) -> Any:
    """``X`` of ``Annotated[X, ...]`` and of ``X | None``."""
    while True:
        if get_origin(tp) is Annotated:
            tp = get_args(tp)[0]
            continue
        if get_origin(tp) in (Union, types.UnionType):
            args = [a for a in get_args(tp) if a is not type(None)]
            if len(args) == 1:
                tp = args[0]
                continue
        return tp


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


class Section(BaseModel):
    """Base of every config section and of every recipe's ``task`` options.

    Unknown keys are refused (``extra="forbid"``); types are strict (an integer field takes no
    ``1.5``, ``"1"`` or ``true``; a boolean no ``"yes"``), numbers are finite, and every range is a
    :func:`pydantic.Field` bound. Two YAML conveniences: a float field takes a decimal string
    (YAML 1.1 reads ``1e-4`` as a string), a field of string choices takes an integer spelling one
    (``precision: 16``); an empty YAML value (``null``) of a section, mapping or list is its default.
    """

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _yaml_scalars(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is None:  # pragma: no cover - pydantic validates declared fields only
            return value
        tp = field.annotation
        inner = _unwrap(tp)
        if value is None and (_is_model(inner) or get_origin(inner) in (dict, list)) and inner is tp:
            return {} if _is_model(inner) or get_origin(inner) is dict else []
        if isinstance(value, dict) and get_origin(inner) is dict:
            return {str(k): v for k, v in value.items()}  # YAML may read a key as a number: options take names
        if isinstance(value, str) and _accepts(tp, float) and _DECIMAL.fullmatch(value.strip()):
            return float(value)
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and get_origin(inner) is Literal
            and str(value) in get_args(inner)
        ):
            return str(value)  # e.g. precision: 16 -> "16"
        return value


class Options(Section):
    """Base of a recipe's ``task`` options (the recipe registers the model as ``Recipe.options``)."""


class StepBudget(Options):
    """A recipe's ``task`` options with a training budget of steps: ``task.steps`` in epochs of at most
    ``task.steps_per_epoch`` (:func:`rankwise.recipes.common.epochs_and_batches`).

    A recipe's options subclass it and name what a step is and after which of their own fields the
    two keys are listed (the config reference, ``rankwise config``, the dumped config)::

        class DKNNOptions(StepBudget, unit="episodes", after="n_samples"): ...

    A subclass of such options (``MedianOptions(SortOptions)``) keeps its parent's ``unit`` and place.
    """

    steps: int = Field(300, description="training {unit}, in epochs of at most steps_per_epoch", ge=1)
    steps_per_epoch: int = Field(100, description="{unit} per epoch (a checkpoint after each)", ge=1)

    _step_unit: ClassVar[str] = "steps"
    _steps_after: ClassVar[str | None] = None

    def __init_subclass__(cls, *, unit: str | None = None, after: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if unit is not None:
            cls._step_unit = unit
        if after is not None:
            cls._steps_after = after

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        fields = dict(cls.__pydantic_fields__)
        budget = {}
        for name in ("steps", "steps_per_epoch"):
            field = copy.copy(fields.pop(name))
            field.description = str(StepBudget.model_fields[name].description).format(unit=cls._step_unit)
            budget[name] = field
        if cls._steps_after is not None and cls._steps_after not in fields:
            raise TypeError(f"{cls.__name__}: `after` must name one of its fields, got {cls._steps_after!r}")
        ordered: dict[str, Any] = {} if cls._steps_after is not None else dict(budget)
        for name, field in fields.items():
            ordered[name] = field
            if name == cls._steps_after:
                ordered.update(budget)
        cls.__pydantic_fields__ = ordered
        cls.model_rebuild(force=True)


#: a list element that is an integer >= 1 (``schedule.milestones``)
_Epoch = Annotated[int, Field(ge=1)]
_Kernel = Literal["gaussian", "triang", "laplace"]


class DataConfig(Section):
    """Which dataset to load and how to batch it."""

    name: str = Field("abalone", description="registered dataset (`rankwise data list`)")
    options: dict[str, Any] = Field(
        default_factory=dict, description="keyword options of the dataset loader (`rankwise data show`)"
    )
    batch_size: int = Field(64, description="training batch size (per process under DDP)", ge=1)
    eval_batch_size: int = Field(512, description="batch size of validation, test and prediction", ge=1)
    num_workers: int = Field(0, description="DataLoader worker processes", ge=0)


class ModelConfig(Section):
    """Backbone (``rankwise.models.build_backbone(backbone, **options)``); the recipe adds its heads."""

    backbone: str = Field("mlp", description="registered backbone (`rankwise.models.list_backbones()`)")
    options: dict[str, Any] = Field(default_factory=dict, description="keyword options of the backbone factory")
    weights: str | None = Field(
        None, description="local weights file loaded into the backbone (weights_only=True); never downloaded"
    )


class LDSConfig(Section):
    """Label-distribution reweighting / smoothing (Yang et al. 2021): ``task.lds`` of the recipes that read it."""

    reweight: Literal["none", "sqrt_inv", "inverse"] = Field(
        "none", description="per-sample weights from label frequencies"
    )
    lds: bool = Field(False, description="smooth the label histogram with the kernel before reweighting")
    kernel: _Kernel = Field("gaussian", description="LDS smoothing kernel")
    ks: int = Field(5, description="LDS kernel size in bins (odd)", ge=1)
    sigma: float = Field(2.0, description="LDS kernel width", gt=0)


class FDSConfig(Section):
    """Feature-distribution smoothing on the backbone features (Yang et al. 2021): ``task.fds`` of its recipes."""

    enabled: bool = Field(False, description="smooth the features with FDS")
    kernel: _Kernel = Field("gaussian", description="FDS smoothing kernel")
    ks: int = Field(5, description="FDS kernel size in bins (odd)", ge=1)
    sigma: float = Field(2.0, description="FDS kernel width", gt=0)
    momentum: float = Field(0.9, description="momentum of the running per-bin feature statistics", ge=0, le=1)
    start_update: int = Field(0, description="first epoch whose features update the statistics", ge=0)
    start_smooth: int = Field(1, description="first epoch whose features are smoothed", ge=0)


class RegularizerConfig(Section):
    """One weighted term ``weight * loss(...)`` added to the task loss; ``name`` is a registered loss."""

    name: str = Field(description="registered loss whose registry entry declares its inputs (`rankwise.list_losses()`)")
    weight: float = Field(1.0, description="multiplier of the term (0 = computed nowhere)", ge=0)
    options: dict[str, Any] = Field(
        default_factory=dict, description="keyword options of the loss (checked against its signature)"
    )


class LossConfig(Section):
    """The regression recipes' loss: the task loss + registry regularizers (LDS/FDS: the recipe's ``task``)."""

    kind: Literal["l1", "mse", "huber", "focal_l1", "focal_mse"] = Field(
        "l1", description="shorthand for `loss.name: regression_<kind>` (used unless `loss.name` is set)"
    )
    name: str | None = Field(
        None,
        description="a registered loss used as the task loss instead of `kind` (inputs predictions/targets, "
        "learnable parameters trained)",
    )
    options: dict[str, Any] = Field(default_factory=dict, description="keyword options of the task loss")
    lr: float | None = Field(
        None, description="learning rate of the task loss's own parameters (default optimizer.lr)", gt=0
    )
    regularizers: list[RegularizerConfig] = Field(
        default_factory=list, description="weighted losses from the loss registry added to the task loss"
    )


class OptimizerConfig(Section):
    """The optimizer of every recipe (``rankwise.recipes.optim.configure``)."""

    name: Literal["adam", "adamw", "sgd", "lars"] = Field("adam", description="optimizer (lars: timm.optim.Lars)")
    lr: float = Field(1e-3, description="learning rate", gt=0)
    weight_decay: float = Field(0.0, description="weight decay", ge=0)
    momentum: float = Field(0.9, description="momentum (sgd, lars)", ge=0, lt=1)


class ScheduleConfig(Section):
    """Learning-rate schedule over the recipe's actual number of epochs/steps."""

    kind: Literal["none", "multistep", "cosine"] = Field("none", description="lr schedule after the warm-up")
    milestones: list[_Epoch] = Field(
        default_factory=list, description="multistep: epochs at which lr is multiplied by gamma"
    )
    gamma: float = Field(0.1, description="multistep decay factor", gt=0, le=1)
    warmup_epochs: int = Field(0, description="epochs of linear warm-up (per optimizer step)", ge=0)
    interval: Literal["epoch", "step"] = Field("epoch", description="granularity of the cosine/multistep decay")


class TrainerConfig(Section):
    """Options forwarded to ``lightning.Trainer``."""

    max_epochs: int = Field(10, description="training epochs (recipes with `task.steps` derive their own)", ge=1)
    accelerator: Literal["auto", "cpu", "gpu", "cuda", "mps", "tpu"] = Field(
        "auto", description="Lightning accelerator"
    )
    devices: Any = Field("auto", description="Lightning devices: auto, a count, -1 (all) or a list of indices")
    strategy: str = Field("auto", description="Lightning strategy, e.g. ddp")
    num_nodes: int = Field(1, description="number of nodes", ge=1)
    precision: Literal[
        "32-true", "32", "64-true", "64", "16-true", "16-mixed", "16", "bf16-true", "bf16-mixed", "bf16"
    ] = Field("32-true", description="Lightning precision")
    deterministic: Any = Field("warn", description="torch deterministic algorithms: true, false or warn")
    gradient_clip_val: float | None = Field(None, description="clip gradients to this norm", ge=0)
    log_every_n_steps: int = Field(10, description="logging interval in steps", ge=1)
    limit_train_batches: Any = Field(None, description="batches per training epoch: a count or a fraction in (0, 1]")
    limit_val_batches: Any = Field(None, description="validation batches: a count or a fraction in [0, 1]")
    enable_progress_bar: bool = Field(True, description="show the progress bar (with --progress)")
    num_threads: int | None = Field(None, description="torch.set_num_threads for the run (None: torch's default)", ge=1)


class RunConfig(Section):
    """Run directory and seed."""

    name: str = Field("run", description="run directory name under out_dir (one path component)")
    seed: int = Field(0, description="seed of initialisation, sampling and augmentation", ge=0, lt=2**32)
    out_dir: str = Field("runs", description="parent folder of the run directory")


class ReportConfig(Section):
    """What is reported after training: plots, the t-SNE and the shot groups of the regression metrics."""

    plots: bool = Field(True, description="write plots/ after training")
    tsne: bool = Field(True, description="include the t-SNE plot")
    plot_samples: int = Field(400, description="test examples in the similarity heatmap / t-SNE", ge=1)
    many_shot: float | None = Field(
        None,
        description="a label bin with more training examples is many-shot (null: the dataset's own threshold)",
        ge=0,
    )
    few_shot: float | None = Field(
        None,
        description="a label bin with fewer training examples is few-shot (null: the dataset's own threshold)",
        ge=0,
    )


class Config(Section):
    """A whole run. ``task`` is the options model of ``recipe`` (see ``rankwise.recipes.registry``)."""

    recipe: str = Field("dir", description="training recipe (`rankwise.recipes.list_recipes()`)")
    description: str = Field("", description="one line shown by `rankwise presets`")
    expected_time: str = Field(
        "", description="expected wall time of the run on 2 CPU cores, shown by `rankwise presets`"
    )
    data: DataConfig = Field(default_factory=DataConfig, description="dataset and batching")
    model: ModelConfig = Field(default_factory=ModelConfig, description="backbone")
    loss: LossConfig = Field(default_factory=LossConfig, description="losses of the recipes that read them")
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig, description="optimizer")
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig, description="learning-rate schedule")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="Lightning Trainer options")
    run: RunConfig = Field(default_factory=RunConfig, description="run directory and seed")
    report: ReportConfig = Field(default_factory=ReportConfig, description="plots, t-SNE and shot groups")
    task: Any = Field(None, description="the recipe's own options (its options model)")


# --------------------------------------------------------------------------------------------------
# validation: pydantic's errors as the one-line messages of the CLI


def _suggest(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    return f"{hint}valid keys: {', '.join(sorted(valid))}"


def _walk(model: type[BaseModel], loc: tuple[Any, ...]) -> Any:
    """The annotation at ``loc`` below ``model`` (``None`` past an unknown key or a union branch)."""
    tp: Any = model
    for part in loc:
        tp = _unwrap(tp)
        if isinstance(part, int) and get_origin(tp) is list:
            tp = get_args(tp)[0]
        elif isinstance(part, str) and _is_model(tp) and part in tp.model_fields:
            tp = tp.model_fields[part].annotation
        elif isinstance(part, str) and get_origin(tp) is dict:
            tp = get_args(tp)[1]
        else:
            return None
    return tp


def _dotted(loc: tuple[Any, ...], raw: Any, prefix: str) -> str:
    """The dotted key of ``loc``: a list entry by its ``name`` (``loss.regularizers.ranksim``), else ``[i]``."""
    key, node = prefix, raw
    for part in loc:
        if isinstance(part, int):
            entry = node[part] if isinstance(node, list) and 0 <= part < len(node) else None
            name = entry.get("name") if isinstance(entry, dict) else None
            key += f".{name}" if isinstance(name, str) else f"[{part}]"
            node = entry
        else:
            key = f"{key}.{part}" if key else str(part)
            node = node.get(part) if isinstance(node, dict) else None
    return key


def _message(err: Any, model: type[BaseModel], raw: Any, prefix: str) -> str:
    """One pydantic error as the message of a :class:`ConfigError` (the dotted key, what was expected)."""
    loc, kind, value, ctx = tuple(err["loc"]), err["type"], err.get("input"), err.get("ctx") or {}
    key = _dotted(loc, raw, prefix)
    tp = _walk(model, loc)
    if kind == "extra_forbidden":
        parent = _unwrap(_walk(model, loc[:-1]))
        valid = list(parent.model_fields) if _is_model(parent) else []
        former = [".".join(old) for old, new in _MOVED.items() if key == ".".join(new)]
        moved = f" (`{former[0]}` moved there: this recipe does not read it)" if former else ""
        return f"unknown config key `{key}`{moved}; " + _suggest(str(loc[-1]), valid)
    if kind == "missing":
        return f"`{key}` is required"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        bound, sym = {"greater_than": ("gt", ">"), "greater_than_equal": ("ge", ">="), "less_than": ("lt", "<")}.get(
            kind, ("le", "<=")
        )
        shown = float(value) if isinstance(value, int) and tp is not None and _accepts(_unwrap(tp), float) else value
        return f"`{key}` must be {sym} {ctx[bound]:g}, got {_short(shown)}"
    if kind == "finite_number":
        return f"`{key}` must be a finite number, got {_short(value)}"
    if kind == "literal_error":
        choices = list(get_args(_unwrap(tp))) if tp is not None else []
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=2, cutoff=0.4)
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        return f"`{key}` must be one of {choices}, got {_short(value)}{hint}"
    expected = {
        "int_type": "an integer",
        "int_from_float": "an integer",
        "int_parsing": "an integer",
        "float_type": "a number",
        "float_parsing": "a number",
        "bool_type": "true or false",
        "bool_parsing": "true or false",
        "string_type": "a string",
    }
    if kind in expected:
        return f"`{key}` must be {expected[kind]}, got {_short(value)}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"`{key}` must be a mapping, got {type(value).__name__} {_short(value)}"
    if kind == "list_type":
        return f"`{key}` must be a list, got {type(value).__name__} {_short(value)}"
    return f"`{key}`: {err['msg']}, got {_short(value)}"  # pragma: no cover - every type above is mapped


def validate_section(model: type[M], raw: Any, prefix: str = "") -> M:
    """Build the model ``model`` of a raw (YAML) mapping; the first problem is a :class:`ConfigError`.

    The message names the dotted key (below ``prefix``) and what was expected: the valid keys and
    the closest ones ("did you mean"), the type, the range or the choices.
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        where = f"`{prefix}`" if prefix else "the config"
        raise ConfigError(f"{where} must be a mapping, got {type(raw).__name__} {_short(raw)}")
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_message(e.errors()[0], model, raw, prefix)) from None


def _check_devices(devices: Any) -> None:
    ok = (
        devices == "auto"
        or (isinstance(devices, int) and not isinstance(devices, bool) and devices >= -1)
        or (isinstance(devices, str) and devices.lstrip("-").isdigit())
        or (isinstance(devices, list) and all(isinstance(d, int) and d >= 0 for d in devices) and devices)
    )
    if not ok:
        raise ConfigError(f"`trainer.devices` must be 'auto', a count, -1 or a list of indices, got {devices!r}")


def _check_limit(value: Any, key: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"`{key}` must be a count or a fraction in [0, 1], got {_short(value)}")
    if isinstance(value, float) and not (math.isfinite(value) and 0 <= value <= 1):
        raise ConfigError(f"`{key}` as a fraction must be in [0, 1], got {_short(value)}")
    if isinstance(value, int) and value < 0:
        raise ConfigError(f"`{key}` must be >= 0, got {_short(value)}")


def check_run_name(name: str, key: str = "run.name") -> str:
    """A run name is one path component: not empty, no ``/`` or ``\\``, not ``.`` or ``..``."""
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise ConfigError(f"`{key}` must be a single path component (no '/', not '.' or '..'), got {name!r}")
    return name


def _check_shared(cfg: Config) -> None:
    """Cross-field checks of the shared sections (each field's type and range were checked when built)."""
    names = [r.name for r in cfg.loss.regularizers]
    for n in names:
        if names.count(n) > 1:
            raise ConfigError(f"`loss.regularizers` lists {n!r} twice")
    ms = cfg.schedule.milestones
    if any(b <= a for a, b in itertools.pairwise(ms)):
        raise ConfigError(f"`schedule.milestones` must be increasing, got {ms}")
    t = cfg.trainer
    _check_devices(t.devices)
    if t.deterministic not in (True, False, "warn"):
        raise ConfigError(f"`trainer.deterministic` must be true, false or 'warn', got {t.deterministic!r}")
    _check_limit(t.limit_train_batches, "trainer.limit_train_batches")
    _check_limit(t.limit_val_batches, "trainer.limit_val_batches")
    if t.limit_train_batches == 0:
        raise ConfigError("`trainer.limit_train_batches` must be > 0 (0 trains nothing)")
    check_run_name(cfg.run.name)
    rep = cfg.report
    if rep.few_shot is not None and rep.many_shot is not None and rep.few_shot > rep.many_shot:
        raise ConfigError(f"`report.few_shot` ({rep.few_shot:g}) must be <= `report.many_shot` ({rep.many_shot:g})")


def check_lds_fds(lds: LDSConfig, fds: FDSConfig, key: str = "task") -> None:
    """Cross-field checks of LDS and FDS options (odd kernel sizes; LDS smooths a reweighting)."""
    for sec, ks in (("lds", lds.ks), ("fds", fds.ks)):
        if ks % 2 == 0:
            raise ConfigError(f"`{key}.{sec}.ks` must be odd, got {ks}")
    if lds.lds and lds.reweight == "none":
        raise ConfigError(
            f"`{key}.lds.lds` is true but `{key}.lds.reweight` is 'none': LDS smooths the reweighting "
            f"counts, set `{key}.lds.reweight` to 'sqrt_inv' or 'inverse'"
        )


def check_kwargs(fn: Any, options: dict[str, Any], key: str, *, supplied: tuple[str, ...] = ()) -> None:
    """Every key of ``options`` must be a keyword parameter of ``fn`` that the recipe does not supply itself."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins
        return
    valid = [n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and n not in supplied]
    takes_more = any(p.kind is p.VAR_KEYWORD for p in params.values())
    for name in options:
        if name in supplied:
            raise ConfigError(f"option `{key}.{name}` is supplied by the recipe (a batch tensor), not by the config")
        if name not in valid and not takes_more:
            raise ConfigError(f"unknown option `{key}.{name}`; " + _suggest(str(name), valid))


def _check_library(cfg: Config) -> None:
    """Dataset and backbone names against their registries, their options against the loaders' signatures."""
    from rankwise import data, models

    for getter, name, key in (
        (data.DATASETS.get, cfg.data.name, "data"),
        (models.BACKBONES.get, cfg.model.backbone, "model"),
    ):
        field_name = "name" if key == "data" else "backbone"
        try:
            fn = getter(name)
        except ValueError as e:
            raise ConfigError(f"`{key}.{field_name}`: {e}") from None
        check_kwargs(fn, getattr(cfg, key).options, f"{key}.options")


#: the recipe registry's lookup ``name -> Recipe``: :mod:`rankwise.recipes.registry` installs it when
#: it is imported (the package imports it), so this module never imports a recipe or the registry
_recipe_lookup: Callable[[str], Any] | None = None


def set_recipe_lookup(lookup: Callable[[str], Any]) -> None:
    """Install the function that resolves a config's ``recipe`` name (called by the recipe registry)."""
    global _recipe_lookup
    _recipe_lookup = lookup


def get_recipe(name: str) -> Any:
    """The registered recipe ``name`` through the installed lookup (``ValueError`` if unknown)."""
    if _recipe_lookup is None:  # pragma: no cover - the package imports the registry first
        raise RuntimeError("no recipe registry is installed (import rankwise.recipes)")
    return _recipe_lookup(name)


def _default_recipe() -> str:
    return str(Config.model_fields["recipe"].default)


def _recipe(name: Any) -> Any:
    if not isinstance(name, str):
        raise ConfigError(f"`recipe` must be a string, got {name!r}")
    try:
        return get_recipe(name)
    except ValueError as e:
        raise ConfigError(f"`recipe`: {e}") from None


def config_from_dict(raw: dict[str, Any] | None) -> Config:
    """Build and validate the typed :class:`Config` of a raw (YAML) mapping, in one pass.

    Types, ranges and unknown keys of every section; the ``task`` section is built as the options
    model of the recipe; sections the recipe does not read must be left at their defaults;
    then the shared cross-field checks and the recipe's own (``Recipe.check``: names and options
    against the registries and the library signatures).
    """
    raw = upgrade_legacy(dict(raw or {}))
    raw.pop("extends", None)
    recipe = _recipe(raw.get("recipe", _default_recipe()))
    task_raw = raw.pop("task", None)
    if task_raw is not None and not isinstance(task_raw, dict):
        raise ConfigError(f"`task` must be a mapping, got {type(task_raw).__name__} {task_raw!r}")
    cfg = validate_section(Config, raw)
    cfg.task = validate_section(recipe.options, task_raw, "task")
    for sec in OPTIONAL_SECTIONS:
        if sec not in recipe.uses and getattr(cfg, sec) != getattr(Config(), sec):
            raise ConfigError(f"`{sec}` is not used by recipe {recipe.name!r} (it reads: {_sections(recipe)})")
    _check_shared(cfg)
    _check_library(cfg)
    recipe.check(cfg)
    return cfg


def _sections(recipe: Any) -> str:
    return ", ".join([*UNIVERSAL_SECTIONS, *sorted(recipe.uses), "task"])


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """Plain nested dict (YAML/JSON serializable) of a :class:`Config`: the sections its recipe reads."""
    out = cfg.model_dump(mode="python")
    out["task"] = cfg.task.model_dump(mode="python") if isinstance(cfg.task, BaseModel) else cfg.task
    uses = get_recipe(cfg.recipe).uses
    for sec in OPTIONAL_SECTIONS:
        if sec not in uses:
            out.pop(sec)
    return out


# --------------------------------------------------------------------------------------------------
# field reference (generated from the JSON schema of the models)


class FieldDoc(NamedTuple):
    key: str
    type: str
    default: Any
    doc: str
    range: str


_JSON_TYPES = {"number": "float", "integer": "int", "boolean": "bool", "string": "str", "null": "null"}
_BOUNDS = (("exclusiveMinimum", ">"), ("minimum", ">="), ("exclusiveMaximum", "<"), ("maximum", "<="))


def _schema_type(prop: dict[str, Any]) -> str:
    if "enum" in prop:
        return " | ".join(repr(e) for e in prop["enum"])
    if "const" in prop:
        return repr(prop["const"])
    if "anyOf" in prop:
        return " | ".join(_schema_type(p) for p in prop["anyOf"])
    if "$ref" in prop:  # a nested model: its name (e.g. the entries of loss.regularizers)
        return str(prop["$ref"]).rsplit("/", 1)[-1]
    kind = prop.get("type")
    if kind == "array":
        return f"list[{_schema_type(prop.get('items', {}))}]"
    if kind == "object":
        return "dict[str, Any]"
    return _JSON_TYPES.get(str(kind), "Any")


def _schema_range(prop: dict[str, Any]) -> str:
    for sub in (prop, prop.get("items") or {}, *prop.get("anyOf", ())):
        rng = ", ".join(f"{sym} {sub[b]:g}" for b, sym in _BOUNDS if b in sub)
        if rng:
            return rng
    return ""


def _schema_fields(
    schema: dict[str, Any], defs: dict[str, Any], model: type[BaseModel], prefix: str
) -> Iterator[FieldDoc]:
    """Every leaf field of a model's JSON schema: dotted key, type, default, description, range."""
    for name, prop in schema.get("properties", {}).items():
        key = f"{prefix}.{name}" if prefix else name
        tp = _unwrap(model.model_fields[name].annotation)
        if "$ref" in prop and _is_model(tp):  # a nested section
            yield from _schema_fields(defs[prop["$ref"].rsplit("/", 1)[-1]], defs, tp, key)
            continue
        if "default" in prop:
            default = prop["default"]
        else:  # a default_factory (not in the schema) or a required field
            default = model.model_fields[name].get_default(call_default_factory=True)
        items = prop.get("items") or {}
        yield FieldDoc(key, _schema_type(prop), default, str(prop.get("description", "")), _schema_range(prop))
        if "$ref" in items and get_origin(tp) is list and _is_model(get_args(tp)[0]):
            elem = get_args(tp)[0]
            yield from _schema_fields(defs[items["$ref"].rsplit("/", 1)[-1]], defs, elem, f"{key}[]")


def model_fields_doc(model: type[BaseModel], prefix: str = "") -> list[FieldDoc]:
    """The reference rows of ``model`` (a section or a recipe's options), read from its JSON schema."""
    schema = model.model_json_schema()
    return list(_schema_fields(schema, schema.get("$defs", {}), model, prefix))


def config_fields(recipe: str | None = None) -> list[FieldDoc]:
    """Every config field (dotted key, type, default, one-line description, range), from the JSON schema.

    With ``recipe``, the ``task.*`` fields of that recipe's options and only the sections it reads.
    """
    out = [d for d in model_fields_doc(Config) if d.key != "task"]
    if recipe is not None:
        r = get_recipe(recipe)
        out = [d for d in out if d.key.split(".")[0] not in OPTIONAL_SECTIONS or d.key.split(".")[0] in r.uses]
        out += model_fields_doc(r.options, "task")
    return out


# --------------------------------------------------------------------------------------------------
# files, presets, overrides


def list_presets() -> dict[str, str]:
    """Preset name -> one-line description, for every YAML under ``rankwise/recipes/presets``."""
    import yaml

    out = {}
    for p in sorted(PRESET_DIR.glob("*.yaml")):
        with open(p) as fh:
            raw = yaml.safe_load(fh) or {}
        out[p.stem] = str(raw.get("description", "")).strip().splitlines()[0] if raw.get("description") else ""
    return out


def preset_path(name: str) -> Path:
    """The YAML file of the bundled preset ``name`` (only names listed by :func:`list_presets`)."""
    names = sorted(q.stem for q in PRESET_DIR.glob("*.yaml"))
    if name not in names:
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        raise ConfigError(f"`{name}` is neither a config file nor a preset; {hint}see `rankwise presets`")
    return PRESET_DIR / f"{name}.yaml"


def _looks_like_path(source: str) -> bool:
    return any(c in source for c in "/\\") or source.endswith((".yaml", ".yml")) or source.startswith(".")


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _check_regular_file(path: Path) -> Path:
    """``path`` if it is a regular file (a symlink to one counts); else a :class:`ConfigError` saying what it is."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from None
    if stat.S_ISDIR(mode):
        raise ConfigError(f"config file {path} is a directory, expected a YAML file")
    if not stat.S_ISREG(mode):
        raise ConfigError(f"config file {path} is not a regular file (a device, FIFO or socket), expected a YAML file")
    return path


def _resolve_source(source: str | Path, base_dir: Path | None = None) -> Path:
    """An explicit path is a path (relative to ``base_dir`` for ``extends``); a bare name is a preset."""
    if isinstance(source, Path):
        return _check_regular_file(source)
    cand = (base_dir / source) if base_dir is not None else Path(source)
    if os.path.lexists(cand) or _looks_like_path(source):
        return _check_regular_file(cand)
    return preset_path(source)


def _read_config_text(path: Path) -> str:
    """The UTF-8 text of a config file, its size checked before it is read (errors name the file, never its text)."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > MAX_CONFIG_BYTES:
                raise ConfigError(f"config file {path} is {size:,} bytes; the limit is {MAX_CONFIG_BYTES:,}")
            data = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is larger than {MAX_CONFIG_BYTES:,} bytes")
    if data[:4] == b"PK\x03\x04" or b"\0" in data:
        raise ConfigError(f"config file {path} is a binary file, expected YAML text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"config file {path} is not UTF-8 text (byte 0x{data[e.start]:02x} on line {line})") from None


def load_raw(source: str | Path, _seen: tuple[str, ...] = (), *, _base: Path | None = None) -> dict[str, Any]:
    """Read a YAML file or preset into a raw dict, resolving ``extends:`` (path or preset name).

    A file must be a regular UTF-8 file of at most :data:`MAX_CONFIG_BYTES` holding a non-empty
    mapping, within the limits of :func:`parse_yaml`.
    """
    path = _resolve_source(source, _base)
    key = str(path.resolve())
    if key in _seen:
        raise ConfigError(f"`extends` cycle through {path}")
    raw = parse_yaml(_read_config_text(path), f"config file {path}")
    if raw is None or raw == {}:
        raise ConfigError(
            f"config file {path} is empty; write at least `extends:` or `recipe:` (see `rankwise presets`)"
        )
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must contain a mapping, got {type(raw).__name__}")
    raw = upgrade_legacy(raw)
    parent = raw.pop("extends", None)
    if parent is not None:
        if not isinstance(parent, str) or not parent:
            raise ConfigError(f"`extends` in {path} must be a preset name or a file path, got {_short(parent)}")
        raw = _deep_merge(load_raw(parent, (*_seen, key), _base=path.parent), raw)
    return raw


def _select(node: list[Any], part: str, item: str) -> dict[str, Any]:
    """The list entry ``part`` of ``node``: an index, or the mapping whose ``name`` is ``part`` (appended if absent)."""
    if part.isdigit():
        i = int(part)
        if i >= len(node) or not isinstance(node[i], dict):
            raise ConfigError(f"--set {item}: no entry {i} (the list has {len(node)})")
        return node[i]
    for entry in node:
        if isinstance(entry, dict) and entry.get("name") == part:
            return entry
    node.append({"name": part})
    return node[-1]


def _is_list_field(parts: list[str]) -> bool:
    """Whether the dotted path ``parts`` of a :class:`Config` is a list field (e.g. ``loss.regularizers``)."""
    tp = _walk(Config, tuple(parts))
    return tp is not None and get_origin(_unwrap(tp)) is list


def apply_overrides(raw: dict[str, Any], overrides: list[str] | None) -> dict[str, Any]:
    """Apply ``a.b.c=value`` strings (value parsed as YAML) to a raw dict (copied).

    In a list of named entries (``loss.regularizers``) a key part selects the entry by ``name``
    (adding it if absent) or by index: ``loss.regularizers.ranksim.weight=1``. Values are parsed by
    :func:`parse_yaml` (its limits apply to each value).
    """
    out = copy.deepcopy(raw)
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, text = item.split("=", 1)
        key = key.strip()
        if not key or any(not p for p in key.split(".")):
            raise ConfigError(f"--set expects key=value, got {item!r}")
        value = parse_yaml(text, f"--set {key}") if text.strip() else ""
        node: Any = out
        parts = key.split(".")
        for i, part in enumerate(parts[:-1]):
            if isinstance(node, list):
                node = _select(node, part, item)
                continue
            if node.get(part) is not None and not isinstance(node[part], (dict, list)):
                where = ".".join(parts[: i + 1])
                raise ConfigError(
                    f"--set {item}: `{where}` is {type(node[part]).__name__} {_short(node[part])} in the config, "
                    "not a mapping"
                )
            if not isinstance(node.get(part), (dict, list)):
                node[part] = [] if _is_list_field(parts[: i + 1]) else {}
            node = node[part]
        if isinstance(node, list):
            raise ConfigError(f"--set {item}: `{key}` names a list entry, set one of its fields")
        node[parts[-1]] = value
    return out


# --------------------------------------------------------------------------------------------------
# legacy layouts (configs saved in run directories before the recipe registry)

_LEGACY_REGULARIZERS = {"pairwise": "pairwise_difference"}


#: places of the pre-registry layout that belonged to one recipe: place -> (its recipe, its key in
#: ``task``; "" merges a mapping into ``task``), registered by the recipe registry
#: (:func:`register_legacy_place`); the config layer itself knows no recipe
_LEGACY_PLACES: dict[str, tuple[str, str]] = {}


def register_legacy_place(place: str, recipe: str, key: str = "") -> None:
    """Configs of the pre-registry layout held ``place`` (a dotted key) for ``recipe``: :func:`upgrade_legacy`
    moves its value to ``task.<key>`` (``key=""``: a mapping merged into ``task``) for that recipe and drops
    it for the others."""
    _LEGACY_PLACES[place] = (recipe, key)


def _pop_place(out: dict[str, Any], place: str) -> tuple[bool, Any]:
    *parents, last = place.split(".")
    node: Any = out
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict) or last not in node:
        return False, None
    return True, node.pop(last)


def upgrade_legacy(raw: dict[str, Any]) -> dict[str, Any]:
    """Rewrite the pre-registry layout into the current one (a copy; current layouts pass unchanged).

    ``run.recipe`` -> ``recipe``; the places registered with :func:`register_legacy_place` (a
    recipe's options saved outside ``task``, e.g. ``run.init_checkpoint``) -> ``task`` of their
    recipe; ``loss.regularizers`` as a ``{name: {weight, options}}`` mapping -> a list; a saved
    default ``loss`` section of a recipe that does not read it is dropped, and the recipe's own
    ``upgrade_legacy(raw)`` (when it has one) rewrites the rest of its old options (e.g. an optimizer
    name saved in ``task``); ``loss.lds`` / ``loss.fds`` -> ``task.lds`` / ``task.fds`` (the options
    of the recipes that read them; a saved default is dropped); ``run.plots`` / ``tsne`` /
    ``plot_samples`` / ``many_shot`` / ``few_shot`` -> ``report.*``.
    """
    out = copy.deepcopy(raw)
    run = out.get("run")
    legacy_recipe = isinstance(run, dict) and "recipe" in run
    if isinstance(run, dict) and legacy_recipe:
        out.setdefault("recipe", run.pop("recipe"))
    name = out.get("recipe", _default_recipe())
    for place, (owner, key) in _LEGACY_PLACES.items():
        found, value = _pop_place(out, place)
        if not found or owner != name:
            continue
        moved = value if not key else {key: value}
        if isinstance(moved, dict):
            out["task"] = {**moved, **(out.get("task") or {})}
    loss = out.get("loss")
    if isinstance(loss, dict) and isinstance(loss.get("regularizers"), dict):
        loss["regularizers"] = [
            {"name": _LEGACY_REGULARIZERS.get(str(k), str(k)), **(v or {})} for k, v in loss["regularizers"].items()
        ]
    recipe = _legacy_recipe(name) if legacy_recipe else None
    if recipe is not None:
        if "loss" not in getattr(recipe, "uses", ()):
            out.pop("loss", None)  # old run directories saved the (unused) default loss section of every recipe
        upgrade = getattr(recipe, "upgrade_legacy", None)
        if upgrade is not None:
            upgrade(out)
    _move_sections(out)
    return out


def upgrade_saved(raw: dict[str, Any]) -> dict[str, Any]:
    """A config saved in a run directory (``config.yaml``), upgraded to the current layout: :func:`upgrade_legacy`,
    then its recipe's ``upgrade_saved(raw)`` (when it has one: options an earlier version saved and the
    recipe no longer reads)."""
    out = upgrade_legacy(raw)
    recipe = _legacy_recipe(out.get("recipe", _default_recipe()))
    upgrade = getattr(recipe, "upgrade_saved", None)
    if upgrade is not None:
        upgrade(out)
    return out


def _legacy_recipe(name: Any) -> Any:
    """The recipe of an old config (None when unknown: :func:`config_from_dict` reports it)."""
    try:
        return _recipe(name)
    except (ConfigError, RuntimeError):
        return None


#: keys that moved: ``loss.lds`` / ``loss.fds`` to the options of the recipes that read them (``task``),
#: the plot and shot-group options of ``run`` to ``report``
_MOVED = {
    ("loss", "lds"): ("task", "lds"),
    ("loss", "fds"): ("task", "fds"),
    **{("run", k): ("report", k) for k in ("plots", "tsne", "plot_samples", "many_shot", "few_shot")},
}
_MOVED_DEFAULTS = {("loss", "lds"): LDSConfig, ("loss", "fds"): FDSConfig}


def current_key(key: str) -> str:
    """The dotted ``key`` at its current place (``run.tsne`` -> ``report.tsne``; others unchanged)."""
    parts = key.split(".")
    new = _MOVED.get(tuple(parts[:2]))  # type: ignore[arg-type]
    return ".".join([*new, *parts[2:]]) if new is not None and len(parts) >= 2 else key


def _is_default(section: Any, value: Any) -> bool:
    """Whether the raw mapping ``value`` only spells defaults of the model ``section`` (a saved, unused section)."""
    if value is None or value == {}:
        return True
    if not isinstance(value, dict) or not set(value) <= set(section.model_fields):
        return False
    return all(section.model_fields[k].get_default(call_default_factory=True) == v for k, v in value.items())


def _move_sections(out: dict[str, Any]) -> None:
    """Move the keys of :data:`_MOVED` in place; a moved value replaces one at the new place (it came later,
    e.g. from ``--set``). A saved default ``loss.lds``/``loss.fds`` is dropped (the recipe may not read it)."""
    for (sec, key), (new_sec, new_key) in _MOVED.items():
        old = out.get(sec)
        if not isinstance(old, dict) or key not in old:
            continue
        value = old.pop(key)
        model = _MOVED_DEFAULTS.get((sec, key))
        if model is not None and _is_default(model, value):
            continue
        target = out.get(new_sec)
        if target is None:
            target = out[new_sec] = {}
        if not isinstance(target, dict):
            raise ConfigError(f"`{new_sec}` must be a mapping, got {type(target).__name__} {_short(target)}")
        prev = target.get(new_key)
        target[new_key] = _deep_merge(prev, value) if isinstance(prev, dict) and isinstance(value, dict) else value


def load_config(source: str | Path | dict[str, Any] | None = None, overrides: list[str] | None = None) -> Config:
    """Load a config file / preset name / raw dict, apply ``--set`` overrides, build it (one pass)."""
    raw: dict[str, Any]
    if source is None:
        raw = {}
    elif isinstance(source, dict):
        raw = upgrade_legacy(source)
    else:
        raw = load_raw(source)
    for hook in _RAW_HOOKS:
        raw = hook(raw, overrides)
    # an override may spell a key at its former place (`--set run.tsne=false`): moved like a file's
    return config_from_dict(upgrade_legacy(apply_overrides(raw, overrides)))


#: functions ``(raw, overrides) -> raw`` that :func:`load_config` applies before the overrides, in the
#: order registered (:mod:`rankwise.recipes.own_data` registers the switch of a preset to another
#: dataset); the config layer knows no recipe or dataset itself
_RAW_HOOKS: list[Callable[[dict[str, Any], list[str] | None], dict[str, Any]]] = []


def register_raw_hook(hook: Callable[[dict[str, Any], list[str] | None], dict[str, Any]]) -> None:
    """Add ``hook`` to the raw-config transformations of :func:`load_config` (once)."""
    if hook not in _RAW_HOOKS:
        _RAW_HOOKS.append(hook)
