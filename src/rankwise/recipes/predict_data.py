"""The rows of a new file for a trained run's predictions (``rankwise predict``).

:func:`prediction_rows` reads the file with the rules of the run's own loader and turns it into
the inputs its model saw on the test split. Tables (``csv``; ``abalone``: its columns ``sex`` and
the 7 measurements): the training file's feature columns by name (any order, other columns kept as
text), standardized with the TRAINING split's mean and std (those the model was trained with, from
the run's reloaded data). Image lists (``image_csv``: the column ``data.options.image_column``;
``agedb_dir``, ``imdb_wiki_dir``: the column ``path``): image paths relative to
``data.options.root`` (default: the new file's folder, as the loaders resolve their own list),
through the test split's transform. :func:`prediction_columns` appends the predictions to the
file's columns.

Each reader is the ``read_new_rows`` of its dataset's :class:`~rankwise.data.DatasetSpec`;
:data:`PREDICTION_READERS` is the view of those of the regression datasets. The classification
recipes (``supcon``, ``retrieval``, ``topk``) read new rows through the view of those of the ``classes``
datasets, :data:`CLASS_PREDICTION_READERS` (:func:`class_prediction_rows`): a CSV whose ``path`` column lists
image files (relative to the CSV's folder), each read as the run's dataset reads its own images
(:func:`~rankwise.data.class_image_transform` at the run's image shape); for ``topk_synthetic``, a CSV
of its feature columns ``x0`` .. ``x{D-1}`` (by name, any order).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from rankwise._registry import Registry
from rankwise.data import DATASET_SPECS, dataset_spec, update_dataset
from rankwise.data._spec import SpecView
from rankwise.recipes.config import ConfigError

F = TypeVar("F", bound=Callable[..., Any])

__all__ = [
    "CLASS_PREDICTION_READERS",
    "PREDICTION_READERS",
    "ClassImages",
    "PredictionReader",
    "append_columns",
    "check_class_predictable",
    "check_predictable",
    "class_names",
    "class_prediction_rows",
    "extend_columns",
    "prediction_columns",
    "prediction_row_blocks",
    "prediction_rows",
    "register_class_prediction_reader",
    "register_prediction_reader",
    "require_checkpoint",
    "target_column",
]


@dataclass(frozen=True)
class PredictionReader:
    """How a new file of a dataset is read for a trained run: ``read(run, path) -> (header, rows as
    text, dataset)`` (dataset items ``(input, nan)``); ``target``: the file's column of the target
    when ``data.options.target`` does not name it."""

    read: Callable[[Any, Path], tuple[list[str], list[list[str]], Any]]
    target: str | None = None


def _reader(spec: Any) -> PredictionReader | None:
    if spec.read_new_rows is None or spec.task in ("ranking", "classification"):
        return None
    return PredictionReader(spec.read_new_rows, spec.target_column)


def _write_reader(name: str, reader: Any, description: str = "") -> None:
    if not isinstance(reader, PredictionReader):
        reader = PredictionReader(reader)
    update_dataset(name, read_new_rows=reader.read, target_column=reader.target)


#: the datasets whose regression runs predict from a new file (:func:`register_prediction_reader`): a
#: view of the dataset specs' ``read_new_rows`` / ``target_column`` (:data:`rankwise.data.DATASET_SPECS`)
PREDICTION_READERS: Registry[Any] = SpecView(
    "prediction reader",
    _reader,
    _write_reader,
    lambda name: update_dataset(name, read_new_rows=None, target_column=None),
)


def register_prediction_reader(*datasets: str, target: str | None = None) -> Callable[[F], F]:
    """Decorator registering ``read(run, path)`` as the reader of new rows of the (regression) ``datasets``
    (their specs' ``read_new_rows``; ``target``: their ``target_column``)."""

    def decorator(read: F) -> F:
        for name in datasets:
            _write_reader(name, PredictionReader(read, target))
        return read

    return decorator


def check_predictable(cfg: Any) -> None:
    """A ConfigError naming the datasets of :data:`PREDICTION_READERS` unless the run's dataset is one of them."""
    if cfg.data.name not in PREDICTION_READERS:
        raise ConfigError(
            f"recipe {cfg.recipe!r} predicts from a file for runs on the datasets "
            f"{', '.join(PREDICTION_READERS.names())}; this run's dataset is {cfg.data.name!r}"
        )


def target_column(cfg: Any) -> str | None:
    """The column of a run's data file that holds the target: ``data.options.target``, else the one its
    prediction reader registered (``age`` for AgeDB-DIR / IMDB-WIKI-DIR), else the default of its
    loader's ``target`` option (``age`` for NIfTI cohorts); None when there is none (abalone: its
    target, the age, is ``rings + 1.5``; learning to rank: grades, not a target column)."""
    target = cfg.data.options.get("target")
    if target is not None:
        return str(target)
    if cfg.data.name not in DATASET_SPECS:
        return None
    spec = dataset_spec(cfg.data.name)
    if spec.target_column is not None:
        return spec.target_column
    param = inspect.signature(spec.loader).parameters.get("target")
    return param.default if param is not None and isinstance(param.default, str) else None


def prediction_rows(run: Any, path: Path) -> tuple[list[str], list[list[str]], Any]:
    """``(header, rows as text, dataset)`` of the file ``path`` for the run ``run`` (its config and its
    reloaded data); dataset items are ``(input, nan)``. A dataset without a registered reader: a
    ConfigError naming those that have one."""
    check_predictable(run.cfg)
    return PREDICTION_READERS[run.cfg.data.name].read(run, path)


@register_prediction_reader("csv", "abalone")
def _read_table(run: Any, path: Path) -> tuple[list[str], list[list[str]], Any]:
    """The training file's feature columns by name, standardized with the training statistics."""
    from rankwise.data import DataFormatError
    from rankwise.data.tabular import load_csv, read_abalone_rows, read_feature_rows

    meta = run.data.meta
    if run.cfg.data.name == "csv":
        delimiter = _option(load_csv, run.cfg.data.options, "delimiter")
        try:
            table = read_feature_rows(path, meta["feature_names"], delimiter=delimiter)
        except DataFormatError as e:
            if e.row != 1 or "single column" not in str(e):  # a file of another delimiter
                raise
            # the file's delimiter is the run's, not an option of the prediction: say which it is
            why = str(e).removeprefix(f"{e.path}, row 1: ")
            raise DataFormatError(
                e.path or path, 1, f"{why}; the run reads files delimited by {delimiter!r} (its data.options.delimiter)"
            ) from None
    else:
        table = read_abalone_rows(path)
    return table.header, table.rows, _standardized(table, meta)


def prediction_row_blocks(
    run: Any, path: Path, block_rows: int
) -> Iterator[tuple[list[str], list[list[str]], Any]] | None:
    """The ``(header, rows as text, dataset)`` of :func:`prediction_rows` in blocks of at most ``block_rows``
    rows, the file read block by block (:func:`~rankwise.data.tabular.iter_feature_rows`), for a run on a
    ``csv`` table; None for another dataset (:func:`prediction_rows` reads its file whole)."""
    check_predictable(run.cfg)
    if run.cfg.data.name != "csv":
        return None
    return _table_blocks(run, path, block_rows)


def _table_blocks(run: Any, path: Path, block_rows: int) -> Iterator[tuple[list[str], list[list[str]], Any]]:
    from rankwise.data import DataFormatError
    from rankwise.data.tabular import iter_feature_rows, load_csv

    meta = run.data.meta
    delimiter = _option(load_csv, run.cfg.data.options, "delimiter")
    blocks = iter_feature_rows(path, meta["feature_names"], delimiter=delimiter, block_rows=block_rows)
    while True:
        try:
            table = next(blocks, None)
        except DataFormatError as e:
            if e.row != 1 or "single column" not in str(e):
                raise
            why = str(e).removeprefix(f"{e.path}, row 1: ")
            raise DataFormatError(
                e.path or path, 1, f"{why}; the run reads files delimited by {delimiter!r} (its data.options.delimiter)"
            ) from None
        if table is None:
            return
        yield table.header, table.rows, _standardized(table, meta)


def _standardized(table: Any, meta: dict[str, Any]) -> Any:
    """The dataset of a table's rows: the loader's arithmetic (rankwise.data.standardize, then float32)
    with the training statistics, targets NaN."""
    from rankwise.data import TensorPairDataset

    x = (table.features - np.asarray(meta["feature_mean"])) / np.asarray(meta["feature_std"])
    y = torch.full((len(table.rows),), float("nan"))
    return TensorPairDataset(torch.from_numpy(x.astype(np.float32)), y)


@register_prediction_reader("image_csv")
@register_prediction_reader("agedb_dir", "imdb_wiki_dir", target="age")
def _read_images(run: Any, path: Path) -> tuple[list[str], list[list[str]], Any]:
    """Image paths (relative to ``data.options.root``, else the new file's folder) through the test
    split's transform."""
    from rankwise.data.images import load_image_csv, read_image_rows

    options = run.cfg.data.options
    column = _option(load_image_csv, options, "image_column") if run.cfg.data.name == "image_csv" else "path"
    images = read_image_rows(path, run.data.test.transform, image_column=column, root=options.get("root"))
    return images.header, images.rows, images.dataset


def _option(loader: Callable[..., Any], options: dict[str, Any], key: str) -> Any:
    """The loader option ``key`` of a run: its ``data.options`` value, else the loader's default."""
    return options[key] if key in options else inspect.signature(loader).parameters[key].default


def prediction_columns(header: Sequence[str], rows: Sequence[Sequence[str]], pred: Any) -> dict[str, Any]:
    """The file's columns (text, as read) followed by the predictions, named ``prediction`` (or
    ``prediction_1``, ``prediction_2``, ... when the file already has a column of that name).

    Example:
        >>> prediction_columns(["x", "prediction"], [["1", "a"], ["2", "b"]], [0.5, 1.5])
        {'x': ['1', '2'], 'prediction': ['a', 'b'], 'prediction_1': [0.5, 1.5]}
    """
    return append_columns(header, rows, {"prediction": pred})


def append_columns(header: Sequence[str], rows: Sequence[Sequence[str]], computed: dict[str, Any]) -> dict[str, Any]:
    """The file's columns (text, as read) followed by the ``computed`` ones in their order; a computed
    name the file already has becomes ``<name>_1`` (``_2``, ...), the file's column stays as it is.

    Example:
        >>> append_columns(["id", "score"], [["a", "1"]], {"score": [0.5], "prediction": [2]})
        {'id': ['a'], 'score': ['1'], 'score_1': [0.5], 'prediction': [2]}
    """
    return extend_columns({h: [r[i] for r in rows] for i, h in enumerate(header)}, computed)


def extend_columns(columns: dict[str, Any], computed: dict[str, Any]) -> dict[str, Any]:
    """``columns`` (the file's, kept as they are) followed by the ``computed`` ones in their order, a
    computed name the file already has as ``<name>_1`` (``_2``, ...); a new dict."""
    out = dict(columns)
    for key, values in computed.items():
        name, k = key, 0
        while name in out:
            k += 1
            name = f"{key}_{k}"
        out[name] = values
    return out


def require_checkpoint(run: Any, name: str, stage: str = "") -> Path:
    """The path of the run's ``<stage dir>/<name>.ckpt``, else a :class:`~rankwise.recipes.rundir.CheckpointError`
    saying that a run without it cannot predict (checked before the new file is read)."""
    from rankwise.recipes.rundir import CheckpointError

    try:
        return Path(run.checkpoint(name, stage))
    except CheckpointError as e:
        raise CheckpointError(
            f"cannot predict: {e} (a run stopped before it saved a checkpoint has no model; "
            "finish it with `rankwise train ... --resume`)"
        ) from None


# ------------------------------------------------------------------------------ classification datasets


@dataclass(frozen=True)
class ClassImages:
    """New images read for a classification run by :func:`class_prediction_rows`."""

    #: the file's column names, in its order
    header: list[str]
    #: every data row's fields as read (text)
    rows: list[list[str]]
    #: float32 ``(N, C, H, W)``: row ``i``'s image as the run's dataset holds its own images (a dataset
    #: of feature vectors, ``topk_synthetic``: ``(N, D)``, row ``i``'s features)
    images: torch.Tensor


def _class_reader(spec: Any) -> Any:
    return spec.read_new_rows if spec.task == "classification" else None


def _write_class_reader(name: str, read: Any, description: str = "") -> None:
    fields: dict[str, Any] = {"read_new_rows": read}
    if dataset_spec(name).modality is None:  # a reader of class images declares the dataset's modality
        fields["modality"] = "classes"
    update_dataset(name, **fields)


#: the classification datasets whose ``supcon`` / ``retrieval`` / ``topk`` runs predict from a CSV of image files
#: (:func:`register_class_prediction_reader`): ``read(run, path) -> ClassImages``; a view of the
#: ``read_new_rows`` of the dataset specs of modality ``classes``
CLASS_PREDICTION_READERS: Registry[Any] = SpecView(
    "class prediction reader", _class_reader, _write_class_reader, lambda name: update_dataset(name, read_new_rows=None)
)


def register_class_prediction_reader(*datasets: str) -> Callable[[F], F]:
    """Decorator registering ``read(run, path) -> ClassImages`` as the reader of new rows of the
    classification ``datasets`` (their specs' ``read_new_rows``)."""

    def decorator(read: F) -> F:
        for name in datasets:
            _write_class_reader(name, read)
        return read

    return decorator


def check_class_predictable(cfg: Any) -> None:
    """A ConfigError naming the datasets of :data:`CLASS_PREDICTION_READERS` unless the run's dataset is one."""
    if cfg.data.name not in CLASS_PREDICTION_READERS:
        raise ConfigError(
            f"recipe {cfg.recipe!r} predicts from a CSV of image files or feature columns for runs on the datasets "
            f"{', '.join(CLASS_PREDICTION_READERS.names())}; this run's dataset is {cfg.data.name!r}"
        )


def class_prediction_rows(run: Any, path: Path) -> ClassImages:
    """The rows and images of the file ``path`` for the classification run ``run`` (its reader in
    :data:`CLASS_PREDICTION_READERS`; another dataset: a ConfigError naming those that have one)."""
    check_class_predictable(run.cfg)
    images: ClassImages = CLASS_PREDICTION_READERS[run.cfg.data.name](run, Path(path))
    return images


@register_class_prediction_reader("image_folder", "mnist5k", "cifar_dir")
def _read_class_images(run: Any, path: Path) -> ClassImages:
    """The column ``path`` of image files (relative to the CSV's folder; every one must exist), each read
    as :func:`~rankwise.data.load_image_folder` reads its images (:func:`~rankwise.data.class_image_transform`)
    at the run's image shape: ``(C, H, W)`` = ``(1, S, S)`` grey (mnist5k: 28x28, or 8x8 with
    ``source: sklearn``; ``image_folder`` with ``grayscale: true``) or ``(3, S, S)`` RGB, 8-bit values / 255."""
    from rankwise.data.image_classes import class_image_transform
    from rankwise.data.images import read_image_rows

    c, h, w = (int(v) for v in run.data.image_shape)
    rows = read_image_rows(path, class_image_transform((h, w), grayscale=c == 1), image_column="path")
    ds = rows.dataset
    x = torch.stack([ds[i][0] for i in range(len(ds))]) if len(ds) else torch.zeros((0, c, h, w))
    return ClassImages(rows.header, rows.rows, x)


@register_class_prediction_reader("topk_synthetic")
def _read_class_features(run: Any, path: Path) -> ClassImages:
    """The feature columns ``meta["feature_names"]`` (``x0`` .. ``x{D-1}``) of a CSV, by name in any order
    (other columns kept as text), read with the rules of :func:`~rankwise.data.load_csv`; float32 ``(N, D)``
    as the dataset holds its items (its features are not standardised)."""
    from rankwise.data.tabular import read_feature_rows

    table = read_feature_rows(path, list(run.data.meta["feature_names"]))
    return ClassImages(table.header, table.rows, torch.from_numpy(table.features.astype(np.float32)))


def class_names(meta: dict[str, Any], labels: Any) -> Any:
    """The classes ``labels`` (int indices) by the names the dataset gives them (``meta["classes"]``:
    the class folders of ``image_folder``, CIFAR's label names), else the indices (int64 array)."""
    idx = np.asarray(labels, dtype=np.int64)
    names = meta.get("classes")
    if names is None:
        return idx
    return [str(names[i]) for i in idx.tolist()]
