"""Your own table: a regression run whose bins, shot groups, batch size and epochs come from the data.

``rankwise train --data FILE.csv --target COL --method lds`` builds its config with
:func:`own_data_config`: the method's loss, model and optimizer come from the bundled preset
``{presets}_{method}`` of the dataset's modality (``abalone_lds`` for a table, ``agedb_dir_lds`` for
images), and everything the preset fitted to its own dataset is derived from the user's data instead
(:func:`data_defaults`): the label bin width, the many/medium/few-shot thresholds, the batch size and
the number of epochs. ``--set`` overrides still win.

A dataset takes part through :func:`register_own_data`: which loader option receives the file and
which the target column, and the preset family of its modality. ``csv`` (numeric columns),
``image_csv`` (a column of image paths) and ``nifti`` (a column of NIfTI volumes: brain age, the
``brain_age_{tsan,mse,sfcn}`` presets, chosen without ``--dataset`` when the CSV's first ``path``
ends in ``.nii``/``.nii.gz``) are registered here; any other loader of a CSV registers itself the
same way.

The other route, a preset with ``--set data.name=csv ...``: the config is built first (the
preset's dataset options dropped, :func:`rankwise.recipes.load_config`), then the run,
once it has loaded the data, replaces the preset's values that the user did not set by the
data-driven ones (:func:`apply_data_defaults`), with a :class:`DataDefaultsWarning` saying so.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from rankwise.data.nifti import PREPROCESSING_OPTIONS
from rankwise.recipes.common import DataDefaultsWarning, shot_thresholds

__all__ = [
    "DataDefaults",
    "DataDefaultsWarning",
    "OwnData",
    "apply_data_defaults",
    "data_defaults",
    "methods",
    "own_data_config",
    "register_own_data",
    "retarget",
]

#: optimizer steps a data-derived run aims at (epochs = steps / batches per epoch, within the bounds)
TARGET_STEPS = 1000
MIN_EPOCHS, MAX_EPOCHS = 10, 200


@dataclass(frozen=True)
class OwnData:
    """How a dataset that reads a user's CSV takes part in the ``--data`` route (:func:`register_own_data`)."""

    dataset: str
    file_option: str
    target_option: str
    presets: str
    max_batch_size: int
    suffixes: tuple[str, ...]
    recipe: str = "dir"
    min_batch_size: int = 16
    method_names: tuple[str, ...] | None = None
    keep_options: tuple[str, ...] = ()
    sniff: Callable[[Path], bool] | None = None
    budget: Callable[[Any, Any], Any] | None = None
    file_options: Callable[[Path], dict[str, Any]] | None = None


class _OwnDataView(Mapping[str, OwnData]):
    """The datasets of the ``--data`` route: a read view of the dataset specs' ``own_data``
    (:data:`rankwise.data.DATASET_SPECS`), by name."""

    def _all(self) -> dict[str, OwnData]:
        from rankwise.data import DATASET_SPECS

        return {name: spec.own_data for name, spec in DATASET_SPECS.items() if spec.own_data is not None}

    def __getitem__(self, name: str) -> OwnData:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


_OWN: Mapping[str, OwnData] = _OwnDataView()


def register_own_data(
    dataset: str,
    *,
    file_option: str = "path",
    target_option: str = "target",
    presets: str = "abalone",
    max_batch_size: int = 256,
    suffixes: Sequence[str] = (),
    recipe: str = "dir",
    method_names: Sequence[str] | None = None,
    keep_options: Sequence[str] = (),
    sniff: Callable[[Path], bool] | None = None,
    min_batch_size: int = 16,
    budget: Callable[[Any, Any], Any] | None = None,
    file_options: Callable[[Path], dict[str, Any]] | None = None,
) -> None:
    """Let ``rankwise train --data FILE --target COL --dataset DATASET`` use the registered loader ``dataset``.

    ``file_option`` / ``target_option``: the loader's options that receive ``FILE`` and ``COL``;
    ``presets``: the preset family whose ``{presets}_{method}`` presets give the methods (loss, model,
    optimizer); ``max_batch_size``: the largest data-derived batch size (images and volumes need
    smaller batches than tables); ``suffixes``: file name endings that select this dataset when
    ``--dataset`` is not given; ``recipe``: the recipe of the family's presets; ``method_names``: the
    methods offered (default every ``{presets}_{m}`` preset of ``recipe``); ``keep_options``: the
    preset's ``data.options`` kept on the user's data (e.g. the volume grid); ``sniff``: a test of the
    file's content that selects this dataset, tried before the suffixes; ``min_batch_size``: the
    smallest data-derived batch size; ``budget``: ``budget(cfg, data)`` -> an object with ``max_batch``
    (the largest batch the machine's memory fits, which caps the data-derived one) and
    ``describe(batch, steps, n_val)`` (the memory and time per epoch, shown with the defaults);
    ``file_options``: ``file_options(FILE)`` -> loader options that the file itself sets, over the kept
    ones (a cohort of ``rankwise preprocess`` sets the grid of its template).

    The dataset must be registered (:func:`rankwise.data.register_dataset`); this sets its spec's
    ``own_data``.
    """
    from rankwise.data import update_dataset

    own = OwnData(
        dataset,
        file_option,
        target_option,
        presets,
        int(max_batch_size),
        tuple(suffixes),
        recipe,
        int(min_batch_size),
        None if method_names is None else tuple(method_names),
        tuple(keep_options),
        sniff,
        budget,
        file_options,
    )
    update_dataset(dataset, own_data=own)


def own_datasets() -> dict[str, OwnData]:
    """The datasets registered for the ``--data`` route."""
    return dict(_OWN)


register_own_data("csv", presets="abalone", max_batch_size=256, suffixes=(".csv", ".zip"))
register_own_data("image_csv", presets="agedb_dir", max_batch_size=64)


def _nifti_sniff(path: Path) -> bool:
    from rankwise.data.nifti import looks_like_nifti_csv

    return looks_like_nifti_csv(path)


def _nifti_grid(path: Path) -> dict[str, Any]:
    """The template grid of a cohort that ``rankwise preprocess`` wrote (``{"shape": [...]}``), else ``{}``."""
    from rankwise.data.nifti import preprocessed_template

    template = preprocessed_template(path)
    if template is None:
        return {}
    from rankwise.data.preprocess import template_grid

    maps, _ = template_grid(template)
    return {"shape": [int(v) for v in maps["mask"].shape]}


def _nifti_budget(cfg: Any, data: Any) -> Any:
    from rankwise.recipes.brain_age.memory import budget

    return budget(cfg, data)


register_own_data(
    "nifti",
    file_option="csv",
    target_option="target",
    presets="brain_age",
    max_batch_size=32,  # the authors' batch, a length of the bundled SoDeep sorters
    min_batch_size=8,
    recipe="brain_age",
    method_names=("tsan", "mse", "sfcn", "coral", "corn", "cdw_ce", "sord", "mean_variance", "dldl"),
    keep_options=tuple(o for o in PREPROCESSING_OPTIONS if o != "cache_dir"),  # the grid, not where it is cached
    sniff=_nifti_sniff,
    budget=_nifti_budget,
    file_options=_nifti_grid,
)


class DataDefaults(NamedTuple):
    """The settings of a run derived from its data (:func:`data_defaults`)."""

    n_train: int
    bin_width: float
    many_shot: float
    few_shot: float
    batch_size: int
    max_epochs: int
    #: ``(key, value derived from the data)`` of the settings among these that ``--set`` gave (their
    #: values above are the user's)
    given: tuple[tuple[str, float], ...] = ()
    #: the memory and time of the run on this machine (a dataset's ``budget``), or ``""``
    cost: str = ""

    def describe(self) -> str:
        """One line: ``bin width 20, many-shot > 18.2 / few-shot < 3.6 training rows per bin, ...``;
        a value that ``--set`` gave is marked ``(--set; the data's 111)``."""
        derived = dict(self.given)

        def mark(key: str) -> str:
            return f" (--set; the data's {derived[key]:.3g})" if key in derived else ""

        text = (
            f"label bin width {self.bin_width:g}; many-shot > {self.many_shot:.3g}{mark('report.many_shot')} and "
            f"few-shot < {self.few_shot:.3g}{mark('report.few_shot')} training rows per bin; batch size "
            f"{self.batch_size}{mark('data.batch_size')}; {self.max_epochs} epochs{mark('trainer.max_epochs')} "
            f"({self.n_train} training rows)"
        )
        return f"{text}; {self.cost}" if self.cost else text


def data_defaults(data: Any, *, max_batch_size: int = 256, min_batch_size: int = 16) -> DataDefaults:
    """Bin width, shot thresholds, batch size and epochs for a regression dataset, from its size and labels.

    Batch size: the largest power of two at most an eighth of the training rows, between
    ``min_batch_size`` (16) and ``max_batch_size`` (so an epoch has about 8 steps or more). Epochs:
    about 1,000 optimizer steps
    (``TARGET_STEPS``; an epoch drops its last partial batch), between 10 and 200. For sklearn's
    diabetes data (310 training rows): batch 32, 9 steps per epoch, 111 epochs; for abalone (3,813
    rows): batch 256, 14 steps, 71 epochs.
    """
    n = len(data.train_labels)
    many, few = shot_thresholds(data)
    batch = 2 ** max(0, math.floor(math.log2(max(n / 8, 1))))
    batch = int(min(max(batch, min_batch_size), max_batch_size))
    steps = max(1, n // batch) if n > batch else 1
    epochs = int(min(max(round(TARGET_STEPS / steps), MIN_EPOCHS), MAX_EPOCHS))
    return DataDefaults(n, float(data.bin_width), many, few, batch, epochs)


def methods(presets: str = "abalone", recipe: str = "dir") -> list[str]:
    """The ``--method`` names of a preset family: ``m`` for every preset ``{presets}_m`` of ``recipe``."""
    from rankwise.recipes.config import list_presets, load_raw

    prefix = f"{presets}_"
    return sorted(
        name[len(prefix) :]
        for name in list_presets()
        if name.startswith(prefix) and load_raw(name).get("recipe", "dir") == recipe
    )


def _own_methods(own: OwnData) -> list[str]:
    if own.method_names is not None:
        return sorted(own.method_names)
    return methods(own.presets, own.recipe)


def _method_text(description: str) -> str:
    """A preset's description without its leading ``Dataset ...:`` part."""
    head, sep, rest = description.partition(": ")
    return rest.strip() if sep and len(head) < 40 else description.strip()


def _dataset_for(path: Path, dataset: str | None) -> OwnData:
    from rankwise.recipes.config import ConfigError

    if dataset is None:
        for own in _OWN.values():
            if own.sniff is not None and own.sniff(path):
                return own
        for own in _OWN.values():
            if own.suffixes and path.name.lower().endswith(own.suffixes):
                return own
        raise ConfigError(
            f"--data {path}: cannot tell the dataset from the file name; pass --dataset, one of {sorted(_OWN)}"
        )
    if dataset not in _OWN:
        raise ConfigError(f"--dataset must be one of {sorted(_OWN)} (datasets that read a CSV), got {dataset!r}")
    return _OWN[dataset]


def _load(dataset: str, options: dict[str, Any]) -> Any:
    """The dataset ``dataset`` loaded with ``options``; an option its loader does not take is a
    :class:`ConfigError` naming ``data.options.KEY``, the valid options and the closest ones."""
    from rankwise.data import DATASETS, DataFormatError, get_dataset
    from rankwise.recipes.config import ConfigError, check_kwargs

    check_kwargs(DATASETS.get(dataset), options, "data.options")
    try:
        return get_dataset(dataset, **options)
    except (DataFormatError, FileNotFoundError):
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(f"cannot load dataset {dataset!r}: {e}") from None


def _option_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """The loader options among ``--set`` strings (``data.options.KEY=VALUE``): they shape the data itself."""
    from rankwise.recipes.config import ConfigError, override_value
    from rankwise.recipes.registry import get_recipe

    out = {}
    for item in overrides:
        key, _, value = item.partition("=")
        key = key.strip()
        if key.startswith("data.options.") and key.count(".") == 2:
            try:
                out[key.rsplit(".", 1)[1]] = override_value({}, key, value, recipes=get_recipe)
            except ConfigError:
                continue  # the config's own check names it
    return out


def _defaults_overrides(d: DataDefaults, run_name: str | None = None) -> list[str]:
    out = [
        f"data.batch_size={d.batch_size}",
        f"trainer.max_epochs={d.max_epochs}",
        f"report.many_shot={d.many_shot!r}",
        f"report.few_shot={d.few_shot!r}",
    ]
    return out + ([f"run.name={run_name}"] if run_name else [])


def own_data_config(
    path: str | Path,
    target: str,
    method: str = "lds",
    *,
    dataset: str | None = None,
    options: dict[str, Any] | None = None,
    overrides: Sequence[str] = (),
) -> tuple[Any, DataDefaults]:
    """The config of ``method`` on the user's file ``path`` (label column ``target``) and its data-derived defaults.

    ``dataset``: a dataset registered with :func:`register_own_data` (default: from the file name,
    ``csv`` for ``.csv``); ``options``: further loader options; ``overrides``: ``--set`` strings,
    applied last (they win over the derived values). Returns ``(Config, DataDefaults)``.

    Example:
        >>> import tempfile, pathlib, numpy as np
        >>> rng = np.random.default_rng(0)
        >>> rows = ["x,y"] + [f"{a:.3f},{int(50 + 100 * a * a)}" for a in rng.random(400)]
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "mine.csv"
        >>> _ = path.write_text("\\n".join(rows) + "\\n")
        >>> cfg, d = own_data_config(path, "y", "lds")
        >>> cfg.data.name, cfg.data.batch_size, cfg.trainer.max_epochs, d.bin_width
        ('csv', 32, 125, 5.0)
    """
    from rankwise._validation import did_you_mean
    from rankwise.recipes import load_config
    from rankwise.recipes.config import ConfigError, load_raw

    path = Path(path)
    own = _dataset_for(path, dataset)
    available = _own_methods(own)
    if method not in available:
        raise ConfigError(f"unknown --method {method!r}; {did_you_mean(method, available, 'methods')}")
    raw = copy.deepcopy(load_raw(f"{own.presets}_{method}"))
    preset_opts = (raw.get("data") or {}).get("options") or {}
    kept = {k: preset_opts[k] for k in own.keep_options if k in preset_opts}
    if own.file_options is not None:
        kept |= own.file_options(path)
    opts = {
        **kept,
        own.file_option: str(path),
        own.target_option: target,
        **(options or {}),
        **_option_overrides(overrides),
    }
    data = _load(own.dataset, opts)
    defaults = data_defaults(data, max_batch_size=own.max_batch_size, min_batch_size=own.min_batch_size)
    text = _method_text(str(raw.get("description", "")))
    raw["description"] = f"{path.name}, target {target} ({len(data.train_labels)} training rows): {text}"
    raw.pop("expected_time", None)  # the preset's own data's
    raw["data"] = {
        "name": own.dataset,
        "options": opts,
        "eval_batch_size": raw.get("data", {}).get("eval_batch_size", 512),
        "num_workers": raw.get("data", {}).get("num_workers", 0),
    }
    run = raw.setdefault("run", {})
    run["name"] = f"{path.stem}_{method}"
    cfg = load_config(raw, [*_defaults_overrides(defaults), *overrides])
    given = _given_keys(overrides)
    plan = own.budget(cfg, data) if own.budget is not None else None
    if plan is not None and "data.batch_size" not in given and plan.max_batch < cfg.data.batch_size:
        fits = int(plan.max_batch)  # the machine's memory caps the data-derived batch
        defaults = data_defaults(data, max_batch_size=fits, min_batch_size=min(own.min_batch_size, fits))
        cfg = load_config(raw, [*_defaults_overrides(defaults), *overrides])
    used = _used_defaults(defaults, cfg, given)
    if plan is not None:
        n, batch = used.n_train, used.batch_size
        steps = max(1, n // batch) if n > batch else 1
        used = used._replace(cost=plan.describe(batch, steps, len(getattr(data, "val_labels", ()))))
    return cfg, used


#: the settings of :class:`DataDefaults` and their config keys
_DERIVED = {
    "batch_size": "data.batch_size",
    "max_epochs": "trainer.max_epochs",
    "many_shot": "report.many_shot",
    "few_shot": "report.few_shot",
}


def _given_keys(overrides: Sequence[str]) -> tuple[str, ...]:
    """The defaults' config keys (``data.batch_size``, ...) that ``--set`` strings give."""
    keys = {item.partition("=")[0].strip() for item in overrides}
    return tuple(k for k in _DERIVED.values() if k in keys)


def _used_defaults(d: DataDefaults, cfg: Any, given: tuple[str, ...]) -> DataDefaults:
    """``d`` with the values the run uses (``--set`` wins over the data-derived ones)."""
    many = cfg.report.many_shot if cfg.report.many_shot is not None else d.many_shot
    few = cfg.report.few_shot if cfg.report.few_shot is not None else d.few_shot
    derived = tuple((key, float(getattr(d, field))) for field, key in _DERIVED.items() if key in given)
    return d._replace(
        batch_size=int(cfg.data.batch_size),
        max_epochs=int(cfg.trainer.max_epochs),
        many_shot=float(many),
        few_shot=float(few),
        given=derived,
    )


def apply_data_defaults(cfg: Any, data: Any = None) -> DataDefaults | None:
    """Fit ``cfg`` to the dataset that ``--set data.name=...`` switched it to; the run calls it once it
    has its data.

    Nothing unless :func:`~rankwise.recipes.load_config` recorded such a switch
    (:func:`~rankwise.recipes.config.dataset_switch`). The description names the new data (unless
    ``--set`` gave one). For a dataset registered with :func:`register_own_data` whose file and
    target options are set, the bin width, shot thresholds, batch size and epochs come from ``data``
    (:func:`data_defaults`) unless ``--set`` gave them; with ``data=None`` such a switch waits (the
    call returns ``None`` and changes nothing). One :class:`DataDefaultsWarning` lists the switch
    (the old dataset, its dropped options) and what the data replaced. Returns the derived defaults,
    or ``None``.
    """
    from rankwise.recipes.config import dataset_switch

    switch = dataset_switch(cfg)
    if switch is None:
        return None
    own = _OWN.get(switch.new)
    opts = cfg.data.options
    if own is not None and own.file_option in opts and own.target_option in opts and data is None:
        return None  # the data decide: called again once they are loaded
    dataset_switch(cfg, pop=True)
    if own is not None and (own.file_option not in opts or own.target_option not in opts):
        return None  # the loader's error names the missing option
    text = _method_text(str(switch.base.get("description", "")))
    notes = [f"data.name={switch.new} replaces the preset's dataset {switch.old}"]
    if switch.options:
        notes.append(f"its data.options {switch.options} are dropped")
    if own is None:
        if "description" not in switch.given:
            cfg.description = f"{switch.new}: {text}"
        warnings.warn("; ".join(notes), DataDefaultsWarning, stacklevel=2)
        return None
    d = data_defaults(data, max_batch_size=own.max_batch_size, min_batch_size=own.min_batch_size)
    if "description" not in switch.given:
        name = Path(str(opts[own.file_option])).name
        cfg.description = f"{name}, target {opts[own.target_option]} ({d.n_train} training rows): {text}"
    replaced = []
    for field, key in _DERIVED.items():
        if any(key == g or key.startswith(g + ".") for g in switch.given):
            continue  # --set gave it (or the mapping holding it)
        section, field_name = key.split(".")
        new_value = getattr(d, field)
        before = (switch.base.get(section) or {}).get(field_name)
        if before is not None and before != new_value:
            replaced.append(f"{key} {before} -> {new_value:g}")
        setattr(getattr(cfg, section), field_name, new_value)
    notes.append("from the data: " + d.describe())
    if replaced:
        notes.append("replacing the preset's " + ", ".join(replaced))
    warnings.warn("; ".join(notes), DataDefaultsWarning, stacklevel=2)
    return d


def retarget(raw: dict[str, Any], overrides: Sequence[str] | None) -> dict[str, Any]:
    """The raw config ``raw`` switched to another dataset by the ``--set data.name=...`` among ``overrides``.

    The raw form of what :func:`~rankwise.recipes.load_config` and the run do (the config
    built first, then :func:`apply_data_defaults` once the data are loaded): the preset's
    ``data.options`` and ``expected_time`` are dropped, the description names the new data and, for
    a dataset registered with :func:`register_own_data`, the bin width, shot thresholds, batch size
    and epochs come from the data unless ``overrides`` set them; a :class:`DataDefaultsWarning` lists
    what was replaced. Returns the (copied) raw config, ``overrides`` not applied; other configs pass
    unchanged.
    """
    from rankwise.recipes import load_config
    from rankwise.recipes.config import ConfigError, dataset_switch

    try:
        cfg = load_config(raw, list(overrides or []))
    except ConfigError:
        return raw  # the config's own error reporting names it
    switch = dataset_switch(cfg)
    if switch is None:
        return raw
    own = _OWN.get(switch.new)
    data = None
    if own is not None and own.file_option in cfg.data.options and own.target_option in cfg.data.options:
        data = _load(switch.new, dict(cfg.data.options))
    d = apply_data_defaults(cfg, data)
    out = copy.deepcopy(raw)
    out.setdefault("data", {}).pop("options", None)
    out.pop("expected_time", None)
    out["description"] = cfg.description
    for key in _DERIVED.values() if d is not None else ():
        if key not in switch.given:
            section, field_name = key.split(".")
            out.setdefault(section, {})[field_name] = getattr(getattr(cfg, section), field_name)
    return out
