"""Typed configuration schema for ``rankwise train`` and friends.

A run is described by a :class:`Config` made of nested dataclasses (``data``, ``model``, ``loss``,
``optimizer``, ``schedule``, ``trainer``, ``run``, ``rnc``). Configs come from YAML files or package
presets (``src/rankwise/recipes/presets/*.yaml``), may ``extends:`` another preset/file, and accept
``--set a.b=value`` overrides whose values are parsed as YAML. The whole tree is validated once by
:func:`config_from_dict`: an unknown key or a bad value raises ``ValueError`` naming the dotted key
and suggesting the valid ones.

Example:
    >>> cfg = load_config("abalone_ranksim", overrides=["trainer.max_epochs=2"])
    >>> cfg.trainer.max_epochs, cfg.loss.regularizers["ranksim"].weight > 0
    (2, True)
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import itertools
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

__all__ = [
    "Config",
    "ConfigError",
    "DataConfig",
    "FDSConfig",
    "LDSConfig",
    "LossConfig",
    "ModelConfig",
    "OptimizerConfig",
    "RegularizerConfig",
    "RnCConfig",
    "RunConfig",
    "ScheduleConfig",
    "TrainerConfig",
    "apply_overrides",
    "config_from_dict",
    "config_to_dict",
    "list_presets",
    "load_config",
    "load_raw",
    "preset_path",
]

PRESET_DIR = Path(__file__).resolve().parent / "presets"

#: regularizers the DIR recipe knows how to call (see ``rankwise.recipes.modules``)
REGULARIZERS = ("ranksim", "conr", "spearman", "pairwise")


class ConfigError(ValueError):
    """A config key or value is invalid (the message names the dotted key)."""


@dataclass
class DataConfig:
    """Which dataset to load and how to batch it."""

    name: str = "abalone"
    #: keyword options passed to ``rankwise.data.get_dataset(name, **options)``
    options: dict[str, Any] = field(default_factory=dict)
    batch_size: int = 64
    eval_batch_size: int = 512
    num_workers: int = 0


@dataclass
class ModelConfig:
    """Backbone (``rankwise.models.build_backbone(backbone, **options)``) + linear head."""

    backbone: str = "mlp"
    options: dict[str, Any] = field(default_factory=dict)
    #: local weights file loaded into the backbone (``torch.load(weights_only=True)``); never downloaded
    weights: str | None = None


@dataclass
class LDSConfig:
    """Label-distribution reweighting / smoothing (Yang et al. 2021)."""

    reweight: Literal["none", "sqrt_inv", "inverse"] = "none"
    lds: bool = False
    kernel: Literal["gaussian", "triang", "laplace"] = "gaussian"
    ks: int = 5
    sigma: float = 2.0


@dataclass
class FDSConfig:
    """Feature-distribution smoothing on the backbone features."""

    enabled: bool = False
    kernel: Literal["gaussian", "triang", "laplace"] = "gaussian"
    ks: int = 5
    sigma: float = 2.0
    momentum: float = 0.9
    start_update: int = 0
    start_smooth: int = 1


@dataclass
class RegularizerConfig:
    """One weighted regularizer added to the task loss: ``weight * loss(..., **options)``."""

    weight: float = 1.0
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class LossConfig:
    """Task loss (``rankwise.imbalanced.regression_loss`` kind) + LDS/FDS + regularizers."""

    kind: Literal["l1", "mse", "huber", "focal_l1", "focal_mse"] = "l1"
    options: dict[str, Any] = field(default_factory=dict)
    lds: LDSConfig = field(default_factory=LDSConfig)
    fds: FDSConfig = field(default_factory=FDSConfig)
    #: name (ranksim | conr | spearman | pairwise) -> weight and options
    regularizers: dict[str, RegularizerConfig] = field(default_factory=dict)


@dataclass
class OptimizerConfig:
    name: Literal["adam", "adamw", "sgd"] = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.9


@dataclass
class ScheduleConfig:
    kind: Literal["none", "multistep", "cosine"] = "none"
    milestones: list[int] = field(default_factory=list)
    gamma: float = 0.1
    warmup_epochs: int = 0


@dataclass
class TrainerConfig:
    """Options forwarded to ``lightning.Trainer``."""

    max_epochs: int = 10
    accelerator: str = "auto"
    devices: Any = "auto"
    strategy: str = "auto"
    num_nodes: int = 1
    precision: str = "32-true"
    deterministic: Any = "warn"
    gradient_clip_val: float | None = None
    log_every_n_steps: int = 10
    limit_train_batches: Any = None
    limit_val_batches: Any = None
    enable_progress_bar: bool = True
    #: ``torch.set_num_threads`` for the run (None: torch's default); 1 is fastest for tiny models
    num_threads: int | None = None


@dataclass
class RnCConfig:
    """Rank-N-Contrast stage 1 (contrastive pretraining); stage 2 uses ``trainer``/``optimizer``."""

    pretrain_epochs: int = 20
    temperature: float = 2.0
    lr: float | None = None
    #: two-view augmentation for tabular inputs: Gaussian noise std and feature-dropout probability
    noise: float = 0.05
    feature_dropout: float = 0.1


@dataclass
class RunConfig:
    name: str = "run"
    recipe: Literal["dir", "rrt", "rnc", "supcon", "sort", "median", "dknn"] = "dir"
    seed: int = 0
    out_dir: str = "runs"
    #: RRT: run directory or ``.ckpt`` whose encoder is frozen and whose head is re-trained
    init_checkpoint: str | None = None
    reset_head: bool = True
    plots: bool = True
    tsne: bool = True
    #: at most this many test examples go into the similarity heatmap / t-SNE
    plot_samples: int = 400
    many_shot: int = 100
    few_shot: int = 20


@dataclass
class Config:
    description: str = ""
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    run: RunConfig = field(default_factory=RunConfig)
    rnc: RnCConfig = field(default_factory=RnCConfig)
    #: options of the reproduction recipes supcon / sort / median / dknn (see ``rankwise.recipes.reproduce``)
    task: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------------
# conversion + validation


def _suggest(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    return f"{hint}valid keys: {', '.join(sorted(valid))}"


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check/convert ``value`` against the annotation ``tp``; raise ``ConfigError`` naming ``key``."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        choices = get_args(tp)
        if value not in choices:
            close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=2, cutoff=0.4)
            hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
            raise ConfigError(f"`{key}` must be one of {list(choices)}, got {value!r}{hint}")
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
                return _coerce(value, a, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"`{key}` has an invalid value {value!r}")
    if dataclasses.is_dataclass(tp):
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise ConfigError(f"`{key}` must be a mapping, got {type(value).__name__} {value!r}")
        return _build(tp, value, key)
    if origin is dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ConfigError(f"`{key}` must be a mapping, got {type(value).__name__} {value!r}")
        _, vt = get_args(tp)
        return {str(k): _coerce(v, vt, f"{key}.{k}") for k, v in value.items()}
    if origin is list:
        if value is None:
            return []
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"`{key}` must be a list, got {type(value).__name__} {value!r}")
        (et,) = get_args(tp)
        return [_coerce(v, et, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"`{key}` must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"`{key}` must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-4" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"`{key}` must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"`{key}` must be a string, got {value!r}")
        return value
    return value  # pragma: no cover - unknown annotation


def _build(cls: Any, raw: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for k, v in raw.items():
        dotted = f"{prefix}.{k}" if prefix else str(k)
        if k not in names:
            raise ConfigError(f"unknown config key `{dotted}`; " + _suggest(str(k), names))
        kwargs[k] = _coerce(v, hints[k], dotted)
    return cls(**kwargs)


def _check_semantics(cfg: Config) -> None:
    def pos(key: str, v: float, allow_zero: bool = False) -> None:
        if v < 0 or (v == 0 and not allow_zero):
            raise ConfigError(f"`{key}` must be {'>= 0' if allow_zero else '> 0'}, got {v!r}")

    pos("data.batch_size", cfg.data.batch_size)
    pos("data.eval_batch_size", cfg.data.eval_batch_size)
    pos("data.num_workers", cfg.data.num_workers, allow_zero=True)
    pos("optimizer.lr", cfg.optimizer.lr)
    pos("optimizer.weight_decay", cfg.optimizer.weight_decay, allow_zero=True)
    pos("trainer.max_epochs", cfg.trainer.max_epochs)
    pos("loss.lds.ks", cfg.loss.lds.ks)
    pos("loss.lds.sigma", cfg.loss.lds.sigma)
    pos("loss.fds.ks", cfg.loss.fds.ks)
    pos("loss.fds.sigma", cfg.loss.fds.sigma)
    pos("rnc.temperature", cfg.rnc.temperature)
    pos("rnc.pretrain_epochs", cfg.rnc.pretrain_epochs)
    if cfg.loss.lds.ks % 2 == 0:
        raise ConfigError(f"`loss.lds.ks` must be odd, got {cfg.loss.lds.ks}")
    if cfg.loss.lds.lds and cfg.loss.lds.reweight == "none":
        raise ConfigError(
            "`loss.lds.lds` is true but `loss.lds.reweight` is 'none': LDS smooths the reweighting "
            "counts, set `loss.lds.reweight` to 'sqrt_inv' or 'inverse'"
        )
    for name, reg in cfg.loss.regularizers.items():
        if name not in REGULARIZERS:
            raise ConfigError(f"unknown regularizer `loss.regularizers.{name}`; " + _suggest(name, list(REGULARIZERS)))
        if reg.weight < 0:
            raise ConfigError(f"`loss.regularizers.{name}.weight` must be >= 0, got {reg.weight}")
    if cfg.run.recipe == "rrt" and not cfg.run.init_checkpoint:
        raise ConfigError("`run.init_checkpoint` is required when `run.recipe` is 'rrt' (a run directory or .ckpt)")
    ms = cfg.schedule.milestones
    if any(b <= a for a, b in itertools.pairwise(ms)):
        raise ConfigError(f"`schedule.milestones` must be increasing, got {ms}")


def _check_kwargs(fn: Any, options: dict[str, Any], key: str, *, supplied: tuple[str, ...] = ()) -> None:
    """Every key of ``options`` must be a parameter of ``fn`` (unless it takes ``**kwargs``)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    valid = [n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL and n not in supplied]
    for name in options:
        if name not in valid:
            raise ConfigError(f"unknown option `{key}.{name}`; " + _suggest(str(name), valid))


def _check_registry(getter: Any, name: str, key: str) -> Any:
    try:
        return getter(name)
    except ValueError as e:
        raise ConfigError(f"`{key}`: {e}") from None


def _check_options(cfg: Config) -> None:
    """Check names and options against the registries and the library signatures."""
    from rankwise import data, losses, models
    from rankwise.imbalanced import regression_loss

    loader = _check_registry(data.DATASETS.get, cfg.data.name, "data.name")
    _check_kwargs(loader, cfg.data.options, "data.options")
    factory = _check_registry(models.BACKBONES.get, cfg.model.backbone, "model.backbone")
    _check_kwargs(factory, cfg.model.options, "model.options")
    _check_kwargs(
        regression_loss, cfg.loss.options, "loss.options", supplied=("pred", "target", "weights", "kind", "reduction")
    )
    fns = {
        "ranksim": ("ranksim_loss", ("features", "targets")),
        "conr": ("conr_loss", ("features", "labels", "preds", "weights")),
        "spearman": ("spearman_loss", ("pred", "target")),
        "pairwise": ("pairwise_difference_loss", ("pred", "target")),
    }
    for name, reg in cfg.loss.regularizers.items():
        fn_name, supplied = fns[name]
        fn = getattr(losses, fn_name, None)
        if fn is not None:
            _check_kwargs(fn, reg.options, f"loss.regularizers.{name}.options", supplied=supplied)


def config_from_dict(raw: dict[str, Any], *, check_options: bool = True) -> Config:
    """Validate a raw (YAML) mapping and return the typed :class:`Config`.

    Besides types and values, the dataset / backbone names and every ``options`` mapping are
    checked against the registries and the signatures of the functions they are passed to
    (``check_options=False`` skips that part).
    """
    raw = {k: v for k, v in (raw or {}).items() if k != "extends"}
    cfg = _build(Config, raw, "")
    _check_semantics(cfg)
    from rankwise.recipes.reproduce import check_task

    check_task(cfg)
    if check_options:
        _check_options(cfg)
    return cfg


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """Plain nested dict (YAML/JSON serializable) of a :class:`Config`."""
    return dataclasses.asdict(cfg)


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
    p = PRESET_DIR / f"{name}.yaml"
    if not p.is_file():
        names = sorted(q.stem for q in PRESET_DIR.glob("*.yaml"))
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        raise ConfigError(f"`{name}` is neither a config file nor a preset; {hint}see `rankwise presets`")
    return p


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def load_raw(source: str | Path, _seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """Read a YAML file or preset into a raw dict, resolving ``extends:`` (path or preset name)."""
    import yaml

    path = Path(source)
    if not (path.suffix in (".yaml", ".yml") and path.is_file()):
        if path.is_file():
            pass
        else:
            path = preset_path(str(source))
    key = str(path.resolve())
    if key in _seen:
        raise ConfigError(f"`extends` cycle through {path}")
    try:
        with open(path) as fh:
            raw = yaml.safe_load(fh) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"cannot parse YAML file {path}: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must contain a mapping, got {type(raw).__name__}")
    parent = raw.pop("extends", None)
    if parent:
        ppath = path.parent / str(parent)
        base_src: str | Path = ppath if ppath.is_file() else str(parent)
        raw = _deep_merge(load_raw(base_src, (*_seen, key)), raw)
    return raw


def apply_overrides(raw: dict[str, Any], overrides: list[str] | None) -> dict[str, Any]:
    """Apply ``a.b.c=value`` strings (value parsed as YAML) to a raw dict (copied)."""
    import yaml

    out = copy.deepcopy(raw)
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, text = item.split("=", 1)
        key = key.strip()
        if not key:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"cannot parse the value of --set {key}: {e}") from e
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[parts[-1]] = value
    return out


def load_config(source: str | Path | dict[str, Any] | None = None, overrides: list[str] | None = None) -> Config:
    """Load a config file / preset name / raw dict, apply ``--set`` overrides, validate once."""
    raw: dict[str, Any]
    if source is None:
        raw = {}
    elif isinstance(source, dict):
        raw = copy.deepcopy(source)
    else:
        raw = load_raw(source)
    return config_from_dict(apply_overrides(raw, overrides))
