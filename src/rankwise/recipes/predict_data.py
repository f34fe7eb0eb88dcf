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
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from rankwise._registry import Registry
from rankwise.recipes.config import ConfigError

F = TypeVar("F", bound=Callable[..., Any])

__all__ = [
    "PREDICTION_READERS",
    "PredictionReader",
    "check_predictable",
    "prediction_columns",
    "prediction_rows",
    "register_prediction_reader",
    "target_column",
]


@dataclass(frozen=True)
class PredictionReader:
    """How a new file of a dataset is read for a trained run: ``read(run, path) -> (header, rows as
    text, dataset)`` (dataset items ``(input, nan)``); ``target``: the file's column of the target
    when ``data.options.target`` does not name it."""

    read: Callable[[Any, Path], tuple[list[str], list[list[str]], Any]]
    target: str | None = None


#: the datasets whose regression runs predict from a new file (:func:`register_prediction_reader`)
PREDICTION_READERS: Registry[Any] = Registry("prediction reader")


def register_prediction_reader(*datasets: str, target: str | None = None) -> Callable[[F], F]:
    """Decorator registering ``read(run, path)`` as the :class:`PredictionReader` of ``datasets``."""

    def decorator(read: F) -> F:
        for name in datasets:
            PREDICTION_READERS.add(name, PredictionReader(read, target))
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
    if cfg.data.name in PREDICTION_READERS:
        return PREDICTION_READERS[cfg.data.name].target
    from rankwise.data import DATASETS

    if cfg.data.name not in DATASETS:
        return None
    param = inspect.signature(DATASETS[cfg.data.name]).parameters.get("target")
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
    from rankwise.data import DataFormatError, TensorPairDataset
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
    # the loader's arithmetic (rankwise.data.standardize, then float32) with the training statistics
    x = (table.features - np.asarray(meta["feature_mean"])) / np.asarray(meta["feature_std"])
    y = torch.full((len(table.rows),), float("nan"))
    return table.header, table.rows, TensorPairDataset(torch.from_numpy(x.astype(np.float32)), y)


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
    columns: dict[str, Any] = {h: [r[i] for r in rows] for i, h in enumerate(header)}
    name, k = "prediction", 0
    while name in columns:
        k += 1
        name = f"prediction_{k}"
    columns[name] = pred
    return columns
