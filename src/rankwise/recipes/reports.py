"""Plots, tables and markdown reports of runs (matplotlib with the Agg backend, sklearn t-SNE).

Plots of one run (``RUN_DIR/plots``): training curves from the CSV log (every recipe); for the
regression recipes the label histogram with the shot regions, per-label MAE curve,
feature-similarity heatmap ordered by label (RankSim's Figure 3), t-SNE of the features coloured by
label; for the classification recipes a t-SNE coloured by class. :func:`aggregate` and
:func:`markdown_table` build the mean ± std shot table of ``compare``/``demo``;
:func:`scalar_table_rows` / :func:`write_scalar_report` the table of recipes whose ``test``
metrics are plain numbers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rankwise._fileio import atomic_open, atomic_write
from rankwise.data import label_bins

__all__ = [
    "GROUPS",
    "aggregate",
    "format_cell",
    "markdown_table",
    "ordinal_table_rows",
    "plot_compare_per_label_mae",
    "plot_compare_shots",
    "plot_label_histogram",
    "plot_per_label_mae",
    "plot_similarity_heatmap",
    "plot_training_curves",
    "plot_tsne",
    "scalar_summary",
    "scalar_table_rows",
    "shot_groups",
    "write_compare_report",
    "write_scalar_report",
]

GROUPS = ("all", "many", "medium", "few")
_SHOT_COLORS = {"many": "#4c72b0", "medium": "#dd8452", "few": "#c44e52"}


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend (imported on first use)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save_figure(plt: Any, fig: Any, path: str | Path) -> Path:
    """Lay out ``fig``, write it to ``path`` (100 dpi; legends outside the axes included) and close it."""
    fig.tight_layout()
    path = Path(path)
    with atomic_open(path, "wb") as fh:
        fig.savefig(fh, format=path.suffix.lstrip(".") or None, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def _legend_outside(ax: Any, **kw: Any) -> Any:
    """The legend to the right of the axes (it never covers bars or lines)."""
    return ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=8, **kw)


def _label_xlim(ax: Any, bin_width: float, *label_sets: np.ndarray | None) -> None:
    """Trim a per-label x axis to the bins holding data (half a bin of margin)."""
    sets = [np.asarray(s, dtype=np.float64) for s in label_sets if s is not None and len(s)]
    if not sets:
        return
    b = np.concatenate([label_bins(s, bin_width) for s in sets])
    ax.set_xlim((b.min() - 0.5) * bin_width, (b.max() + 1.5) * bin_width)


def shot_groups(
    train_labels: np.ndarray, bin_width: float, *, many_shot: float = 100, few_shot: float = 20
) -> dict[int, str]:
    """Bin -> ``"many"``/``"medium"``/``"few"`` from the training count of each bin."""
    b, c = np.unique(label_bins(train_labels, bin_width), return_counts=True)
    return {int(k): ("many" if n > many_shot else "few" if n < few_shot else "medium") for k, n in zip(b, c)}


def plot_label_histogram(
    train_labels: np.ndarray,
    bin_width: float,
    path: str | Path,
    *,
    many_shot: float = 100,
    few_shot: float = 20,
    test_labels: np.ndarray | None = None,
    title: str = "",
    label: str = "label",
) -> Path:
    """Training label histogram, bars coloured by shot group (many > ``many_shot`` > medium >= ``few_shot`` > few).

    ``label``: the x-axis title (the dataset's ``label_axis``, e.g. ``"age (years)"``)."""
    plt = pyplot()
    b, c = np.unique(label_bins(train_labels, bin_width), return_counts=True)
    groups = shot_groups(train_labels, bin_width, many_shot=many_shot, few_shot=few_shot)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    colors = [_SHOT_COLORS[groups[int(k)]] for k in b]
    ax.bar(b * bin_width, c, width=bin_width * 0.9, color=colors, align="edge")
    if test_labels is not None and len(test_labels):
        tb, tc = np.unique(label_bins(test_labels, bin_width), return_counts=True)
        ax.step(tb * bin_width + bin_width / 2, tc, where="mid", color="k", lw=1, label="test count")
    ax.axhline(many_shot, color="grey", ls="--", lw=0.8)
    ax.axhline(few_shot, color="grey", ls=":", lw=0.8)
    from matplotlib.patches import Patch

    handles = [Patch(color=v, label=f"{k}-shot") for k, v in _SHOT_COLORS.items()]
    _legend_outside(ax, handles=handles + ax.get_legend_handles_labels()[0])
    _label_xlim(ax, bin_width, train_labels, test_labels)
    ax.set_xlabel(label)
    ax.set_ylabel("training count")
    ax.set_title(title or "label distribution (train) and shot regions")
    return save_figure(plt, fig, path)


def per_label_mae(preds: np.ndarray, labels: np.ndarray, bin_width: float) -> tuple[np.ndarray, np.ndarray]:
    """``(bin centres, MAE in each bin)`` of a test set."""
    b = label_bins(labels, bin_width)
    ub, inv = np.unique(b, return_inverse=True)
    err = np.abs(np.asarray(preds, dtype=np.float64) - np.asarray(labels, dtype=np.float64))
    mae = np.bincount(inv, weights=err) / np.bincount(inv)
    return (ub + 0.5) * bin_width, mae


def plot_per_label_mae(
    preds: np.ndarray,
    labels: np.ndarray,
    train_labels: np.ndarray,
    bin_width: float,
    path: str | Path,
    *,
    title: str = "",
    label: str = "label",
) -> Path:
    return plot_compare_per_label_mae({"": (preds, labels)}, train_labels, bin_width, path, title=title, label=label)


def plot_compare_per_label_mae(
    series: Mapping[str, tuple[np.ndarray, np.ndarray]],
    train_labels: np.ndarray,
    bin_width: float,
    path: str | Path,
    *,
    title: str = "",
    label: str = "label",
) -> Path:
    """Per-label test MAE of one or several methods, over the training histogram (grey); x axis ``label``,
    trimmed to the labels present."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax2 = ax.twinx()
    b, c = np.unique(label_bins(train_labels, bin_width), return_counts=True)
    ax2.bar(b * bin_width, c, width=bin_width * 0.9, color="0.85", align="edge", zorder=0)
    ax2.set_ylabel("training count", color="0.5")
    ax.set_zorder(ax2.get_zorder() + 1)
    ax.patch.set_visible(False)
    for name, (preds, labels) in series.items():
        x, mae = per_label_mae(preds, labels, bin_width)
        ax.plot(x, mae, marker="o", ms=3, label=name or None)
    if any(series):
        ax.legend(loc="upper left", bbox_to_anchor=(1.12, 1.0), borderaxespad=0.0, fontsize=8)  # past ax2's labels
    _label_xlim(ax, bin_width, train_labels, *(lab for _, lab in series.values()))
    ax.set_xlabel(label)
    ax.set_ylabel("test MAE")
    ax.set_title(title or "per-label test MAE")
    return save_figure(plt, fig, path)


def plot_similarity_heatmap(
    features: np.ndarray, labels: np.ndarray, path: str | Path, *, title: str = "", label: str = "label"
) -> Path:
    """Cosine-similarity matrix of the features with examples ordered by label (RankSim Fig. 3); both axes
    are titled with ``label`` (ticks: the label of the example there), the colour bar "cosine similarity"."""
    plt = pyplot()
    f = np.asarray(features, dtype=np.float64)
    order = np.argsort(np.asarray(labels), kind="stable")
    f = f[order]
    f = f / np.maximum(np.linalg.norm(f, axis=1, keepdims=True), 1e-12)
    sim = f @ f.T
    fig, ax = plt.subplots(figsize=(4.5, 4))
    im = ax.imshow(sim, cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
    fig.colorbar(im, ax=ax, fraction=0.046, label="cosine similarity")
    lab = np.asarray(labels)[order]
    ticks: Any = np.linspace(0, len(lab) - 1, num=min(6, len(lab))).astype(int) if len(lab) else []
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{lab[i]:g}" for i in ticks], fontsize=7)
    ax.set_yticks(ticks)
    ax.set_yticklabels([f"{lab[i]:g}" for i in ticks], fontsize=7)
    ax.set_xlabel(f"test examples ordered by {label}", fontsize=8)
    ax.set_ylabel(f"test examples ordered by {label}", fontsize=8)
    ax.set_title(title or "feature cosine similarity (ordered by label)", fontsize=9)
    return save_figure(plt, fig, path)


def plot_training_curves(csv_path: str | Path, path: str | Path, *, title: str = "") -> Path | None:
    """Every metric of a Lightning CSV log against the epoch (``*_step`` columns skipped; the last value per epoch).

    A metric with a single value (a final test metric) is written in the title instead of a panel of its own
    when other metrics have curves. Returns ``None`` (and writes nothing) when the log has no metric.
    """
    import csv

    with open(csv_path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    series: dict[str, dict[int, float]] = {}
    for r in rows:
        ep = r.get("epoch")
        if ep in (None, ""):
            continue
        for k, v in r.items():
            if k in ("epoch", "step") or v in (None, "") or k.endswith("_step"):
                continue
            try:
                series.setdefault(k.removesuffix("_epoch"), {})[int(float(ep))] = float(v)
            except ValueError:
                continue
    if not series:
        return None
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    keys = sorted(series)
    # a metric logged once (e.g. a final test accuracy) goes into the title, not a one-point panel
    once = [k for k in keys if len(series[k]) == 1] if any(len(v) > 1 for v in series.values()) else []
    if once:
        keys = [k for k in keys if k not in once]
        finals = ", ".join(f"{k} {next(iter(series[k].values())):.4g}" for k in once)
        title = f"{title}: {finals}" if title else finals
    fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys) + 0.5, 3.0), squeeze=False)
    for ax, k in zip(axes[0], keys):
        ep = sorted(series[k])
        ax.plot([e + 1 for e in ep], [series[k][e] for e in ep], marker="o", ms=3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("epoch")
        ax.set_title(k, fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(plt, fig, path)


def plot_tsne(
    features: np.ndarray,
    labels: np.ndarray,
    path: str | Path,
    *,
    seed: int = 0,
    title: str = "",
    label: str = "label",
    classes: bool = False,
) -> Path:
    """2-D t-SNE (scikit-learn) of the features coloured by label: a colour bar titled ``label``, or with
    ``classes=True`` one distinct colour per class and a legend (``label`` its title)."""
    from sklearn.manifold import TSNE

    plt = pyplot()
    f = np.asarray(features, dtype=np.float64)
    n = f.shape[0]
    fig, ax = plt.subplots(figsize=(4.5, 4))
    # non-finite or identical features (a diverged or dead network): scikit-learn's PCA initialisation
    # divides by their zero variance and its Barnes-Hut code may crash on the NaN that follow
    degenerate = n >= 5 and not (np.isfinite(f).all() and float(np.ptp(f, axis=0).max()) > 0)
    if degenerate:
        ax.text(0.5, 0.5, "features are constant or not finite:\nno t-SNE", ha="center", va="center")
    elif n >= 5:
        from threadpoolctl import threadpool_limits

        # one thread: sklearn's OpenMP Barnes-Hut is ~10x slower when the CPUs are oversubscribed
        with threadpool_limits(1):
            emb = TSNE(
                n_components=2,
                perplexity=float(min(30, max(2, (n - 1) // 3))),
                init="pca",
                random_state=seed,
                max_iter=500,
            ).fit_transform(f)
        if classes:
            lab = np.asarray(labels)
            cmap = plt.get_cmap("tab10" if len(np.unique(lab)) <= 10 else "tab20")
            for i, c in enumerate(np.unique(lab)):
                pts = emb[lab == c]
                ax.scatter(pts[:, 0], pts[:, 1], color=cmap(i % cmap.N), s=8, label=f"{c}")
            _legend_outside(ax, title=label, markerscale=2)
        else:
            sc = ax.scatter(emb[:, 0], emb[:, 1], c=labels, cmap="viridis", s=8)
            fig.colorbar(sc, ax=ax, fraction=0.046, label=label)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title or "t-SNE of features", fontsize=9)
    return save_figure(plt, fig, path)


# ---------------------------------------------------------------------------------------------- tables


#: the ordinal metrics of a regression run's label classes that :func:`aggregate` averages (``test.ordinal``)
ORDINAL_KEYS = ("qwk", "exact_acc", "off_by_one_acc", "kendall", "rmse")


def _num(v: Any) -> float:
    try:
        return float(v) if v is not None else float("nan")
    except (TypeError, ValueError):
        return float("nan")


def _get(metrics: Mapping[str, Any], group: str, key: str) -> float:
    v = metrics.get(group, {})
    return _num(v.get(key)) if isinstance(v, Mapping) else float("nan")


def aggregate(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, tuple[float, float, int]]]:
    """Mean, std (ddof=0) and number of runs of each test metric: ``out[group][key] = (mean, std, n)``.

    ``runs`` are ``metrics.json`` contents (``{"test": regression_metrics(...)}``).
    """
    out: dict[str, dict[str, tuple[float, float, int]]] = {}
    keys = {g: ("mae", "mse", "gmean", "count") for g in GROUPS}
    for g, ks in keys.items():
        out[g] = {}
        for k in ks:
            vals = np.array([_get(r["test"], g, k) for r in runs], dtype=np.float64)
            vals = vals[np.isfinite(vals)]
            out[g][k] = (
                (float(vals.mean()), float(vals.std()), int(vals.size))
                if vals.size
                else (float("nan"), float("nan"), 0)
            )
    for k in ("pearson", "spearman"):
        vals = np.array([_num(r["test"].get(k)) for r in runs], dtype=np.float64)
        vals = vals[np.isfinite(vals)]
        out.setdefault("corr", {})[k] = (
            (float(vals.mean()), float(vals.std()), int(vals.size)) if vals.size else (float("nan"), float("nan"), 0)
        )
    for k in ORDINAL_KEYS:  # the label classes' metrics (``test.ordinal``), where the runs have them
        vals = np.array([_get(r["test"], "ordinal", k) for r in runs], dtype=np.float64)
        vals = vals[np.isfinite(vals)]
        out.setdefault("ordinal", {})[k] = (
            (float(vals.mean()), float(vals.std()), int(vals.size)) if vals.size else (float("nan"), float("nan"), 0)
        )
    return out


def format_cell(stat: tuple[float, float, int], digits: int = 2) -> str:
    mean, std, n = stat
    if n == 0 or not np.isfinite(mean):
        return "–"
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if n > 1 else f"{mean:.{digits}f}"


def table_rows(
    results: Mapping[str, Sequence[Mapping[str, Any]]], metric: str = "mae"
) -> tuple[list[str], list[list[str]]]:
    """Header and rows ``method | n | MAE all/many/medium/few | GM all/many/medium/few | Pearson``."""
    name = metric.upper()
    header = ["method", "seeds", *[f"{name} {g}" for g in GROUPS], *[f"GM {g}" for g in GROUPS], "Pearson"]
    rows = []
    for method, runs in results.items():
        agg = aggregate(runs)
        rows.append(
            [
                method,
                str(len(runs)),
                *[format_cell(agg[g][metric]) for g in GROUPS],
                *[format_cell(agg[g]["gmean"]) for g in GROUPS],
                format_cell(agg["corr"]["pearson"], 3),
            ]
        )
    return header, rows


#: the header of :func:`ordinal_table_rows` for each of :data:`ORDINAL_KEYS`
_ORDINAL_HEADER = {
    "qwk": "QWK",
    "exact_acc": "exact acc",
    "off_by_one_acc": "±1 acc",
    "kendall": "Kendall",
    "rmse": "RMSE",
}


def ordinal_table_rows(
    results: Mapping[str, Sequence[Mapping[str, Any]]],
) -> tuple[list[str], list[list[str]]] | None:
    """Header and rows ``method | seeds | K | QWK | exact acc | ±1 acc | Kendall | RMSE`` of the runs' label
    classes (``test.ordinal``: mean ± std over seeds); ``None`` when no run measured them."""
    aggs = {method: aggregate(runs) for method, runs in results.items()}
    if not any(a["ordinal"]["qwk"][2] for a in aggs.values()):
        return None
    header = ["method", "seeds", "K", *(_ORDINAL_HEADER[k] for k in ORDINAL_KEYS)]
    rows = []
    for method, runs in results.items():
        ks = {int(_get(r["test"], "ordinal", "num_classes")) for r in runs if "ordinal" in r["test"]}
        cells = [format_cell(aggs[method]["ordinal"][k], 3) for k in ORDINAL_KEYS]
        rows.append([method, str(len(runs)), ", ".join(str(k) for k in sorted(ks)) or "–", *cells])
    return header, rows


def markdown_table(results: Mapping[str, Sequence[Mapping[str, Any]]], metric: str = "mae") -> str:
    header, rows = table_rows(results, metric)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def plot_compare_shots(
    results: Mapping[str, Sequence[Mapping[str, Any]]], path: str | Path, metric: str = "mae"
) -> Path:
    """Grouped bar chart of the shot-group test metric (mean ± std over seeds) of every method."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    methods = list(results)
    width = 0.8 / max(len(methods), 1)
    x = np.arange(len(GROUPS))
    for i, m in enumerate(methods):
        agg = aggregate(results[m])
        means = [agg[g][metric][0] for g in GROUPS]
        stds = [agg[g][metric][1] for g in GROUPS]
        ax.bar(x + i * width, means, width, yerr=stds, label=m, capsize=2)
    ax.set_xticks(x + width * (len(methods) - 1) / 2)
    ax.set_xticklabels(GROUPS)
    ax.set_ylabel(f"test {metric.upper()}")
    _legend_outside(ax)
    return save_figure(plt, fig, path)


def _shot_text(results: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """The shot thresholds of the runs (``shot_thresholds`` of their metrics), or "per run" where they differ."""
    seen = {
        (_num(t.get("many")), _num(t.get("few")))
        for runs in results.values()
        for r in runs
        if isinstance(t := r.get("shot_thresholds"), Mapping)
    }
    if len(seen) == 1:
        many, few = next(iter(seen))
        return f"many > {many:g}, few < {few:g} training examples per label bin"
    return "shot thresholds per run: see each run's metrics.json" if seen else "shot groups of each run"


def write_compare_report(
    out_dir: str | Path,
    results: Mapping[str, Sequence[Mapping[str, Any]]],
    run_dirs: Mapping[str, Sequence[str | Path]],
    *,
    title: str = "rankwise comparison",
    metric: str = "mae",
    extra: str = "",
) -> Path:
    """``OUT/report.md``: the mean ± std table, shot bar chart, per-label MAE overlay and per-run plots."""
    out = Path(out_dir)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    plot_compare_shots(results, out / "plots" / "shots.png", metric=metric)
    series = {}
    train_labels = None
    bin_width = 1.0
    label = "label"
    for method, dirs in run_dirs.items():
        if not dirs:
            continue
        pred_file = Path(dirs[0]) / "predictions.npz"
        if pred_file.is_file():
            z = np.load(pred_file)
            series[method] = (z["pred"], z["label"])
            train_labels = z["train_labels"]
            bin_width = float(z["bin_width"])
            if "label_axis" in z.files:
                label = str(z["label_axis"])
    lines = [f"# {title}", ""]
    if extra:
        lines += [extra, ""]
    lines += [
        f"Test {metric.upper()} and GM (geometric mean of |error|) per shot group: mean ± std over seeds "
        f"({_shot_text(results)}).",
        "",
        markdown_table(results, metric),
        "",
    ]
    classes = ordinal_table_rows(results)
    if classes is not None:
        header, rows = classes
        lines += [
            "The predictions as classes (one class per integer label, else the label bins; regression predictions"
            " rounded to the nearest class): quadratic weighted kappa, exact and off-by-one accuracy, Kendall's tau,"
            " and the RMSE in label units.",
            "",
            "| " + " | ".join(header) + " |",
            "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(r) + " |" for r in rows),
            "",
        ]
    lines += [
        "![shot groups](plots/shots.png)",
        "",
    ]
    if series and train_labels is not None:
        plot_compare_per_label_mae(series, train_labels, bin_width, out / "plots" / "per_label_mae.png", label=label)
        plot_label_histogram(train_labels, bin_width, out / "plots" / "label_histogram.png", label=label)
        lines += ["![per-label MAE](plots/per_label_mae.png)", "", "![label histogram](plots/label_histogram.png)", ""]
    lines += ["## Runs", ""]
    for method, dirs in run_dirs.items():
        lines.append(f"### {method}")
        lines.append("")
        for d in dirs:
            rel = _rel(Path(d), out)
            lines.append(f"- [{rel}]({rel})")
        if dirs:
            first = Path(dirs[0]) / "plots"
            imgs = [p for p in ("similarity.png", "tsne.png", "per_label_mae.png") if (first / p).is_file()]
            if imgs:
                lines.append("")
                lines.append(" ".join(f"![{p}]({_rel(first / p, out)})" for p in imgs))
        lines.append("")
    path = out / "report.md"
    atomic_write(path, "\n".join(lines))
    return path


def _rel(p: Path, base: Path) -> str:
    import os

    try:
        return os.path.relpath(p.resolve(), base.resolve())
    except ValueError:
        return str(p)


# ---------------------------------------------------------------------------------------------- scalar metrics


def _stat(vals: Sequence[float]) -> tuple[float, float, int]:
    a = np.asarray([v for v in vals if v is not None and np.isfinite(v)], dtype=np.float64)
    return (float(a.mean()), float(a.std()), int(a.size)) if a.size else (float("nan"), float("nan"), 0)


def _cell(stat: tuple[float, float, int], digits: int = 3) -> str:
    m, s, n = stat
    if n == 0:
        return "–"
    return f"{m:.{digits}f} ± {s:.{digits}f}" if n > 1 else f"{m:.{digits}f}"


def scalar_table_rows(
    results: Mapping[str, Sequence[Mapping[str, Any]]], *, per_step: bool = False
) -> tuple[list[str], list[list[str]]]:
    """``method | seeds | <every test metric> mean ± std (ddof=0) | train s`` of runs with scalar test metrics.

    With ``per_step``, a column ``s/step`` (the runs' ``seconds_per_step``: wall seconds of one
    training step, mean ± std over seeds) comes before ``train s``.
    """
    keys: list[str] = []
    for runs in results.values():
        for r in runs:
            keys += [k for k in r.get("test", {}) if k not in keys]
    header = ["method", "seeds", *keys, *(["s/step"] if per_step else []), "train s"]
    rows = []
    for method, runs in results.items():
        cells = [_cell(_stat([_num(r["test"].get(k)) for r in runs])) for k in keys]
        if per_step:
            cells.append(_cell(_stat([_num(r.get("seconds_per_step")) for r in runs]), 3))
        wall = _cell(_stat([_num(r.get("train_seconds")) for r in runs]), 1)
        rows.append([method, str(len(runs)), *cells, wall])
    return header, rows


def scalar_summary(metrics: Mapping[str, Any]) -> str:
    """One line ``key value, ...`` of a run's scalar test metrics."""
    return ", ".join(f"{k} {v:.4f}" for k, v in metrics.get("test", {}).items())


def write_scalar_report(
    out_dir: str | Path,
    results: Mapping[str, Sequence[Mapping[str, Any]]],
    run_dirs: Mapping[str, Sequence[str | Path]],
    *,
    title: str = "rankwise comparison",
    extra: str = "",
    per_step: bool = False,
) -> Path:
    """``OUT/report.md``: the mean ± std table of every scalar test metric, and links to the runs.

    ``per_step``: add the ``s/step`` column of :func:`scalar_table_rows`.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    header, rows = scalar_table_rows(results, per_step=per_step)
    lines = [f"# {title}", ""]
    if extra:
        lines += [extra, ""]
    note = "Test metrics, mean ± std (ddof=0) over seeds; `train s` = wall time of one run"
    note += "; `s/step` = wall seconds of one training step." if per_step else "."
    lines += [note, ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", "## Runs", ""]
    for method, dirs in run_dirs.items():
        lines += [f"### {method}", ""] + [f"- [{_rel(Path(d), out)}]({_rel(Path(d), out)})" for d in dirs] + [""]
    path = out / "report.md"
    atomic_write(path, "\n".join(lines))
    return path
