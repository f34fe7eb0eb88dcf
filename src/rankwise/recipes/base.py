"""Base classes implementing the reporting half of the :class:`~rankwise.recipes.registry.Recipe` protocol.

* :class:`RecipeBase` -- recipes whose ``test`` metrics are plain numbers (accuracy, MSE, ...):
  a mean ± std table of every metric and a markdown report (``report_kind = "scalar"``);
* :class:`RegressionRecipe` -- recipes evaluated with the deep-imbalanced-regression shot table
  (``test``: ``{all, many, medium, few} x {mae, mse, gmean, count}`` + Pearson/Spearman): MAE and
  GM tables, shot bar chart and per-label MAE plots (``report_kind = "regression"``).

A recipe subclasses one of them and implements ``fit`` and ``evaluate`` (and ``check`` if it has
cross-field constraints; ``predict_file`` if a trained run predicts the rows of a new file,
``rankwise predict``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from rankwise.recipes.config import Config

__all__ = ["RecipeBase", "RegressionRecipe", "can_predict", "cannot_predict"]

Table = tuple[list[str], list[list[str]]]


class RecipeBase:
    """Defaults of the Recipe protocol for recipes with scalar test metrics."""

    name: str = ""
    description: str = ""
    options: type = object
    uses: frozenset[str] = frozenset()
    data_kind: Literal["regression", "classification", "ranking"] = "classification"
    report_kind: str = "scalar"
    #: the scalar tables and report add a seconds-per-step column (recipes that time their steps)
    per_step: bool = False
    #: ``predict_file`` needs the run's splits themselves (a gallery of training images, validation
    #: predictions): ``rankwise predict`` reads the data through the checks of the run's ``data.json``
    #: instead of predicting from its summary alone
    predict_reads_data: bool = False

    def check(self, cfg: Config) -> None:
        """No cross-field constraint by default."""

    def method(self, cfg: Config) -> str:
        return str(getattr(cfg.task, "method", self.name))

    def load_data(self, cfg: Config) -> Any:
        """The run's dataset (``cfg.data``); each note its loader leaves in ``meta["notes"]`` becomes a
        ``warning:`` line (:func:`~rankwise.recipes.common.warn_data_notes`)."""
        from rankwise.data import get_dataset
        from rankwise.recipes.common import warn_data_notes

        data = get_dataset(cfg.data.name, **cfg.data.options)
        warn_data_notes(data)
        return data

    def fit(self, run: Any) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def evaluate(self, run: Any, checkpoint: str | None) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def predict_file(self, run: Any, path: Path, checkpoint: str | None) -> dict[str, Any]:
        """The predictions of the run's ``checkpoint`` (``best``, ``last``, None: the recipe's choice) for
        the rows of the file ``path``: its columns in order, name -> values (``rankwise predict``).

        Not every recipe predicts from a file: by default a :class:`~rankwise.recipes.config.ConfigError`
        saying so and naming the recipes that do (:func:`cannot_predict`).
        """
        raise cannot_predict(self)

    def prediction_input(
        self, run_dir: Path, path: Path, preprocess_out: str | Path | None, *, on_scan: Any = None
    ) -> Path:
        """The file that :meth:`predict_file` reads for ``rankwise predict RUN --data PATH``: ``path``
        itself. A recipe that prepares its input first (the brain-age recipe preprocesses raw scans into
        ``preprocess_out``) overrides it; here a ``preprocess_out`` is refused with one error line."""
        if preprocess_out is not None:
            from rankwise.recipes.config import ConfigError

            raise ConfigError(
                f"--preprocess-out preprocesses raw scans for a `brain_age` run; the run's recipe is {self.name!r}"
            )
        return path

    def summary(self, metrics: Mapping[str, Any]) -> str:
        from rankwise.recipes.reports import scalar_summary

        return scalar_summary(metrics)

    def tables(self, results: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[Table]:
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
        from rankwise.recipes.reports import write_scalar_report

        return write_scalar_report(out_dir, results, run_dirs, title=title, extra=extra, per_step=self.per_step)


def can_predict(recipe: Any) -> bool:
    """Whether ``recipe`` predicts the rows of a new file: a ``predict_file`` other than :class:`RecipeBase`'s."""
    own = getattr(type(recipe), "predict_file", None)
    return callable(own) and own is not RecipeBase.predict_file


def cannot_predict(recipe: Any) -> Exception:
    """The error of ``rankwise predict`` for a run of a recipe that cannot predict from a file."""
    from rankwise.recipes.config import ConfigError
    from rankwise.recipes.registry import RECIPES, get_recipe, list_recipes

    try:
        names = list_recipes()
    except ImportError:  # a recipe whose optional dependency is missing: the ones imported so far
        names = RECIPES.names()
    able = [n for n in names if can_predict(get_recipe(n))]
    return ConfigError(
        f"recipe {recipe.name!r} cannot predict from a file; the recipes that can: {', '.join(able) or 'none'}"
    )


class RegressionRecipe(RecipeBase):
    """Recipes reported with the many/medium/few-shot table of ``rankwise.imbalanced.regression_metrics``."""

    uses = frozenset({"loss"})
    data_kind: Literal["regression", "classification", "ranking"] = "regression"
    report_kind = "regression"

    def method(self, cfg: Config) -> str:
        return self.name

    def summary(self, metrics: Mapping[str, Any]) -> str:
        return f"test MAE {metrics['test']['all']['mae']:.3f}"

    def tables(self, results: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[Table]:
        from rankwise.recipes.reports import GROUPS, aggregate, format_cell, ordinal_table_rows

        out = []
        for key, label in (("mae", "MAE"), ("gmean", "GM")):
            rows = []
            for method, runs in results.items():
                agg = aggregate(runs)
                rows.append([method, str(len(runs)), *[format_cell(agg[g][key]) for g in GROUPS]])
            out.append(([label, "n", *GROUPS], rows))
        classes = ordinal_table_rows(results)
        if classes is not None:
            header, rows = classes
            out.append((["classes", *header[1:]], rows))
        return out

    def write_report(
        self,
        out_dir: Path,
        results: Mapping[str, Sequence[Mapping[str, Any]]],
        run_dirs: Mapping[str, Sequence[Path]],
        *,
        title: str,
        extra: str,
    ) -> Path:
        from rankwise.recipes.reports import write_compare_report

        return write_compare_report(out_dir, results, run_dirs, title=title, extra=extra)
