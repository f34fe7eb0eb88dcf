"""``RUN_DIR/data.json``: what a run was trained on, so that it stands on its own.

At training time :func:`record_data` writes, next to ``config.yaml``:

* ``data``: the run's ``data.name`` and ``data.options`` as trained (the paths in them absolute:
  :func:`absolute_data_paths`);
* ``files``: a fingerprint (absolute path, size, SHA-256) of every data file its loader read
  (:func:`rankwise.data._files.recording_reads`) and of every file a path option names;
* ``split``: a digest of the split (the labels, row indices, subjects and query offsets of each split);
* ``summary``: what a prediction needs without the training files: the dataset's sizes and scalars
  (``input_dim``, ``bin_width``, ``num_features``, ``num_classes``, ``image_shape``, ...), the
  training labels (label bins, ordinal classes) and ``meta`` (feature names and statistics, the LETOR
  standardisation, class names, the volume grid) without its per-row lists.

Whenever the run's data are read again (``evaluate``, ``predict`` when it needs them, ``train --resume``)
:func:`check_options` and :func:`check_files` come first and :func:`check_split` after the loading: an
edited ``config.yaml`` data section, a data file whose size or content changed, or a rebuilt split that
differs is one :class:`DataChangedError` naming the key or the file; ``allow_changed`` turns each into a
:class:`ChangedDataWarning` instead. :class:`RecordedData` is the dataset as the summary describes it
(``rankwise predict`` of a table, LETOR or image-class run: no training file read); a recipe that reaches
for what the summary lacks (the splits themselves) raises :class:`RecordLacks`, and the prediction then
loads the data through the checks above.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from rankwise.recipes.config import Config, UserError
from rankwise.recipes.rundir._files import write_json

#: the record's file in the run directory
RECORD_NAME = "data.json"
#: the folder of ``rankwise evaluate --allow-changed-data``'s metrics, predictions and plots
CHANGED_DATA_DIR = "changed_data"
#: the ``data.options`` that name a file or folder (of every loader: ``csv``, ``letor``, ``nifti`` ...)
PATH_OPTIONS = ("path", "csv", "root", "cache_dir")
#: data options that say where derived files are kept, not which data: a run may move them (a NIfTI
#: cache checks each entry against its recorded checksum, and rebuilds a bad one, wherever it is)
WHERE_ONLY = ("cache_dir",)
#: the ``kind`` entry of a summary, the file's name of a regression dataset's modality
KIND_OF_MODALITY = {"table": "tabular", "images": "image", "text_pairs": "text_pair", "volumes": "volume"}
#: the scalar attributes of a dataset kept in the summary (those it has; ``kind`` from its modality)
_SCALARS = (
    "name",
    "kind",
    "modality",
    "input_dim",
    "bin_width",
    "label_name",
    "label_unit",
    "label_description",
    "label_axis",
    "shot_thresholds",
    "num_features",
    "num_classes",
    "image_shape",
)
#: per-row entries of ``meta`` left out of the summary (a prediction does not use them)
_ROW_META = ("indices", "train_paths", "notes", "resolved_options")
_ROW_SUFFIXES = ("_subjects", "_sites", "_rows", "_paths")


class DataChangedError(UserError):
    """The data a run reads again differ from those it was trained on (one line naming the file or key)."""


class ChangedDataWarning(UserWarning):
    """A change of a run's data that ``--allow-changed-data`` lets through (the CLI: a ``warning:`` line)."""


class RecordLacks(Exception):
    """A prediction asked :class:`RecordedData` for what the record does not hold (the data must be loaded)."""


# ------------------------------------------------------------------------------------------ training time


def absolute_data_paths(cfg: Config) -> None:
    """Make every relative path option of ``cfg.data.options`` (:data:`PATH_OPTIONS`) absolute, from the
    current directory: the run's ``config.yaml`` then names the same files from anywhere."""
    opts = cfg.data.options
    for key in PATH_OPTIONS:
        value = opts.get(key)
        if isinstance(value, (str, os.PathLike)) and str(value) and not os.path.isabs(value):
            opts[key] = os.path.abspath(value)


def data_files(cfg: Config, read: Iterable[Path]) -> list[Path]:
    """The absolute paths of the files ``read`` and of the existing files the path options name, each once."""
    named = [Path(v) for k in PATH_OPTIONS if isinstance(v := cfg.data.options.get(k), (str, os.PathLike))]
    out: dict[str, Path] = {}
    for p in [*read, *(p for p in named if p.is_file())]:
        out.setdefault(os.path.abspath(p), Path(os.path.abspath(p)))
    return list(out.values())


def fingerprint(path: Path) -> dict[str, Any]:
    """``{"path", "size", "sha256"}`` of a file (read in chunks)."""
    from rankwise.data._files import file_digest

    return {"path": str(path), "size": path.stat().st_size, "sha256": file_digest(path)}


def _feed(h: Any, value: Any) -> None:
    if value is None:
        h.update(b"-")
        return
    if hasattr(value, "detach"):  # a tensor
        value = value.detach().cpu().numpy()
    arr = np.asarray(value)
    if arr.dtype == object:
        h.update(json.dumps([str(v) for v in arr.ravel().tolist()]).encode())
        return
    h.update(f"{arr.dtype.str}{arr.shape}".encode())
    h.update(np.ascontiguousarray(arr).tobytes())


def split_digest(data: Any) -> str:
    """SHA-256 of each split's size, labels, row indices, subjects and query offsets (those ``data`` has)."""
    h = hashlib.sha256()
    found = getattr(data, "meta", None)
    meta: dict[str, Any] = found if isinstance(found, dict) else {}
    found = meta.get("indices")
    indices: dict[str, Any] = found if isinstance(found, dict) else {}
    for s in ("train", "val", "test"):
        part = getattr(data, s, None)
        h.update(f"|{s}:{-1 if part is None else len(part)}".encode())
        for value in (
            getattr(data, f"{s}_labels", None),
            getattr(data, f"{s}_targets", None),
            indices.get(s),
            meta.get(f"{s}_subjects"),
            getattr(part, "offsets", None),
            getattr(part, "y", None) if hasattr(part, "offsets") else None,
        ):
            _feed(h, value)
    return h.hexdigest()


class _Skip:
    """An entry that has no JSON form."""


def _encode(value: Any) -> Any:
    """``value`` as JSON (numpy arrays with their dtype), else :class:`_Skip`."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            return _Skip
        return {"__ndarray__": value.tolist(), "dtype": value.dtype.str}
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        items = [_encode(v) for v in value]
        return _Skip if any(v is _Skip for v in items) else items
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        enc = {k: _encode(v) for k, v in value.items()}
        return _Skip if any(v is _Skip for v in enc.values()) else enc
    return _Skip


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"__ndarray__", "dtype"}:
            return np.asarray(value["__ndarray__"], dtype=np.dtype(value["dtype"]))
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def summarize(data: Any) -> dict[str, Any]:
    """The summary of ``data`` (module doc): scalars, training labels, ``meta`` without per-row lists;
    ``lacks``: the ``meta`` keys left out."""
    scalars: dict[str, Any] = {}
    for name in _SCALARS:
        try:
            value = KIND_OF_MODALITY[data.modality] if name == "kind" else getattr(data, name)
        except (AttributeError, KeyError, TypeError):
            continue
        enc = _encode(value)
        if enc is not _Skip:
            scalars[name] = enc
    labels = getattr(data, "train_labels", None)
    if labels is not None:
        scalars["train_labels"] = _encode(np.asarray(labels))
    meta = getattr(data, "meta", None)
    kept: dict[str, Any] = {}
    lacks: list[str] = []
    for key, value in (meta if isinstance(meta, dict) else {}).items():
        enc = _Skip if key in _ROW_META or str(key).endswith(_ROW_SUFFIXES) else _encode(value)
        if enc is _Skip:
            lacks.append(str(key))
        else:
            kept[str(key)] = enc
    return {"attributes": scalars, "meta": kept, "lacks": lacks}


def jsonable(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples as lists, numpy scalars as numbers)."""
    return json.loads(json.dumps(value, default=lambda o: o.item() if isinstance(o, np.generic) else str(o)))


def record_data(run_dir: Path, cfg: Config, data: Any, read: Iterable[Path]) -> None:
    """Write ``RUN_DIR/data.json`` for the run of ``cfg`` on ``data`` (its loader read the files ``read``)."""
    record = {
        "data": {"name": cfg.data.name, "options": jsonable(dict(cfg.data.options))},
        "files": [fingerprint(p) for p in data_files(cfg, read)],
        "split": split_digest(data),
        "summary": summarize(data),
    }
    write_json(Path(run_dir) / RECORD_NAME, record)


# ------------------------------------------------------------------------------------------ reading again


def read_record(run_dir: Path) -> dict[str, Any] | None:
    """``RUN_DIR/data.json`` (None for a run trained before runs recorded their data)."""
    path = Path(run_dir) / RECORD_NAME
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataChangedError(f"{path}: cannot read the run's data record: {e}") from None
    if not isinstance(record, dict) or not isinstance(record.get("data"), dict):
        raise DataChangedError(f"{path}: not a rankwise data record (no `data` section)")
    return record


def _refuse(messages: list[str], allow_changed: bool, advice: str) -> None:
    if not messages:
        return
    if not allow_changed:
        raise DataChangedError(f"{messages[0]}; {advice}")
    for m in messages:
        warnings.warn(f"{m} (--allow-changed-data)", ChangedDataWarning, stacklevel=3)


#: what a refusal advises, by the command that reads the data again
ADVICE = {
    "evaluate": "restore it, train a new run on the new data, or pass --allow-changed-data to evaluate on "
    f"them anyway (the results then go to RUN_DIR/{CHANGED_DATA_DIR}/, metrics.json stays as it is)",
    "predict": "restore it, or train a new run on the new data (--allow-changed-data predicts anyway)",
    "resume": "restore it, or train a new run on the new data (--resume continues on the data it started with)",
}


def check_options(record: dict[str, Any], cfg: Config, *, allow_changed: bool = False, action: str) -> None:
    """``config.yaml``'s ``data.name`` / ``data.options`` as the record has them, key by key."""
    trained = record["data"]
    now = {"name": cfg.data.name, "options": jsonable(dict(cfg.data.options))}
    messages = []
    if now["name"] != trained.get("name"):
        messages.append(f"config.yaml's `data.name` is {now['name']!r}; the run was trained on {trained.get('name')!r}")
    old = trained.get("options") if isinstance(trained.get("options"), dict) else {}
    for key in sorted((set(old) | set(now["options"])) - set(WHERE_ONLY)):
        if key not in now["options"]:
            messages.append(f"config.yaml has no `data.options.{key}`; the run was trained with {old[key]!r}")
        elif key not in old:
            messages.append(f"config.yaml's `data.options.{key}` = {now['options'][key]!r} was not set in training")
        elif now["options"][key] != old[key]:
            messages.append(
                f"config.yaml's `data.options.{key}` is {now['options'][key]!r}; the run was trained with {old[key]!r}"
            )
    _refuse(messages, allow_changed, ADVICE[action].replace("restore it", "restore the value"))


def check_files(record: dict[str, Any], *, allow_changed: bool = False, action: str) -> None:
    """Every file of the record with its recorded size and SHA-256."""
    messages = []
    for f in record.get("files", []):
        path = Path(f["path"])
        if not path.is_file():
            messages.append(f"{path}: the run's data file is missing")
            continue
        size = path.stat().st_size
        if size != f["size"]:
            messages.append(
                f"{path}: the run's data file changed since training ({f['size']:,} bytes then, {size:,} now)"
            )
        elif fingerprint(path)["sha256"] != f["sha256"]:
            messages.append(f"{path}: the run's data file changed since training (same size, other content)")
    _refuse(messages, allow_changed, ADVICE[action])


def check_split(record: dict[str, Any], data: Any, *, allow_changed: bool = False, action: str) -> None:
    """The split rebuilt from the data as the record's digest has it."""
    digest = record.get("split")
    if digest is None or split_digest(data) == digest:
        return
    msg = (
        f"the split rebuilt from the run's data ({record['data'].get('name')!r}) differs from the one it was "
        "trained on (other labels, rows or subjects in train/val/test)"
    )
    _refuse([msg], allow_changed, ADVICE[action].replace("restore it", "restore the data"))


class _RecordedMeta(dict):  # type: ignore[type-arg]
    """``meta`` of :class:`RecordedData`: a key the record left out raises :class:`RecordLacks`."""

    def __init__(self, kept: dict[str, Any], lacks: Iterable[str]) -> None:
        super().__init__(kept)
        self.lacks = frozenset(lacks)

    def __getitem__(self, key: Any) -> Any:
        if key in self.lacks:
            raise RecordLacks(f"meta[{key!r}]")
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        if key in self.lacks:
            raise RecordLacks(f"meta[{key!r}]")
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        if key in self.lacks:
            raise RecordLacks(f"meta[{key!r}]")
        return super().__contains__(key)


class RecordedData:
    """A run's dataset as its record's summary holds it (no split, no file read); any other attribute
    raises :class:`RecordLacks`."""

    def __init__(self, summary: dict[str, Any]) -> None:
        attrs = {k: _decode(v) for k, v in summary.get("attributes", {}).items()}
        for key in ("shot_thresholds", "image_shape"):
            if isinstance(attrs.get(key), list):
                attrs[key] = tuple(attrs[key])
        self.__dict__.update(attrs)
        self.meta = _RecordedMeta(_decode(summary.get("meta", {})), summary.get("lacks", []))

    def __getattr__(self, name: str) -> Any:  # only for the attributes not set in __init__
        if name.startswith("__"):
            raise AttributeError(name)
        raise RecordLacks(name)
