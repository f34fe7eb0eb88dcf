"""The reporting bases of recipes.

* :class:`~rankwise.recipes.Recipe` itself (``rankwise.recipes.registry``): recipes whose ``test``
  metrics are plain numbers (accuracy, MSE, ...), a mean ± std table of every metric and a markdown
  report (``report_kind = "scalar"``);
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
from rankwise.recipes.registry import Recipe, Table, can_predict, cannot_predict

__all__ = ["RegressionRecipe", "can_predict", "cannot_predict"]


class RegressionRecipe(Recipe):
    """Recipes reported with the many/medium/few-shot table of ``rankwise.imbalanced.regression_metrics``."""

    uses = frozenset({"loss"})
    learns: Literal["regression", "classification", "ranking"] = "regression"
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
