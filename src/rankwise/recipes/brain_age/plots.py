"""Plots of the brain-age recipe: predicted vs chronological age, brain-age gap vs age before and after
the bias correction, MAE per decade, a three-plane montage of preprocessed inputs (matplotlib, Agg)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rankwise._fileio import atomic_open
from rankwise._stats import pearson_np

__all__ = ["plot_bag_vs_age", "plot_mae_by_decade", "plot_montage", "plot_pred_vs_age"]


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _r(r: float | None, digits: int) -> str:
    """A correlation for a plot title: ``nan`` where it is undefined (fewer than 2 values, a constant)."""
    return "nan" if r is None else f"{r:.{digits}f}"


def _save(fig: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    with atomic_open(path, "wb") as fh:
        fig.savefig(fh, format=path.suffix.lstrip(".") or None, dpi=120)
    _plt().close(fig)
    return path


def plot_pred_vs_age(pred: np.ndarray, age: np.ndarray, path: str | Path, *, title: str = "") -> Path:
    """Scatter of predicted against chronological age with the identity line, MAE and Pearson r in the title."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.scatter(age, pred, s=12, alpha=0.7)
    lo, hi = float(min(age.min(), pred.min())), float(max(age.max(), pred.max()))
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="identity")
    r = pearson_np(pred, age)
    ax.set(xlabel="chronological age (years)", ylabel="predicted age (years)")
    ax.set_title(f"{title}\nMAE {np.abs(pred - age).mean():.2f}, r {_r(r, 3)}", fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    return _save(fig, path)


def plot_bag_vs_age(
    pred: np.ndarray, age: np.ndarray, corrected: Mapping[str, np.ndarray], path: str | Path, *, title: str = ""
) -> Path:
    """Brain-age gap against age: raw, and after each bias correction (one panel each)."""
    plt = _plt()
    panels = [("uncorrected", pred), *((f"corrected ({k})", v) for k, v in corrected.items())]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6), sharey=True)
    for ax, (name, p) in zip(np.atleast_1d(axes), panels, strict=True):
        gap = p - age
        ok = np.isfinite(gap)
        ax.scatter(age[ok], gap[ok], s=10, alpha=0.7)
        ax.axhline(0, color="k", lw=1)
        r = pearson_np(gap[ok], age[ok])
        ax.set_title(f"{name}: corr(BAG, age) {_r(r, 2)}", fontsize=9)
        ax.set_xlabel("chronological age (years)")
    np.atleast_1d(axes)[0].set_ylabel("brain-age gap (years)")
    fig.suptitle(title, fontsize=9)
    return _save(fig, path)


def plot_mae_by_decade(pred: np.ndarray, age: np.ndarray, path: str | Path, *, title: str = "") -> Path:
    """Bar chart of the test MAE per age decade (subjects per decade on the bars)."""
    plt = _plt()
    dec = (np.floor(age / 10) * 10).astype(int)
    keys = sorted(set(dec.tolist()))
    maes = [float(np.abs(pred[dec == d] - age[dec == d]).mean()) for d in keys]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    bars = ax.bar([f"{d}-{d + 9}" for d in keys], maes)
    for b, d in zip(bars, keys, strict=True):
        ax.annotate(
            f"n={int((dec == d).sum())}", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", fontsize=7
        )
    ax.set(xlabel="age decade", ylabel="MAE (years)")
    ax.set_title(title, fontsize=9)
    return _save(fig, path)


def plot_montage(dataset: Any, path: str | Path, *, n: int = 3) -> Path:
    """Axial, coronal and sagittal middle slices of the first ``n`` preprocessed volumes of ``dataset``."""
    plt = _plt()
    n = max(1, min(n, len(dataset)))
    fig, axes = plt.subplots(n, 3, figsize=(7.5, 2.6 * n), squeeze=False)
    for i in range(n):
        x, y = dataset[i]
        v = x["volume"][0].float().numpy()
        d, h, w = (s // 2 for s in v.shape)
        for j, (name, sl) in enumerate((("axial", v[:, :, w]), ("coronal", v[:, h, :]), ("sagittal", v[d, :, :]))):
            axes[i, j].imshow(sl.T, origin="lower", cmap="gray")
            axes[i, j].set_axis_off()
            axes[i, j].set_title(f"{name}, age {float(y):.1f}" if j == 0 else name, fontsize=8)
    return _save(fig, path)
