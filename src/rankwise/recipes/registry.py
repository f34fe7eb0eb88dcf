"""The recipe registry: the :class:`Recipe` base class and ``register_recipe`` / ``get_recipe`` / ``list_recipes``.

A recipe is one module that owns a typed options model (the config's ``task`` section), builds
its LightningModule(s) and data loaders, trains them through the run lifecycle
(:class:`rankwise.recipes.rundir.Run`) and defines how it is evaluated and reported. A preset names
its recipe (``recipe: sort``); the CLI, :func:`rankwise.recipes.train`, ``evaluate`` and ``compare``
look it up here and call it -- they never guess a recipe from the shape of its metrics.

Every recipe is an instance of a :class:`Recipe` subclass: ``fit`` and ``evaluate`` are abstract (a
class lacking one cannot be instantiated, hence not registered: a ``TypeError`` naming it), every
other member has a default (scalar test metrics: a mean ± std table and a markdown report).

The built-in recipes are imported the first time they are looked up (so reading a config does not
import every recipe's dependencies); a new recipe registers itself with :func:`register_recipe`
(see docs/recipes.md for a worked example). The config layer imports neither this module nor a
recipe: the functions here that read a config (:func:`load_config`, :func:`config_from_dict`,
:func:`config_fields`) hand it :func:`get_recipe` as its ``recipes`` lookup.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rankwise._registry import Registry
from rankwise.recipes import config as _config
from rankwise.recipes.config import Config

if TYPE_CHECKING:
    from rankwise.recipes.rundir import Run

__all__ = [
    "Recipe",
    "can_predict",
    "cannot_predict",
    "config_fields",
    "config_from_dict",
    "get_recipe",
    "list_recipes",
    "load_config",
    "register_recipe",
]

Table = tuple[list[str], list[list[str]]]


class Recipe(abc.ABC):
    """What the run lifecycle, ``evaluate``, ``predict``, ``compare`` and the CLI need from a recipe.

    A subclass sets the class attributes :attr:`name` and :attr:`options` and implements :meth:`fit` and
    :meth:`evaluate`; the defaults of everything else describe a recipe with scalar test metrics
    (accuracy, MSE, ...) that does not predict from a file.
    """

    #: registry name; a config selects the recipe with ``recipe: <name>``
    name: str = ""
    #: one-line description (``rankwise presets`` / docs)
    description: str = ""
    #: model of the config's ``task`` section: a ``rankwise.recipes.config.Options`` subclass (pydantic)
    options: type = object
    #: optional shared sections read besides data/model/optimizer/schedule/trainer/run (e.g. ``{"loss"}``)
    uses: frozenset[str] = frozenset()
    #: what it learns, i.e. the dataset type it needs: regression (``RegressionData``), classification
    #: (``ClassificationData``) or ranking (``RankingData``: query lists)
    learns: Literal["regression", "classification", "ranking"] = "classification"
    #: runs whose recipes share a report kind can be compared in one table
    report_kind: str = "scalar"
    #: the scalar tables and report add a seconds-per-step column (recipes that time their steps)
    per_step: bool = False
    #: ``predict_file`` needs the run's splits themselves (a gallery of training images, validation
    #: predictions): ``rankwise predict`` reads the data through the checks of the run's ``data.json``
    #: instead of predicting from its summary alone
    predict_reads_data: bool = False

    @abc.abstractmethod
    def fit(self, run: Run) -> dict[str, Any]:
        """Train every stage through ``run`` and test; return the ``test`` metrics (``{}`` on rank > 0)."""

    @abc.abstractmethod
    def evaluate(self, run: Run, checkpoint: str | None) -> dict[str, Any]:
        """Re-evaluate a finished run from its ``checkpoint`` ("best", "last" or None: the recipe's choice)."""

    def check(self, cfg: Config) -> None:  # noqa: B027 - an optional hook: no constraint by default
        """Cross-field checks of the typed config (raise ``ConfigError`` naming the key); none by default."""

    def method(self, cfg: Config) -> str:
        """Short name of the method a config trains (metrics.json ``method``): ``task.method``, else the name."""
        return str(getattr(cfg.task, "method", self.name))

    def load_data(self, cfg: Config) -> Any:
        """The run's dataset (``cfg.data``); each note its loader leaves in ``meta["notes"]`` becomes a
        ``warning:`` line (:func:`~rankwise.recipes.common.warn_data_notes`)."""
        from rankwise.data import get_dataset
        from rankwise.recipes.common import warn_data_notes

        data = get_dataset(cfg.data.name, **cfg.data.options)
        warn_data_notes(data)
        return data

    def predict_file(self, run: Run, path: Path, checkpoint: str | None) -> dict[str, Any]:
        """The predictions of the run's ``checkpoint`` (``best``, ``last``, None: the recipe's choice) for
        the rows of the file ``path``: its columns in order, name -> values (``rankwise predict``).

        Not every recipe predicts from a file: by default a :class:`~rankwise.recipes.config.ConfigError`
        saying so and naming the recipes that do (:func:`cannot_predict`).
        """
        raise cannot_predict(self)

    def predict_file_blocks(
        self, run: Run, path: Path, checkpoint: str | None, block_rows: int
    ) -> Iterator[dict[str, Any]] | None:
        """:meth:`predict_file` in blocks of at most ``block_rows`` rows, the file read block by block; None
        where the file is read whole (the default, and what :meth:`predicts_in_blocks` says)."""
        return None

    def predicts_in_blocks(self) -> bool:
        """Whether the recipe reads a file to predict block by block: its class defines
        :meth:`predict_file_blocks` (and its predictions need no more than the run's data record)."""
        return type(self).predict_file_blocks is not Recipe.predict_file_blocks and not self.predict_reads_data

    def prediction_input(
        self, run_dir: Path, path: Path, preprocess_out: str | Path | None, *, on_scan: Any = None
    ) -> Path:
        """The file that :meth:`predict_file` reads for ``rankwise predict RUN --data PATH``: ``path``
        itself. A recipe that prepares its input first (the brain-age recipe preprocesses raw scans into
        ``preprocess_out``) overrides it; here a ``preprocess_out`` is refused with one error line."""
        if preprocess_out is not None:
            raise _config.ConfigError(
                f"--preprocess-out preprocesses raw scans for a `brain_age` run; the run's recipe is {self.name!r}"
            )
        return path

    def summary(self, metrics: Mapping[str, Any]) -> str:
        """One line of a run's test metrics (``compare`` progress)."""
        from rankwise.recipes.reports import scalar_summary

        return scalar_summary(metrics)

    def tables(self, results: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[Table]:
        """``(header, rows)`` tables of several methods x seeds (the CLI prints them)."""
        from rankwise.recipes.reports import scalar_table_rows

        return [scalar_table_rows(results, per_step=self.per_step)]

    def write_report(
        self,
        out_dir: Path,
        results: Mapping[str, Sequence[Mapping[str, Any]]],
        run_dirs: Mapping[str, Sequence[Path]],
        *,
        title: str,
        extra: str,
    ) -> Path:
        """``OUT/report.md`` of ``compare``."""
        from rankwise.recipes.reports import write_scalar_report

        return write_scalar_report(out_dir, results, run_dirs, title=title, extra=extra, per_step=self.per_step)


def can_predict(recipe: Recipe) -> bool:
    """Whether ``recipe`` predicts the rows of a new file: its class defines :meth:`Recipe.predict_file`."""
    return type(recipe).predict_file is not Recipe.predict_file


def cannot_predict(recipe: Recipe) -> Exception:
    """The error of ``rankwise predict`` for a run of a recipe that cannot predict from a file."""
    try:
        names = list_recipes()
    except ImportError:  # a recipe whose optional dependency is missing: the ones imported so far
        names = RECIPES.names()
    able = [n for n in names if can_predict(get_recipe(n))]
    return _config.ConfigError(
        f"recipe {recipe.name!r} cannot predict from a file; the recipes that can: {', '.join(able) or 'none'}"
    )


#: built-in recipe -> module that registers it (imported on first use)
_BUILTIN = {
    "dir": "rankwise.recipes.regression.dir",
    "rrt": "rankwise.recipes.regression.dir",
    "rnc": "rankwise.recipes.regression.rnc",
    "supcon": "rankwise.recipes.supcon",
    "sort": "rankwise.recipes.sorting",
    "median": "rankwise.recipes.sorting",
    "dknn": "rankwise.recipes.dknn",
    "brain_age": "rankwise.recipes.brain_age.recipe",
    "retrieval": "rankwise.recipes.retrieval",
    "ltr": "rankwise.recipes.learning_to_rank",
    "topk": "rankwise.recipes.topk",
}

#: recipes by name (the built-in ones are imported on first look-up)
RECIPES: Registry[Any] = Registry("recipe", lazy=_BUILTIN)


def register_recipe(recipe: Recipe) -> Recipe:
    """Add ``recipe`` (an instance of a :class:`Recipe` subclass) to the registry under ``recipe.name``
    (returns it, so it can decorate an instance)."""
    if not isinstance(recipe, Recipe):
        raise TypeError(
            f"`recipe` must be an instance of a rankwise.recipes.Recipe subclass, got {type(recipe).__name__}"
        )
    if not (isinstance(recipe.options, type) and issubclass(recipe.options, _config.Options)):
        raise TypeError(
            f"`recipe.options` must be a subclass of rankwise.recipes.config.Options, got {recipe.options!r}"
        )
    name = recipe.name
    if not isinstance(name, str) or not name:
        raise TypeError(f"`recipe.name` must be a non-empty string, got {name!r}")
    if name in RECIPES._entries and RECIPES[name] is not recipe:
        raise ValueError(f"recipe {name!r} is already registered")
    RECIPES.add(name, recipe, description=str(recipe.description))
    return recipe


def get_recipe(name: str) -> Recipe:
    """The recipe registered as ``name`` (``ValueError`` with the valid names otherwise)."""
    recipe: Recipe = RECIPES.get(name)
    return recipe


def list_recipes() -> list[str]:
    """Names of every recipe (the built-in ones are imported), sorted."""
    return RECIPES.names(load=True)


def load_config(source: str | Path | dict[str, Any] | None = None, overrides: list[str] | None = None) -> Config:
    """Load a config file / preset name / raw dict, apply ``--set`` overrides, build it (one pass), its
    ``recipe:`` resolved in this registry (:func:`rankwise.recipes.config.load_config` with ``recipes``).

    >>> load_config("abalone_vanilla", ["trainer.max_epochs=2"]).trainer.max_epochs
    2
    """
    return _config.load_config(source, overrides, recipes=get_recipe)


def config_from_dict(raw: dict[str, Any] | None) -> Config:
    """The typed :class:`~rankwise.recipes.config.Config` of a raw (YAML) mapping, its ``recipe:`` resolved
    in this registry (:func:`rankwise.recipes.config.config_from_dict` with ``recipes``)."""
    return _config.config_from_dict(raw, recipes=get_recipe)


def config_fields(recipe: str | None = None) -> list[_config.FieldDoc]:
    """Every config field; with ``recipe`` (a registered name) that recipe's ``task.*`` fields and only the
    sections it reads (:func:`rankwise.recipes.config.config_fields` with ``recipes``)."""
    return _config.config_fields(recipe, recipes=get_recipe)
