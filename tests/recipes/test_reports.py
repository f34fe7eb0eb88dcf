"""Plots of rankwise.recipes.reports: axis titles from the dataset's label, trimmed label axes, legends
outside the axes, class-coloured t-SNE, integer epoch ticks, final metrics in the title."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rankwise.data import RegressionData
from rankwise.recipes import reports


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The figures the plot functions save (drawn, kept open for inspection; closed at teardown)."""
    saved: list[Any] = []
    original = reports.save_figure

    def keep(plt: Any, fig: Any, path: Any) -> Any:
        fig.canvas.draw()
        saved.append(fig)
        fig.savefig(path, dpi=50, bbox_inches="tight")
        return path

    monkeypatch.setattr(reports, "save_figure", keep)
    yield saved
    plt = reports.pyplot()
    for fig in saved:
        plt.close(fig)
    assert original is not None


def _legend_right_of_axes(fig: Any, ax: Any) -> bool:
    legend = ax.get_legend()
    assert legend is not None
    renderer = fig.canvas.get_renderer()
    return bool(legend.get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1)


def _labels(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    train = np.clip(rng.normal(40, 6, 500).round(), 22, 61)
    test = np.clip(rng.normal(40, 8, 80).round(), 25, 58)
    return train, test


def test_label_histogram_axis_title_trimmed_axis_and_legend_outside(tmp_path, figures) -> None:
    train, test = _labels()
    reports.plot_label_histogram(train, 1.0, tmp_path / "h.png", test_labels=test, label="age (years)")
    fig = figures[-1]
    ax = fig.axes[0]
    assert ax.get_xlabel() == "age (years)"
    lo, hi = min(train.min(), test.min()), max(train.max(), test.max())
    assert ax.get_xlim() == pytest.approx((lo - 0.5, hi + 1.5))  # the bins with data, half a bin of margin
    assert _legend_right_of_axes(fig, ax)
    assert (tmp_path / "h.png").is_file()
    reports.plot_label_histogram(train, 1.0, tmp_path / "h2.png")
    assert figures[-1].axes[0].get_xlabel() == "label"  # the default stays


def test_per_label_mae_axis_title_trimmed_axis_and_legend_outside(tmp_path, figures) -> None:
    train, test = _labels()
    rng = np.random.default_rng(1)
    series = {"L1": (test + rng.normal(0, 2, test.size), test), "+LDS": (test + rng.normal(0, 1, test.size), test)}
    reports.plot_compare_per_label_mae(series, train, 1.0, tmp_path / "m.png", label="similarity score (0-5)")
    fig = figures[-1]
    ax = next(a for a in fig.axes if a.get_ylabel() == "test MAE")
    assert ax.get_xlabel() == "similarity score (0-5)"
    lo, hi = min(train.min(), test.min()), max(train.max(), test.max())
    assert ax.get_xlim() == pytest.approx((lo - 0.5, hi + 1.5))
    assert _legend_right_of_axes(fig, ax)
    twin = next(a for a in fig.axes if a is not ax)
    legend = ax.get_legend().get_window_extent(fig.canvas.get_renderer())
    assert legend.x0 >= twin.yaxis.label.get_window_extent(fig.canvas.get_renderer()).x1  # past the right labels


def test_similarity_heatmap_axis_titles(tmp_path, figures) -> None:
    rng = np.random.default_rng(2)
    labels = rng.integers(0, 30, 40).astype(float)
    reports.plot_similarity_heatmap(rng.normal(size=(40, 8)), labels, tmp_path / "s.png", label="age (years)")
    fig = figures[-1]
    ax = fig.axes[0]
    assert ax.get_xlabel() == ax.get_ylabel() == "test examples ordered by age (years)"
    assert ax.get_title() == "feature cosine similarity (ordered by label)"
    assert fig.axes[1].get_ylabel() == "cosine similarity"  # the colour bar
    ticks = [float(t.get_text()) for t in ax.get_xticklabels()]
    assert ticks == sorted(ticks) and ticks[0] == labels.min() and ticks[-1] == labels.max()


def test_tsne_classes_get_distinct_colours_and_a_legend(tmp_path, figures) -> None:
    pytest.importorskip("sklearn")
    rng = np.random.default_rng(3)
    y = np.repeat(np.arange(3), 10)
    x = rng.normal(size=(30, 5)) + 5 * y[:, None]
    reports.plot_tsne(x, y, tmp_path / "t.png", label="class", classes=True)
    fig = figures[-1]
    ax = fig.axes[0]
    legend = ax.get_legend()
    assert legend.get_title().get_text() == "class"
    assert [t.get_text() for t in legend.get_texts()] == ["0", "1", "2"]
    colours = {tuple(np.round(c.get_facecolor()[0], 3)) for c in ax.collections}
    assert len(ax.collections) == 3 and len(colours) == 3
    assert len(fig.axes) == 1 and _legend_right_of_axes(fig, ax)
    reports.plot_tsne(x, y.astype(float), tmp_path / "t2.png", label="age (years)")
    assert figures[-1].axes[1].get_ylabel() == "age (years)"  # a colour bar for a continuous label


def test_training_curves_integer_epochs_and_final_metrics_in_the_title(tmp_path, figures) -> None:
    csv = tmp_path / "metrics.csv"
    rows = ["epoch,probe/loss,step,test/acc", "0,2.3,0,", "1,2.1,1,", "2,1.9,2,", "3,,3,45.5"]
    csv.write_text("\n".join(rows) + "\n")
    assert reports.plot_training_curves(csv, tmp_path / "c.png", title="linear probe") is not None
    fig = figures[-1]
    assert [a.get_title() for a in fig.axes] == ["probe/loss"]  # no one-point panel for test/acc
    assert fig._suptitle.get_text() == "linear probe: test/acc 45.5"
    ticks = fig.axes[0].get_xticks()
    assert np.allclose(ticks, np.round(ticks))
    # only single values: they are still plotted
    csv.write_text("epoch,step,test/acc\n0,0,45.5\n")
    reports.plot_training_curves(csv, tmp_path / "c2.png")
    assert [a.get_title() for a in figures[-1].axes] == ["test/acc"]


def _regression_data(**kw: Any) -> RegressionData:
    z = np.zeros(2)
    return RegressionData("d", [], [], [], z, z, z, "table", 1, 1.0, **kw)  # type: ignore[arg-type]


def test_label_axis_from_dataset_metadata() -> None:
    assert _regression_data(label_name="y").label_axis == "y"
    assert _regression_data(label_name="age", label_unit="years").label_axis == "age (years)"
    d = _regression_data(label_name="score", label_description="similarity score", label_unit="0-5")
    assert d.label_axis == "similarity score (0-5)"


def test_bundled_regression_datasets_name_their_label_unit() -> None:
    from rankwise.data import load_abalone

    assert load_abalone().label_axis == "age (years)"
