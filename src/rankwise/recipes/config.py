"""Typed configuration of a run: the shared sections, the recipe's ``task`` section, loading and ``--set``.

A run is described by a :class:`Config`: ``recipe`` (a name in the recipe registry, see
:mod:`rankwise.recipes.registry`), the shared sections ``data``, ``model``, ``optimizer``,
``schedule``, ``trainer``, ``run`` (and ``loss`` for the recipes that train a regressor), and
``task``: the options dataclass that the recipe owns (``SortOptions`` for ``recipe: sort``, ...).

Configs come from YAML files or package presets (``src/rankwise/recipes/presets/*.yaml``), may
``extends:`` another preset/file, and accept ``--set a.b=value`` overrides whose values are parsed
as YAML. :func:`load_config` does ONE pass: read YAML -> apply ``--set`` -> build the typed config
(every field's type and range checked where it is read, unknown keys rejected with "did you mean")
-> the recipe's cross-field checks. Recipes receive the typed objects; nothing is converted back.

Every field is declared with :func:`opt`: a default, a one-line description and its range, so the
reference of all fields (:func:`config_fields`) is generated from the code.

Example:
    >>> cfg = load_config("abalone_ranksim", overrides=["trainer.max_epochs=2"])
    >>> cfg.recipe, cfg.trainer.max_epochs, cfg.loss.regularizers[0].name
    ('dir', 2, 'ranksim')
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import itertools
import math
import os
import re
import stat
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple, Union, get_args, get_origin

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
    "RegularizerConfig",
    "RunConfig",
    "ScheduleConfig",
    "TrainerConfig",
    "UserError",
    "apply_overrides",
    "build",
    "config_fields",
    "config_from_dict",
    "config_to_dict",
    "list_presets",
    "load_config",
    "load_raw",
    "opt",
    "parse_yaml",
    "preset_path",
    "upgrade_legacy",
]

#: a plain decimal number written as a string ("1e-4": YAML 1.1 reads it as a string); no "1_000", "nan"
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")

PRESET_DIR = Path(__file__).resolve().parent / "presets"

#: the sections every recipe reads; a recipe lists any other section it reads in ``Recipe.uses``
UNIVERSAL_SECTIONS = ("data", "model", "optimizer", "schedule", "trainer", "run")
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


def opt(
    default: Any = dataclasses.MISSING,
    *,
    doc: str,
    factory: Any = None,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
) -> Any:
    """A config field: its default, one-line description ``doc`` and numeric range (checked when read).

    Numbers must be finite; ``gt``/``ge``/``lt``/``le`` bound them (for a list, every element).
    """
    meta = {"doc": doc, "gt": gt, "ge": ge, "lt": lt, "le": le}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


# --------------------------------------------------------------------------------------------------
# shared sections


@dataclass
class DataConfig:
    """Which dataset to load and how to batch it."""

    name: str = opt("abalone", doc="registered dataset (`rankwise data list`)")
    options: dict[str, Any] = opt(factory=dict, doc="keyword options of the dataset loader (`rankwise data show`)")
    batch_size: int = opt(64, doc="training batch size (per process under DDP)", ge=1)
    eval_batch_size: int = opt(512, doc="batch size of validation, test and prediction", ge=1)
    num_workers: int = opt(0, doc="DataLoader worker processes", ge=0)


@dataclass
class ModelConfig:
    """Backbone (``rankwise.models.build_backbone(backbone, **options)``); the recipe adds its heads."""

    backbone: str = opt("mlp", doc="registered backbone (`rankwise.models.list_backbones()`)")
    options: dict[str, Any] = opt(factory=dict, doc="keyword options of the backbone factory")
    weights: str | None = opt(
        None, doc="local weights file loaded into the backbone (weights_only=True); never downloaded"
    )


@dataclass
class LDSConfig:
    """Label-distribution reweighting / smoothing (Yang et al. 2021)."""

    reweight: Literal["none", "sqrt_inv", "inverse"] = opt("none", doc="per-sample weights from label frequencies")
    lds: bool = opt(False, doc="smooth the label histogram with the kernel before reweighting")
    kernel: Literal["gaussian", "triang", "laplace"] = opt("gaussian", doc="LDS smoothing kernel")
    ks: int = opt(5, doc="LDS kernel size in bins (odd)", ge=1)
    sigma: float = opt(2.0, doc="LDS kernel width", gt=0)


@dataclass
class FDSConfig:
    """Feature-distribution smoothing on the backbone features (Yang et al. 2021)."""

    enabled: bool = opt(False, doc="smooth the features with FDS")
    kernel: Literal["gaussian", "triang", "laplace"] = opt("gaussian", doc="FDS smoothing kernel")
    ks: int = opt(5, doc="FDS kernel size in bins (odd)", ge=1)
    sigma: float = opt(2.0, doc="FDS kernel width", gt=0)
    momentum: float = opt(0.9, doc="momentum of the running per-bin feature statistics", ge=0, le=1)
    start_update: int = opt(0, doc="first epoch whose features update the statistics", ge=0)
    start_smooth: int = opt(1, doc="first epoch whose features are smoothed", ge=0)


@dataclass
class RegularizerConfig:
    """One weighted term ``weight * loss(...)`` added to the task loss; ``name`` is a registered loss."""

    name: str = opt(doc="registered loss whose registry entry declares its inputs (`rankwise.list_losses()`)")
    weight: float = opt(1.0, doc="multiplier of the term (0 = computed nowhere)", ge=0)
    options: dict[str, Any] = opt(factory=dict, doc="keyword options of the loss (checked against its signature)")


@dataclass
class LossConfig:
    """The regression recipes' loss: task loss + LDS weights + FDS + registry regularizers."""

    kind: Literal["l1", "mse", "huber", "focal_l1", "focal_mse"] = opt(
        "l1", doc="`rankwise.imbalanced.regression_loss` kind of the task loss (unless `loss.name` is set)"
    )
    name: str | None = opt(
        None,
        doc="a registered loss used as the task loss instead of `kind` (inputs predictions/targets, "
        "learnable parameters trained)",
    )
    options: dict[str, Any] = opt(factory=dict, doc="keyword options of the task loss")
    lr: float | None = opt(None, doc="learning rate of the task loss's own parameters (default optimizer.lr)", gt=0)
    lds: LDSConfig = opt(factory=LDSConfig, doc="label-distribution smoothing / reweighting")
    fds: FDSConfig = opt(factory=FDSConfig, doc="feature-distribution smoothing")
    regularizers: list[RegularizerConfig] = opt(
        factory=list, doc="weighted losses from the loss registry added to the task loss"
    )


@dataclass
class OptimizerConfig:
    """The optimizer of every recipe (``rankwise.recipes.optim.configure``)."""

    name: Literal["adam", "adamw", "sgd", "lars"] = opt("adam", doc="optimizer (lars: timm.optim.Lars)")
    lr: float = opt(1e-3, doc="learning rate", gt=0)
    weight_decay: float = opt(0.0, doc="weight decay", ge=0)
    momentum: float = opt(0.9, doc="momentum (sgd, lars)", ge=0, lt=1)


@dataclass
class ScheduleConfig:
    """Learning-rate schedule over the recipe's actual number of epochs/steps."""

    kind: Literal["none", "multistep", "cosine"] = opt("none", doc="lr schedule after the warm-up")
    milestones: list[int] = opt(factory=list, doc="multistep: epochs at which lr is multiplied by gamma", ge=1)
    gamma: float = opt(0.1, doc="multistep decay factor", gt=0, le=1)
    warmup_epochs: int = opt(0, doc="epochs of linear warm-up (per optimizer step)", ge=0)
    interval: Literal["epoch", "step"] = opt("epoch", doc="granularity of the cosine/multistep decay")


@dataclass
class TrainerConfig:
    """Options forwarded to ``lightning.Trainer``."""

    max_epochs: int = opt(10, doc="training epochs (recipes with `task.steps` derive their own)", ge=1)
    accelerator: Literal["auto", "cpu", "gpu", "cuda", "mps", "tpu"] = opt("auto", doc="Lightning accelerator")
    devices: Any = opt("auto", doc="Lightning devices: auto, a count, -1 (all) or a list of indices")
    strategy: str = opt("auto", doc="Lightning strategy, e.g. ddp")
    num_nodes: int = opt(1, doc="number of nodes", ge=1)
    precision: Literal[
        "32-true", "32", "64-true", "64", "16-true", "16-mixed", "16", "bf16-true", "bf16-mixed", "bf16"
    ] = opt("32-true", doc="Lightning precision")
    deterministic: Any = opt("warn", doc="torch deterministic algorithms: true, false or warn")
    gradient_clip_val: float | None = opt(None, doc="clip gradients to this norm", ge=0)
    log_every_n_steps: int = opt(10, doc="logging interval in steps", ge=1)
    limit_train_batches: Any = opt(None, doc="batches per training epoch: a count or a fraction in (0, 1]")
    limit_val_batches: Any = opt(None, doc="validation batches: a count or a fraction in [0, 1]")
    enable_progress_bar: bool = opt(True, doc="show the progress bar (with --progress)")
    num_threads: int | None = opt(None, doc="torch.set_num_threads for the run (None: torch's default)", ge=1)


@dataclass
class RunConfig:
    """Run directory, seed, evaluation and plots."""

    name: str = opt("run", doc="run directory name under out_dir (one path component)")
    seed: int = opt(0, doc="seed of initialisation, sampling and augmentation", ge=0, lt=2**32)
    out_dir: str = opt("runs", doc="parent folder of the run directory")
    plots: bool = opt(True, doc="write plots/ after training")
    tsne: bool = opt(True, doc="include the t-SNE plot")
    plot_samples: int = opt(400, doc="test examples in the similarity heatmap / t-SNE", ge=1)
    many_shot: float | None = opt(
        None, doc="a label bin with more training examples is many-shot (null: the dataset's own threshold)", ge=0
    )
    few_shot: float | None = opt(
        None, doc="a label bin with fewer training examples is few-shot (null: the dataset's own threshold)", ge=0
    )


@dataclass
class Config:
    """A whole run. ``task`` is the options dataclass of ``recipe`` (see ``rankwise.recipes.registry``)."""

    recipe: str = opt("dir", doc="training recipe (`rankwise.recipes.list_recipes()`)")
    description: str = opt("", doc="one line shown by `rankwise presets`")
    expected_time: str = opt("", doc="expected wall time of the run on 2 CPU cores, shown by `rankwise presets`")
    data: DataConfig = opt(factory=DataConfig, doc="dataset and batching")
    model: ModelConfig = opt(factory=ModelConfig, doc="backbone")
    loss: LossConfig = opt(factory=LossConfig, doc="loss of the regression recipes (dir, rrt, rnc)")
    optimizer: OptimizerConfig = opt(factory=OptimizerConfig, doc="optimizer")
    schedule: ScheduleConfig = opt(factory=ScheduleConfig, doc="learning-rate schedule")
    trainer: TrainerConfig = opt(factory=TrainerConfig, doc="Lightning Trainer options")
    run: RunConfig = opt(factory=RunConfig, doc="run directory, seed, evaluation")
    task: Any = opt(None, doc="the recipe's own options (its options dataclass)")


# --------------------------------------------------------------------------------------------------
# typed building (one pass) + validation


def _suggest(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    return f"{hint}valid keys: {', '.join(sorted(valid))}"


def _check_range(value: Any, meta: Any, key: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"`{key}` must be a finite number, got {_short(value)}")
    for bound, ok, sym in (
        ("gt", lambda v, b: v > b, ">"),
        ("ge", lambda v, b: v >= b, ">="),
        ("lt", lambda v, b: v < b, "<"),
        ("le", lambda v, b: v <= b, "<="),
    ):
        b = meta.get(bound) if meta else None
        if b is not None and not ok(value, b):
            raise ConfigError(f"`{key}` must be {sym} {b:g}, got {_short(value)}")


def _coerce(value: Any, tp: Any, key: str, meta: Any = None) -> Any:
    """Check/convert ``value`` against the annotation ``tp``; raise ``ConfigError`` naming ``key``."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        choices = get_args(tp)
        if value not in choices and isinstance(value, int) and str(value) in choices:
            value = str(value)  # e.g. precision: 16 -> "16"
        if value not in choices:
            close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=2, cutoff=0.4)
            hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
            raise ConfigError(f"`{key}` must be one of {list(choices)}, got {_short(value)}{hint}")
        return value
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key, meta)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"`{key}` has an invalid value {value!r}")
    if dataclasses.is_dataclass(tp):
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise ConfigError(f"`{key}` must be a mapping, got {type(value).__name__} {_short(value)}")
        return build(tp, value, key)
    if origin is dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ConfigError(f"`{key}` must be a mapping, got {type(value).__name__} {_short(value)}")
        _, vt = get_args(tp)
        return {str(k): _coerce(v, vt, f"{key}.{k}") for k, v in value.items()}
    if origin is list:
        if value is None:
            return []
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"`{key}` must be a list, got {type(value).__name__} {_short(value)}")
        (et,) = get_args(tp)
        out = []
        for i, v in enumerate(value):
            name = v.get("name") if isinstance(v, dict) else None
            out.append(_coerce(v, et, f"{key}.{name}" if isinstance(name, str) else f"{key}[{i}]", meta))
        return out
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"`{key}` must be true or false, got {_short(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"`{key}` must be an integer, got {_short(value)}")
        _check_range(value, meta, key)
        return value
    if tp is float:
        if isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):  # YAML 1.1 reads "1e-4" as a string
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"`{key}` must be a number, got {_short(value)}")
        value = float(value)
        _check_range(value, meta, key)
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"`{key}` must be a string, got {_short(value)}")
        return value
    return value  # pragma: no cover - unknown annotation


def build(cls: Any, raw: dict[str, Any], prefix: str = "") -> Any:
    """Build the dataclass ``cls`` from a raw mapping: types, ranges, unknown keys ("did you mean")."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in raw.items():
        dotted = f"{prefix}.{k}" if prefix else str(k)
        if k not in fields:
            raise ConfigError(f"unknown config key `{dotted}`; " + _suggest(str(k), list(fields)))
        kwargs[k] = _coerce(v, hints[k], dotted, fields[k].metadata)
    for name, f in fields.items():
        if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"`{prefix + '.' if prefix else ''}{name}` is required")
    return cls(**kwargs)


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
    for sec in ("lds", "fds"):
        ks = getattr(cfg.loss, sec).ks
        if ks % 2 == 0:
            raise ConfigError(f"`loss.{sec}.ks` must be odd, got {ks}")
    if cfg.loss.lds.lds and cfg.loss.lds.reweight == "none":
        raise ConfigError(
            "`loss.lds.lds` is true but `loss.lds.reweight` is 'none': LDS smooths the reweighting "
            "counts, set `loss.lds.reweight` to 'sqrt_inv' or 'inverse'"
        )
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
    if cfg.run.few_shot is not None and cfg.run.many_shot is not None and cfg.run.few_shot > cfg.run.many_shot:
        raise ConfigError(f"`run.few_shot` ({cfg.run.few_shot:g}) must be <= `run.many_shot` ({cfg.run.many_shot:g})")


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
    dataclass of the recipe; sections the recipe does not read must be left at their defaults;
    then the shared cross-field checks and the recipe's own (``Recipe.check``: names and options
    against the registries and the library signatures).
    """
    raw = dict(raw or {})
    raw.pop("extends", None)
    recipe = _recipe(raw.get("recipe", "dir"))
    task_raw = raw.pop("task", None)
    if task_raw is not None and not isinstance(task_raw, dict):
        raise ConfigError(f"`task` must be a mapping, got {type(task_raw).__name__} {task_raw!r}")
    cfg = build(Config, raw)
    cfg.task = build(recipe.options, task_raw or {}, "task")
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
    out = dataclasses.asdict(cfg)
    uses = get_recipe(cfg.recipe).uses
    for sec in OPTIONAL_SECTIONS:
        if sec not in uses:
            out.pop(sec)
    return out


# --------------------------------------------------------------------------------------------------
# field reference (generated documentation)


class FieldDoc(NamedTuple):
    key: str
    type: str
    default: Any
    doc: str
    range: str


def _type_str(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_str(a) for a in get_args(tp))
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_str(a) for a in get_args(tp))}]"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _fields(cls: Any, prefix: str) -> Iterator[FieldDoc]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        key = f"{prefix}.{f.name}" if prefix else f.name
        inner = [a for a in (get_args(tp) if get_origin(tp) is list else ()) if dataclasses.is_dataclass(a)]
        if dataclasses.is_dataclass(tp):
            yield from _fields(tp, key)
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        m = f.metadata
        rng = ", ".join(
            f"{s} {m[b]:g}" for b, s in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")) if m.get(b) is not None
        )
        yield FieldDoc(key, _type_str(tp), default, str(m.get("doc", "")), rng)
        for sub in inner:
            yield from _fields(sub, f"{key}[]")


def config_fields(recipe: str | None = None) -> list[FieldDoc]:
    """Every config field (dotted key, type, default, one-line description, range).

    With ``recipe``, the ``task.*`` fields of that recipe's options and only the sections it reads.
    """
    out = [d for d in _fields(Config, "") if d.key != "task"]
    if recipe is not None:
        r = get_recipe(recipe)
        out = [d for d in out if d.key.split(".")[0] not in OPTIONAL_SECTIONS or d.key.split(".")[0] in r.uses]
        out += list(_fields(r.options, "task"))
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
    tp: Any = Config
    for part in parts:
        if not dataclasses.is_dataclass(tp):
            return False
        hints = typing.get_type_hints(tp)
        if part not in hints:
            return False
        tp = hints[part]
    return get_origin(tp) is list


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


def upgrade_legacy(raw: dict[str, Any]) -> dict[str, Any]:
    """Rewrite the pre-registry layout into the current one (a copy; current layouts pass unchanged).

    ``run.recipe`` -> ``recipe``; ``rnc:`` -> ``task`` of recipe rnc; ``run.init_checkpoint`` /
    ``run.reset_head`` -> ``task`` of recipe rrt; ``loss.regularizers`` as a ``{name: {weight,
    options}}`` mapping -> a list; SupCon's ``task.optimizer`` -> ``optimizer.name`` (with
    ``schedule.interval: step``, the old SupCon schedule).
    """
    out = copy.deepcopy(raw)
    run = out.get("run")
    legacy_recipe = isinstance(run, dict) and "recipe" in run
    if isinstance(run, dict) and legacy_recipe:
        out.setdefault("recipe", run.pop("recipe"))
    recipe = out.get("recipe", "dir")
    if isinstance(run, dict):
        moved = {k: run.pop(k) for k in ("init_checkpoint", "reset_head") if k in run}
        if moved and recipe == "rrt":
            out["task"] = {**moved, **(out.get("task") or {})}
    if "rnc" in out:
        rnc = out.pop("rnc")
        if recipe == "rnc" and isinstance(rnc, dict):
            out["task"] = {**rnc, **(out.get("task") or {})}
    loss = out.get("loss")
    if isinstance(loss, dict) and isinstance(loss.get("regularizers"), dict):
        loss["regularizers"] = [
            {"name": _LEGACY_REGULARIZERS.get(str(k), str(k)), **(v or {})} for k, v in loss["regularizers"].items()
        ]
    task = out.get("task")
    if legacy_recipe and recipe == "supcon" and isinstance(task, dict):
        name = task.pop("optimizer", "sgd")
        out.setdefault("optimizer", {})["name"] = name
        out.setdefault("schedule", {}).setdefault("interval", "step")
    if legacy_recipe and recipe in ("supcon", "sort", "median", "dknn"):
        out.pop("loss", None)  # old run directories saved the (unused) default loss section of every recipe
    return out


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
    return config_from_dict(apply_overrides(raw, overrides))


#: functions ``(raw, overrides) -> raw`` that :func:`load_config` applies before the overrides, in the
#: order registered (:mod:`rankwise.recipes.own_data` registers the switch of a preset to another
#: dataset); the config layer knows no recipe or dataset itself
_RAW_HOOKS: list[Callable[[dict[str, Any], list[str] | None], dict[str, Any]]] = []


def register_raw_hook(hook: Callable[[dict[str, Any], list[str] | None], dict[str, Any]]) -> None:
    """Add ``hook`` to the raw-config transformations of :func:`load_config` (once)."""
    if hook not in _RAW_HOOKS:
        _RAW_HOOKS.append(hook)
