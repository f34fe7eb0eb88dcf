"""What a brain-age study reports beyond the accuracy: the gap per site and per diagnostic group.

The ``brain_age`` recipe's evaluation adds ``metrics.json["study"]`` and ``RUN_DIR/report.md``:

* ``sites`` -- per-site n, mean and SD of the bias-corrected test gap (:func:`rankwise.brain_age.gap_by_site` of
  ``gap_corrected_gap``: the "gap" correction fitted on the validation set), the sites read from the cohort
  CSV's ``study.site_column`` (default ``site``; skipped when the CSV lacks it or leaves it empty);
* ``groups`` -- with ``study.group_column``, per-group n / mean / SD of that gap and, against
  ``study.reference_group``, Cohen's d, the Welch t-test and Mann-Whitney p-values and the AUC of the gap
  for telling the group from the reference (:func:`rankwise.brain_age.gap_by_group`);
* with ``study.harmonize: combat``, the gap is first harmonised across sites by ComBat
  (:func:`rankwise.brain_age.combat_fit`, no empirical Bayes: one feature) fitted on the training split's
  gaps with age, sex (when every row has one) and the group indicators as covariates, and applied to the
  validation and test gaps; the bias correction is then fitted on the harmonised validation gaps. The
  tables are those of the harmonised gap, ``sites_unharmonized`` that of the gap without it.

Rows whose site or group value is empty are left out of that table (``n_missing``). The columns are read
from the cohort CSV (``meta["source"]``, rows ``meta["<split>_rows"]``), which the run's ``data.json``
fingerprints; :func:`check_study` refuses, before training, a named column the CSV lacks, a reference
group with no test subject, and for ComBat a val/test site without training subjects or a training site
with fewer than 2.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rankwise._fileio import atomic_write
from rankwise.recipes.config import ConfigError

__all__ = ["check_study", "study_columns", "study_metrics", "study_tables", "write_study_report"]

_SPLITS = ("train", "val", "test")


def study_columns(run: Any) -> dict[str, dict[str, list[str] | None]]:
    """``{"site": {split: values | None}, "group": {split: values | None}}`` of the run's cohort CSV
    (``None``: no such column asked for, or the default ``site`` column absent or empty)."""
    from rankwise.data.nifti import read_cohort_rows

    rep = run.cfg.study
    meta = run.data.meta
    wanted = {"site": rep.site_column, "group": rep.group_column}
    out: dict[str, dict[str, list[str] | None]] = {k: dict.fromkeys(_SPLITS) for k in wanted}
    if all(v is None for v in wanted.values()):
        return out
    if not Path(str(meta.get("source", ""))).is_file():  # data not read from a cohort CSV
        named = [f"`study.{k}_column`" for k, v in wanted.items() if v is not None and (k, v) != ("site", "site")]
        if named:
            raise ConfigError(f"{', '.join(named)} names a column of the cohort CSV, but these data have no CSV")
        return out
    source = Path(meta["source"])
    rows = {r["_row"]: r for r in read_cohort_rows(source, None)}
    header = [k for k in next(iter(rows.values())) if k != "_row"]
    for key, column in wanted.items():
        if column is None:
            continue
        if column not in header:
            if key == "site" and column == "site":  # the default: a cohort without sites has no site table
                continue
            raise ConfigError(f"`study.{key}_column` is {column!r}, which {source} lacks; its header is {header}")
        values = {s: [rows[i][column] for i in meta.get(f"{s}_rows", [])] for s in _SPLITS}
        if key == "site" and column == "site" and not any(v for vs in values.values() for v in vs):
            continue
        out[key] = values  # type: ignore[assignment]
    return out


def check_study(run: Any) -> None:
    """The study options against the cohort before training (one ``ConfigError`` naming the key)."""
    rep = run.cfg.study
    cols = study_columns(run)
    groups = cols["group"]["test"]
    if rep.reference_group is not None and groups is not None and rep.reference_group not in groups:
        raise ConfigError(
            f"`study.reference_group` {rep.reference_group!r} has no test subject; the test split's groups of "
            f"`study.group_column` {rep.group_column!r} are {sorted({g for g in groups if g})}"
        )
    if rep.harmonize != "combat":
        return
    sites = cols["site"]
    if sites["train"] is None:
        raise ConfigError(
            f"`study.harmonize: combat` needs sites, but the cohort CSV has no `{rep.site_column}` column values "
            "(`study.site_column`)"
        )
    train = [s for s in sites["train"] or [] if s]
    counts = {s: train.count(s) for s in set(train)}
    few = sorted(s for s, c in counts.items() if c < 2)
    if few:
        raise ConfigError(
            f"`study.harmonize: combat` estimates each site's effect from its training subjects; sites {few} "
            "have fewer than 2 in the train split"
        )
    for split in ("val", "test"):
        unseen = sorted({s for s in sites[split] or [] if s and s not in counts})
        if unseen:
            raise ConfigError(
                f"`study.harmonize: combat` applies the site effects fitted on the train split, which has no "
                f"subject of the {split} sites {unseen}"
            )
    for split in _SPLITS:
        if any(not s for s in sites[split] or []):
            raise ConfigError(
                f"`study.harmonize: combat`: some {split} rows have an empty `{rep.site_column}` (every subject "
                "needs a site)"
            )


def _clean(table: Mapping[Any, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """JSON-ready: site/group names as text, NaN as ``None``."""
    return {
        str(k): {m: (None if isinstance(v, float) and math.isnan(v) else v) for m, v in row.items()}
        for k, row in table.items()
    }


def _corrected_gap(pred: np.ndarray, age: np.ndarray, val_pred: np.ndarray, val_age: np.ndarray) -> np.ndarray | None:
    """The "gap" bias-corrected gap of ``(pred, age)`` fitted on the validation set; ``None`` where none fits."""
    from rankwise.brain_age import correct_age_bias

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the run's own correction says it once
            return np.asarray(correct_age_bias(pred, age, fit_pred=val_pred, fit_age=val_age, method="gap")) - age
    except ValueError:
        return None


def _has_sex(run: Any) -> bool:
    return all((np.asarray(getattr(getattr(run.data, s), "sex", [-1])) >= 0).all() for s in _SPLITS)


def _group_levels(run: Any, groups: Mapping[str, list[str] | None]) -> list[str]:
    """The training groups other than the reference (ComBat's group indicators); none where a row has no group."""
    if groups["train"] is None or not all(all(g for g in groups[s] or []) for s in _SPLITS):
        return []
    levels = sorted(set(groups["train"]))
    ref = run.cfg.study.reference_group if run.cfg.study.reference_group in levels else levels[0]
    return [lv for lv in levels if lv != ref]


def _covariates(run: Any, ages: np.ndarray, split: str, groups: Mapping[str, list[str] | None]) -> np.ndarray:
    """ComBat's covariates of a split: age, sex (0/1, when every subject has one), the group indicators."""
    cols = [ages]
    if _has_sex(run):
        cols.append(np.asarray(getattr(run.data, split).sex, dtype=np.float64))
    g = np.asarray(groups[split] or [], dtype=object)
    cols += [(g == lv).astype(np.float64) for lv in _group_levels(run, groups)]
    return np.stack(cols, axis=1)


def study_tables(
    gap: np.ndarray, sites: list[str] | None, groups: list[str] | None, reference: str | None
) -> dict[str, Any]:
    """``{"sites": ..., "groups": ...}`` of the test gap (the tables of the module doc)."""
    from rankwise.brain_age import gap_by_group, gap_by_site

    out: dict[str, Any] = {}
    for key, labels in (("sites", sites), ("groups", groups)):
        if labels is None:
            continue
        lab = np.asarray(labels, dtype=object)
        keep = lab != ""
        out[f"n_missing_{key}"] = int((~keep).sum())
        if not keep.any():
            out[key] = {}
            continue
        if key == "sites":
            out[key] = _clean(gap_by_site(gap[keep], lab[keep]))
        else:
            names = set(lab[keep].tolist())
            ref = reference if reference in names else None
            out[key] = _clean(gap_by_group(gap[keep], lab[keep], reference=ref))
            out["reference_group"] = ref if ref is not None else sorted(names, key=str)[0]
    return out


def study_metrics(
    run: Any,
    predict_train: Callable[[], tuple[np.ndarray, np.ndarray]],
    val: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
) -> dict[str, Any] | None:
    """``metrics["study"]`` of the module doc, or ``None`` without a site or group column.

    ``val`` / ``test``: ``(predictions, ages)``; ``predict_train``: the training split's, in its order (called
    only for ComBat)."""
    rep = run.cfg.study
    cols = study_columns(run)
    sites, groups = cols["site"], cols["group"]
    if sites["test"] is None and groups["test"] is None:
        return None
    (vp, va), (tp, ta) = val, test
    out: dict[str, Any] = {"site_column": rep.site_column if sites["test"] is not None else None}
    out["group_column"] = rep.group_column if groups["test"] is not None else None
    gap = _corrected_gap(tp, ta, vp, va)
    out["gap"] = "gap_corrected_gap" if gap is not None else "gap"
    if gap is None:
        gap = tp - ta
    out["harmonize"] = rep.harmonize
    if rep.harmonize == "combat":
        from rankwise.brain_age import combat_fit

        out["sites_unharmonized"] = study_tables(gap, sites["test"], None, None).get("sites", {})
        trp, tra = predict_train()
        fit = combat_fit(trp - tra, sites["train"], covariates=_covariates(run, tra, "train", groups), eb=False)
        hv = va + fit.apply(vp - va, sites["val"], covariates=_covariates(run, va, "val", groups))
        ht = ta + fit.apply(tp - ta, sites["test"], covariates=_covariates(run, ta, "test", groups))
        hgap = _corrected_gap(ht, ta, hv, va)
        gap = hgap if hgap is not None else ht - ta
        out["combat"] = {
            "sites": [str(s) for s in fit.sites],
            "gamma": fit.gamma[:, 0].tolist(),
            "delta": fit.delta[:, 0].tolist(),
            "fitted_on": "train",
            "covariates": _covariate_names(run, groups),
        }
    out |= study_tables(gap, sites["test"], groups["test"], rep.reference_group)
    return out


def _covariate_names(run: Any, groups: Mapping[str, list[str] | None]) -> list[str]:
    return ["age", *(["sex"] if _has_sex(run) else []), *(f"group={lv}" for lv in _group_levels(run, groups))]


def train_eval_dataset(dataset: Any) -> Any:
    """The training split's dataset without its augmentation (a shallow copy, ``transform=None``)."""
    ds = copy.copy(dataset)
    if hasattr(ds, "transform"):
        ds.transform = None
    return ds


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1e-3 and v != 0 else f"{v:.{digits}f}"
    return str(v)


def site_rows(study: Mapping[str, Any], key: str = "sites") -> tuple[list[str], list[list[str]]]:
    """``(header, rows)`` of a study's site table."""
    header = ["site", "n", "gap mean", "gap SD"]
    return header, [[s, _fmt(r["n"]), _fmt(r["mean"]), _fmt(r["sd"])] for s, r in study.get(key, {}).items()]


def group_rows(study: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """``(header, rows)`` of a study's group table (the reference row holds n, mean, SD only)."""
    header = ["group", "n", "gap mean", "gap SD", "d", "p Welch", "p M-W", "AUC"]
    ref = study.get("reference_group")
    rows = []
    for g, r in study.get("groups", {}).items():
        name = f"{g} (reference)" if g == ref else g
        cells = [_fmt(r.get(k)) for k in ("d", "p_welch", "p_mannwhitney", "auc")] if g != ref else ["", "", "", ""]
        rows.append([name, _fmt(r["n"]), _fmt(r["mean"]), _fmt(r["sd"]), *cells])
    return header, rows


def _markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"] + [
        "| " + " | ".join(r) + " |" for r in rows
    ]


#: the test metrics at the top of ``report.md``
_HEADLINE = ("n", "mae", "rmse", "pearson", "r2", "bag_mean", "corr_bag_age", "mae_gap", "corr_bag_age_gap")


def write_study_report(run: Any, metrics: Mapping[str, Any]) -> Path:
    """``RUN_DIR/report.md`` (the evaluation's results folder): test metrics, the site and group tables."""
    cfg = run.cfg
    test = metrics.get("test", {})
    lines = [f"# {cfg.run.name} (seed {cfg.run.seed})", "", "## Test metrics", ""]
    keys = [k for k in _HEADLINE if k in test]
    lines += [*_markdown(keys, [[_fmt(test[k]) for k in keys]]), ""]
    study = metrics.get("study")
    if not study:
        lines += ["No site or group column (`study.site_column`, `study.group_column`).", ""]
    else:
        what = (
            "the bias-corrected gap (`gap` correction fitted on the validation set)"
            if study["gap"] == "gap_corrected_gap"
            else "the uncorrected gap (no bias correction fits the validation predictions)"
        )
        if study.get("harmonize") == "combat":
            what += ", harmonised across sites by ComBat fitted on the training split"
        lines += [f"Test split, brain-age gap (years): {what}.", ""]
        if study.get("site_column"):
            lines += [f"## Gap per site (`{study['site_column']}`)", "", *_markdown(*site_rows(study)), ""]
            if study.get("harmonize") == "combat":
                lines += ["Before harmonisation:", "", *_markdown(*site_rows(study, "sites_unharmonized")), ""]
        if study.get("group_column"):
            lines += [f"## Gap per group (`{study['group_column']}`)", "", *_markdown(*group_rows(study))]
            lines += [
                "",
                f"d: Cohen's d against `{study.get('reference_group')}` (pooled SD); p: two-sided Welch t-test and "
                "Mann-Whitney U test; AUC: the gap as a score for telling the group from the reference.",
                "",
            ]
    path = run.results / "report.md"
    atomic_write(path, "\n".join(lines))
    return path


def preprocess_for_run(
    run_dir: str | Path,
    csv_path: str | Path,
    out: str | Path | None,
    *,
    on_scan: Callable[[int, int, str, str, float], None] | None = None,
) -> Path:
    """The cohort CSV that ``rankwise predict RUN --data CSV [--preprocess-out OUT]`` predicts from.

    A run trained on scans that ``rankwise preprocess`` wrote records their template in its ``data.json``
    (``meta["preprocessed"]`` of :func:`rankwise.data.load_nifti_csv`). Given such a run and a raw
    ``csv_path`` (a ``path`` column of scans, none of the preprocessing's columns), the scans are preprocessed
    with the run's template and registration into ``out`` (:func:`rankwise.data.preprocess_cohort`: nothing
    written outside it; finished scans reused) and ``out/participants.csv`` is returned; otherwise
    ``csv_path`` itself. One :class:`~rankwise.recipes.config.UserError` line for a raw CSV without ``out``,
    an ``out`` that a preprocessed CSV or a run without a recorded template cannot use, an ``out`` whose
    ``participants.csv`` is not one ``rankwise preprocess`` wrote, and scans that fail (their count, the
    first message and the quality-control page).
    """
    from rankwise.data.nifti import PREPROCESS_COLUMNS, read_cohort_rows
    from rankwise.recipes.config import UserError
    from rankwise.recipes.rundir._record import read_record

    csv_path = Path(csv_path)
    record = read_record(Path(run_dir)) or {}
    meta = (record.get("summary") or {}).get("meta") or {}
    recorded = meta.get("preprocessed")
    rows = read_cohort_rows(csv_path, None)
    raw = not all(c in rows[0] for c in PREPROCESS_COLUMNS)
    if not isinstance(recorded, dict) or not isinstance(recorded.get("template"), str):
        if out is not None:
            raise UserError(
                f"--preprocess-out: the run {run_dir} was not trained on scans of `rankwise preprocess` (its "
                "data.json records no template); predict from volumes on its training grid without --preprocess-out"
            )
        return csv_path
    template, registration = recorded["template"], str(recorded.get("registration", "affine"))
    if not raw:
        if out is not None:
            raise UserError(
                f"--preprocess-out: {csv_path} is already preprocessed (it has the columns {list(PREPROCESS_COLUMNS)}"
                " of `rankwise preprocess`); drop --preprocess-out"
            )
        return csv_path
    if out is None:
        raise UserError(
            f"{csv_path}: raw scans (no `transform` column of `rankwise preprocess`), but the run {run_dir} was "
            f"trained on scans preprocessed to {template}: add --preprocess-out DIR (a folder for the preprocessed "
            "scans; they are then predicted)"
        )
    out = Path(out)
    existing = out / "participants.csv"
    if existing.exists():
        try:
            header = [k for k in read_cohort_rows(existing, None)[0] if k != "_row"]
        except Exception:  # unreadable or empty: not one that preprocess wrote
            header = []
        if not all(c in header for c in PREPROCESS_COLUMNS):
            raise UserError(
                f"--preprocess-out: {existing} exists and is not a CSV that `rankwise preprocess` wrote; choose "
                "another folder (it would be replaced)"
            )
    from rankwise.data import preprocess_cohort

    result = preprocess_cohort(csv_path, out, template=template, registration=registration, on_scan=on_scan)
    if result.failures:
        _, _, message = result.failures[0]
        raise UserError(
            f"{len(result.failures)} of {len(rows)} scans of {csv_path} failed preprocessing (first: {message}); "
            f"see {result.page}"
        )
    assert result.csv is not None
    return result.csv
