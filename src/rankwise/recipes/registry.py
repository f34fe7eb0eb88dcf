"""The recipe registry: ``register_recipe`` / ``get_recipe`` / ``list_recipes`` and the :class:`Recipe` protocol.

A recipe is one module that owns a typed options model (the config's ``task`` section), builds
its LightningModule(s) and data loaders, trains them through the run lifecycle
(:class:`rankwise.recipes.rundir.Run`) and defines how it is evaluated and reported. A preset names
its recipe (``recipe: sort``); the CLI, :func:`rankwise.recipes.train`, ``evaluate`` and ``compare``
look it up here and call it -- they never guess a recipe from the shape of its metrics.

The built-in recipes are imported the first time they are looked up (so reading a config does not
import every recipe's dependencies); a new recipe registers itself with :func:`register_recipe`
(see docs/recipes.md for a worked example).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from rankwise._registry import Registry
from rankwise.recipes import config as _config
from rankwise.recipes.config import Config

if TYPE_CHECKING:
    from rankwise.recipes.rundir import Run

__all__ = ["Recipe", "get_recipe", "list_recipes", "register_recipe"]


@runtime_checkable
class Recipe(Protocol):
    """What the run lifecycle, ``evaluate``, ``compare`` and the CLI need from a recipe."""

    @property
    def name(self) -> str:
        """Registry name; a config selects the recipe with ``recipe: <name>``."""

    @property
    def description(self) -> str:
        """One-line description (``rankwise presets`` / docs)."""

    @property
    def options(self) -> type:
        """Model of the config's ``task`` section: a ``rankwise.recipes.config.Options`` subclass (pydantic)."""

    @property
    def uses(self) -> frozenset[str]:
        """Optional shared sections read besides data/model/optimizer/schedule/trainer/run (e.g. ``{"loss"}``)."""

    @property
    def data_kind(self) -> Literal["regression", "classification", "ranking"]:
        """The dataset type it needs: regression (``RegressionData``), classification (``ClassificationData``) or
        ranking (``RankingData``: query lists)."""

    @property
    def report_kind(self) -> str:
        """Runs whose recipes share a report kind can be compared in one table."""

    def check(self, cfg: Config) -> None:
        """Cross-field checks of the typed config (raise ``ConfigError`` naming the key)."""

    def method(self, cfg: Config) -> str:
        """Short name of the method a config trains (metrics.json ``method``)."""

    def fit(self, run: Run) -> dict[str, Any]:
        """Train every stage through ``run`` and test; return the ``test`` metrics (``{}`` on rank > 0)."""

    def evaluate(self, run: Run, checkpoint: str | None) -> dict[str, Any]:
        """Re-evaluate a finished run from its ``checkpoint`` ("best", "last" or None: the recipe's choice)."""

    def summary(self, metrics: Mapping[str, Any]) -> str:
        """One line of a run's test metrics (``compare`` progress)."""

    def tables(self, results: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[tuple[list[str], list[list[str]]]]:
        """``(header, rows)`` tables of several methods x seeds (the CLI prints them)."""

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


#: built-in recipe -> module that registers it (imported on first use)
_BUILTIN = {
    "dir": "rankwise.recipes.dir",
    "rrt": "rankwise.recipes.dir",
    "rnc": "rankwise.recipes.rnc",
    "supcon": "rankwise.recipes.supcon",
    "sort": "rankwise.recipes.sorting",
    "median": "rankwise.recipes.sorting",
    "dknn": "rankwise.recipes.dknn",
    "brain_age": "rankwise.recipes.brain_age",
    "retrieval": "rankwise.recipes.retrieval",
    "ltr": "rankwise.recipes.learning_to_rank",
    "topk": "rankwise.recipes.topk",
}

#: recipes by name (the built-in ones are imported on first look-up)
RECIPES: Registry[Any] = Registry("recipe", lazy=_BUILTIN)

_REQUIRED = ("name", "description", "options", "uses", "data_kind", "report_kind")


def register_recipe(recipe: Recipe) -> Recipe:
    """Add ``recipe`` to the registry under ``recipe.name`` (returns it, so it can decorate an instance)."""
    missing = [a for a in _REQUIRED if not hasattr(recipe, a)]
    if missing or not isinstance(recipe, Recipe):
        raise TypeError(f"`recipe` must implement the Recipe protocol; missing {missing or 'methods'}")
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


_config.set_recipe_lookup(get_recipe)  # the config layer resolves `recipe:` through this registry


def list_recipes() -> list[str]:
    """Names of every recipe (the built-in ones are imported), sorted."""
    return RECIPES.names(load=True)
