"""Building a :class:`Config`: pydantic's errors as one-line messages, the cross-field checks, the recipe lookup."""

from __future__ import annotations

import itertools
import math
from typing import Any, TypeVar, get_args, get_origin

from pydantic import BaseModel, ValidationError

from rankwise._suggest import did_you_mean, suggestion
from rankwise.recipes.config._lookup import RecipeLookup, default_recipe, lookup_recipe
from rankwise.recipes.config._parsing import ConfigError, short
from rankwise.recipes.config._sections import (
    OPTIONAL_SECTIONS,
    UNIVERSAL_SECTIONS,
    Config,
    FDSConfig,
    LDSConfig,
    StepBudget,
    TrainerConfig,
    accepts,
    is_model,
    unwrap,
)

M = TypeVar("M", bound=BaseModel)

# --------------------------------------------------------------------------------------------------
# validation: pydantic's errors as the one-line messages of the CLI


def walk(model: type[BaseModel], loc: tuple[Any, ...]) -> Any:
    """The annotation at ``loc`` below ``model`` (``None`` past an unknown key or a union branch)."""
    tp: Any = model
    for part in loc:
        tp = unwrap(tp)
        if isinstance(part, int) and get_origin(tp) is list:
            tp = get_args(tp)[0]
        elif isinstance(part, str) and is_model(tp) and part in tp.model_fields:
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
    tp = walk(model, loc)
    if kind == "extra_forbidden":
        parent = unwrap(walk(model, loc[:-1]))
        valid = list(parent.model_fields) if is_model(parent) else []
        return f"unknown config key `{key}`; " + did_you_mean(str(loc[-1]), valid)
    if kind == "missing":
        return f"`{key}` is required"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        bound, sym = {"greater_than": ("gt", ">"), "greater_than_equal": ("ge", ">="), "less_than": ("lt", "<")}.get(
            kind, ("le", "<=")
        )
        shown = float(value) if isinstance(value, int) and tp is not None and accepts(unwrap(tp), float) else value
        return f"`{key}` must be {sym} {ctx[bound]:g}, got {short(shown)}"
    if kind == "finite_number":
        return f"`{key}` must be a finite number, got {short(value)}"
    if kind == "literal_error":
        choices = list(get_args(unwrap(tp))) if tp is not None else []
        hint = f" ({close})" if (close := suggestion(value, choices)) else ""
        return f"`{key}` must be one of {choices}, got {short(value)}{hint}"
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
    if kind == "string_type" and isinstance(value, (bool, int, float)):
        return f"`{key}` must be a string, got {short(value)} (quote it in YAML to keep the text)"
    if kind in expected:
        return f"`{key}` must be {expected[kind]}, got {short(value)}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"`{key}` must be a mapping, got {type(value).__name__} {short(value)}"
    if kind == "list_type":
        return f"`{key}` must be a list, got {type(value).__name__} {short(value)}"
    return f"`{key}`: {err['msg']}, got {short(value)}"  # pragma: no cover - every type above is mapped


def validate_section(model: type[M], raw: Any, prefix: str = "", *, context: dict[str, Any] | None = None) -> M:
    """Build the model ``model`` of a raw (YAML) mapping; the first problem is a :class:`ConfigError`.

    The message names the dotted key (below ``prefix``) and what was expected: the valid keys and
    the closest ones ("did you mean"), the type, the range or the choices. ``context``: pydantic's
    validation context (a :class:`Config` takes ``{"recipe": Recipe}``: its ``task`` is then built
    as the recipe's options model, in the same validation).
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        where = f"`{prefix}`" if prefix else "the config"
        raise ConfigError(f"{where} must be a mapping, got {type(raw).__name__} {short(raw)}")
    try:
        return model.model_validate(raw, context=context)
    except ValidationError as e:
        err = e.errors()[0]
        recipe = (context or {}).get("recipe")
        if recipe is not None and tuple(err["loc"])[:1] == ("task",):  # an error of the recipe's own model
            task_key = f"{prefix}.task" if prefix else "task"
            err = {**err, "loc": tuple(err["loc"])[1:]}
            raise ConfigError(_message(err, recipe.options, raw.get("task"), task_key)) from None
        raise ConfigError(_message(err, model, raw, prefix)) from None


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
        raise ConfigError(f"`{key}` must be a count or a fraction in [0, 1], got {short(value)}")
    if isinstance(value, float) and not (math.isfinite(value) and 0 <= value <= 1):
        raise ConfigError(f"`{key}` as a fraction must be in [0, 1], got {short(value)}")
    if isinstance(value, int) and value < 0:
        raise ConfigError(f"`{key}` must be >= 0, got {short(value)}")


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
    _check_half_precision_eps(cfg)
    rep = cfg.report
    if rep.few_shot is not None and rep.many_shot is not None and rep.few_shot > rep.many_shot:
        raise ConfigError(f"`report.few_shot` ({rep.few_shot:g}) must be <= `report.many_shot` ({rep.many_shot:g})")
    study = cfg.study
    if study.reference_group is not None and study.group_column is None:
        raise ConfigError("`study.reference_group` names a group of `study.group_column`: set that column too")
    if study.harmonize == "combat" and study.site_column is None:
        raise ConfigError("`study.harmonize: combat` harmonises across the sites of `study.site_column`: set it")


#: smallest normal float16, ``numpy.finfo(numpy.float16).tiny`` (numpy is not imported by the config layer)
FLOAT16_TINY = 2.0**-14


def _check_half_precision_eps(cfg: Config) -> None:
    """``16-true`` keeps the weights and Adam's moments in float16, where an ``eps`` below the smallest
    normal float16 (6.1e-5) vanishes or is denormal: the first step divides by (nearly) zero."""
    o = cfg.optimizer
    tiny = FLOAT16_TINY
    if str(cfg.trainer.precision) == "16-true" and o.name in ("adam", "adamw") and o.eps < tiny:
        raise ConfigError(
            f"`trainer.precision` '16-true' keeps {o.name}'s state in float16, where `optimizer.eps` {o.eps:g} is "
            f"below the smallest normal float16 ({tiny:.3g}) and the first step divides by zero: set "
            "optimizer.eps=1e-4, or use --precision 16-mixed (float32 weights)"
        )


def check_lds(lds: LDSConfig, key: str = "task") -> None:
    """Cross-field checks of the LDS options (an odd kernel size; LDS smooths a reweighting)."""
    if lds.ks % 2 == 0:
        raise ConfigError(f"`{key}.lds.ks` must be odd, got {lds.ks}")
    if lds.lds and lds.reweight == "none":
        raise ConfigError(
            f"`{key}.lds.lds` is true but `{key}.lds.reweight` is 'none': LDS smooths the reweighting "
            f"counts, set `{key}.lds.reweight` to 'sqrt_inv' or 'inverse'"
        )


def check_lds_fds(lds: LDSConfig, fds: FDSConfig, key: str = "task") -> None:
    """Cross-field checks of LDS and FDS options (odd kernel sizes; LDS smooths a reweighting)."""
    for sec, ks in (("lds", lds.ks), ("fds", fds.ks)):
        if ks % 2 == 0:
            raise ConfigError(f"`{key}.{sec}.ks` must be odd, got {ks}")
    check_lds(lds, key)


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
            raise ConfigError(f"unknown option `{key}.{name}`; " + did_you_mean(str(name), valid))


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


def config_from_dict(raw: dict[str, Any] | None, *, recipes: RecipeLookup) -> Config:
    """Build and validate the typed :class:`Config` of a raw (YAML) mapping, in one pass.

    ``recipes``: the recipe look-up ``name -> Recipe`` that resolves ``recipe:``
    (``rankwise.recipes.get_recipe``; :func:`rankwise.recipes.config_from_dict` passes it).

    Types, ranges and unknown keys of every section, the ``task`` section as the options model of
    the recipe (one pydantic validation, the recipe in its context); sections the recipe does not
    read must be left at their defaults; then the shared cross-field checks and the recipe's own
    (``Recipe.check``: names and options against the registries and the library signatures). The
    config keeps the sections its recipe reads (what :func:`config_to_dict` writes).
    """
    raw = dict(raw or {})
    raw.pop("extends", None)
    recipe = lookup_recipe(raw.get("recipe", default_recipe()), recipes)
    task_raw = raw["task"] = raw.get("task")  # validated when absent too: the recipe's defaults
    if task_raw is not None and not isinstance(task_raw, dict):
        raise ConfigError(f"`task` must be a mapping, got {type(task_raw).__name__} {task_raw!r}")
    cfg = validate_section(Config, raw, context={"recipe": recipe})
    for sec in OPTIONAL_SECTIONS:
        if sec not in recipe.uses and getattr(cfg, sec) != getattr(Config(), sec):
            raise ConfigError(f"`{sec}` is not used by recipe {recipe.name!r} (it reads: {_sections(recipe)})")
    _check_step_budget(cfg, recipe)
    cfg._uses = frozenset(recipe.uses)
    _check_shared(cfg)
    _check_library(cfg)
    recipe.check(cfg)
    return cfg


def _check_step_budget(cfg: Config, recipe: Any) -> None:
    """A recipe that trains a budget of steps (its options a :class:`StepBudget`) derives its epochs from
    ``task.steps`` / ``task.steps_per_epoch``: a ``trainer.max_epochs`` other than the default would be
    ignored, so it is refused, naming the keys that set the budget."""
    if not isinstance(cfg.task, StepBudget):
        return
    default = TrainerConfig.model_fields["max_epochs"].default
    if cfg.trainer.max_epochs != default:
        raise ConfigError(
            f"`trainer.max_epochs` is not read by recipe {recipe.name!r}: it trains `task.steps` "
            f"({cfg.task.steps}) in epochs of `task.steps_per_epoch` ({cfg.task.steps_per_epoch}); set those instead"
        )


def _sections(recipe: Any) -> str:
    return ", ".join([*UNIVERSAL_SECTIONS, *sorted(recipe.uses), "task"])


def _by_dotted_key(d: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config dict by dotted key; empty dicts, lists and other values are leaves."""
    if not isinstance(d, dict) or not d:
        return {prefix.rstrip("."): d} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out |= _by_dotted_key(v, f"{prefix}{k}.")
    return out


def config_changes(
    before: dict[str, Any], now: dict[str, Any], *, shared_only: bool = True
) -> dict[str, tuple[Any, Any]]:
    """The dotted config keys whose value differs between two :func:`config_to_dict` dicts,
    ``key -> (value before, value now)``, in the order of ``now``. With ``shared_only`` a key only one of
    them has (a field of another rankwise version) is left out; without it, it is reported with ``None``
    on the side that lacks it (after the keys of ``now``)."""
    a, b = _by_dotted_key(before), _by_dotted_key(now)
    keys = [k for k in b if k in a] if shared_only else [*b, *(k for k in a if k not in b)]
    return {k: (a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k)}


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """Plain nested dict (YAML/JSON serializable) of a :class:`Config`: the sections its recipe reads
    (those :func:`config_from_dict` recorded; a config built without its recipe keeps every section)."""
    out = cfg.model_dump(mode="python")
    out["task"] = cfg.task.model_dump(mode="python") if isinstance(cfg.task, BaseModel) else cfg.task
    if cfg._uses is not None:
        for sec in OPTIONAL_SECTIONS:
            if sec not in cfg._uses:
                out.pop(sec)
    return out
