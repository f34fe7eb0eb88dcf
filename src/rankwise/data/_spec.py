"""The one dataset registry: a :class:`DatasetSpec` per dataset says what it offers.

A spec names the dataset's loader and its modality (what its items are: a table, images, text
pairs, volumes, query lists or images of classes, :data:`MODALITIES`), and, where the dataset has
them, its reader of new rows for ``rankwise predict`` and its own-data support (``rankwise train
--data FILE``). The loader registers the spec (:func:`register_dataset`); the training recipes,
which this layer does not import, fill the fields they provide with :func:`update_dataset`.

:data:`DATASETS` (name -> loader) is a read view of these specs, kept for the callers that look up a
loader by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast, get_args

from rankwise._registry import Registry, RegistryEntry

__all__ = [
    "DATASETS",
    "DATASET_SPECS",
    "MODALITIES",
    "DatasetSpec",
    "Modality",
    "Task",
    "dataset_spec",
    "modality_of",
    "register_dataset",
    "task_of",
    "update_dataset",
]

F = TypeVar("F", bound=Callable[..., Any])

#: what a dataset's items are
Modality = Literal["table", "images", "text_pairs", "volumes", "query_lists", "classes"]
MODALITIES: tuple[str, ...] = get_args(Modality)
#: what a recipe learns from a modality (a recipe's ``learns``)
Task = Literal["regression", "ranking", "classification"]
_TASKS: dict[str, Task] = {
    "table": "regression",
    "images": "regression",
    "text_pairs": "regression",
    "volumes": "regression",
    "query_lists": "ranking",
    "classes": "classification",
}


@dataclass(frozen=True)
class DatasetSpec:
    """What one registered dataset offers.

    ``loader(**options)`` returns the dataset (:class:`~rankwise.data.RegressionData`,
    :class:`~rankwise.data.RankingData` or :class:`~rankwise.data.ClassificationData`);
    ``modality``: one of :data:`MODALITIES` (``None``: the loaded data object declares it, see
    :func:`modality_of`); ``read_new_rows(run, path)``: the reader of a new file's rows for a trained
    run's predictions (``None``: the dataset's runs do not predict from a file); ``target_column``: the
    new file's column of the target when the run's options do not name one; ``own_data``: how the
    dataset takes part in the ``--data FILE`` route (``None``: it does not), an object of the recipes
    layer.

    Example:
        >>> from rankwise.data import dataset_spec
        >>> spec = dataset_spec("abalone")
        >>> spec.modality, spec.task, spec.loader.__name__
        ('table', 'regression', 'load_abalone')
    """

    name: str
    modality: Modality | None
    loader: Callable[..., Any]
    description: str = ""
    read_new_rows: Callable[..., Any] | None = None
    target_column: str | None = None
    own_data: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "." in self.name:
            raise ValueError(f"`name` must be a non-empty dataset name without '.', got {self.name!r}")
        if self.modality is not None and self.modality not in MODALITIES:
            raise ValueError(f"`modality` must be one of {', '.join(MODALITIES)} or None, got {self.modality!r}")
        if not callable(self.loader):
            raise TypeError(f"`loader` must be callable, got {type(self.loader).__name__}")
        if self.read_new_rows is not None and not callable(self.read_new_rows):
            raise TypeError(f"`read_new_rows` must be callable or None, got {type(self.read_new_rows).__name__}")

    @property
    def task(self) -> Task | None:
        """What a recipe learns from the dataset (``regression``, ``ranking``, ``classification``);
        ``None`` while the modality is left to the data object."""
        return None if self.modality is None else _TASKS[self.modality]


#: every registered dataset's :class:`DatasetSpec`, by name
DATASET_SPECS: Registry[Any] = Registry("dataset")


def _registered(name: str) -> DatasetSpec | None:
    """The spec registered as ``name``, None when there is none."""
    entry = DATASET_SPECS._entries.get(name)
    return None if entry is None else cast(DatasetSpec, entry.fn)


def dataset_spec(name: str) -> DatasetSpec:
    """The :class:`DatasetSpec` of the registered dataset ``name`` (unknown name: a ValueError listing them)."""
    spec: DatasetSpec = DATASET_SPECS.get(name)
    return spec


def register_dataset(name: str, *, description: str = "", modality: Modality | None = None) -> Callable[[F], F]:
    """Decorator registering a loader ``fn(**options) -> RegressionData | RankingData | ClassificationData``
    as the dataset ``name`` of modality ``modality`` (one of :data:`MODALITIES`)."""

    def decorator(fn: F) -> F:
        doc = description or (fn.__doc__ or "").strip().split("\n")[0]
        old = _registered(name)
        if old is None:
            spec = DatasetSpec(name, modality, fn, doc)
        elif old.loader is not fn:
            raise ValueError(f"dataset {name!r} is already registered")
        else:  # the same loader again (a module reloaded): keep what the recipes filled in
            spec = dataclasses.replace(old, modality=modality or old.modality, description=doc)
        DATASET_SPECS.add(name, spec, replace=True, description=doc)
        return fn

    return decorator


def update_dataset(name: str, **fields: Any) -> DatasetSpec:
    """Set ``fields`` of the registered dataset ``name``'s spec (``read_new_rows``, ``target_column``,
    ``own_data``, ...); returns the new spec. The recipes fill what they provide this way."""
    spec = dataset_spec(name)
    settable = {f.name for f in dataclasses.fields(DatasetSpec)} - {"name"}
    unknown = sorted(set(fields) - settable)
    if unknown:
        raise TypeError(f"update_dataset() cannot set {', '.join(unknown)} of a dataset spec")
    new = dataclasses.replace(spec, **fields)
    DATASET_SPECS.add(name, new, replace=True, description=spec.description)
    return new


def modality_of(data: Any) -> Modality:
    """The modality a loaded data object declares: its class's ``modality`` (the containers of
    :mod:`rankwise.data` declare one), else an instance attribute ``modality`` (a run's recorded data);
    a TypeError when it declares none."""
    if getattr(type(data), "modality", None) is not None:
        value = data.modality
    else:
        value = getattr(data, "__dict__", {}).get("modality")
    if value not in MODALITIES:
        raise TypeError(
            f"a {type(data).__name__} declares no dataset modality (one of {', '.join(MODALITIES)}); register its "
            "loader with register_dataset(..., modality=...)"
        )
    return value  # type: ignore[no-any-return]


def task_of(name: str, data: Any = None) -> Task:
    """What a recipe learns from the dataset ``name`` (``regression``, ``ranking``, ``classification``): its
    spec's task, else (no modality in the spec, or data loaded under a name not registered) the task of
    ``data``'s modality (:func:`modality_of`)."""
    spec = _registered(name)
    if spec is None and data is None:
        dataset_spec(name)  # the unknown-name error
    modality = spec.modality if spec is not None else None
    return _TASKS[modality if modality is not None else modality_of(data)]


class SpecView(Registry[Any]):
    """A read view of :data:`DATASET_SPECS`: ``value(spec)`` of every spec for which it is not None.

    It reads as a :class:`~rankwise._registry.Registry` (``get``, ``names``, ``[name]``, ``in``);
    ``add`` and ``register`` write into the specs through ``write(name, obj, description)``, ``pop``
    clears the spec's field (or the spec) through ``remove(name)``.
    """

    def __init__(
        self,
        noun: str,
        value: Callable[[DatasetSpec], Any],
        write: Callable[[str, Any, str], Any],
        remove: Callable[[str], Any],
    ) -> None:
        self.noun = noun
        self._lazy: dict[str, str] = {}
        self._value = value
        self._write = write
        self._remove = remove

    @property  # type: ignore[override]
    def _entries(self) -> Mapping[str, RegistryEntry]:  # type: ignore[override]
        out: dict[str, RegistryEntry] = {}
        for name, entry in DATASET_SPECS._entries.items():
            value = self._value(cast(DatasetSpec, entry.fn))
            if value is not None:
                out[name] = RegistryEntry(name=name, fn=value, gradient="none", description=entry.description)
        return out

    def register(self, name: str, *, description: str = "", **_: Any) -> Callable[[F], F]:  # type: ignore[override]
        """Decorator storing ``fn`` under ``name`` (into the dataset's spec)."""

        def decorator(fn: F) -> F:
            self._write(name, fn, description)
            return fn

        return decorator

    def add(self, name: str, obj: Any, *, replace: bool = False, description: str = "") -> Any:
        """Store ``obj`` under ``name`` (into the dataset's spec); returns ``obj``."""
        if not replace and name in self._entries and self._entries[name].fn != obj:
            raise ValueError(f"{self.noun} {name!r} is already registered")
        self._write(name, obj, description)
        return obj

    def pop(self, name: str, default: Any = None) -> Any:
        """Remove ``name`` from the view (and from the spec); its object, or ``default``."""
        entry = self._entries.get(name)
        if entry is None:
            return default
        self._remove(name)
        return entry.fn


def _write_loader(name: str, fn: Any, description: str) -> None:
    register_dataset(name, description=description)(fn)


#: registered dataset loaders by name: a view of :data:`DATASET_SPECS` (``spec.loader``)
DATASETS: Registry[Callable[..., Any]] = SpecView(
    "dataset", lambda spec: spec.loader, _write_loader, lambda name: DATASET_SPECS.pop(name)
)
