"""Data-driven label bins and shot thresholds for datasets that do not define them (generic CSV files)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rankwise.data import (
    get_dataset,
    label_histogram,
    load_abalone,
    load_csv,
    suggest_bin_width,
    suggest_shot_thresholds,
)
from rankwise.imbalanced import shot_groups


def _nice(w: float) -> bool:
    mantissa = w / 10 ** math.floor(math.log10(w))
    return any(math.isclose(mantissa, m) for m in (1, 2, 5))


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        (np.arange(25.0, 347.0), 20.0),  # diabetes-like: 322 integers -> sqrt ~ 18 bins of 17.9 -> 20
        (np.linspace(0.0, 5.0, 5000), 0.05),  # 71 bins of 0.07 -> 0.05
        (np.arange(1.0, 30.0).repeat(100), 1.0),  # integer labels: never below 1
        (np.linspace(0.0, 1.0, 50), 0.1),  # at least 10 bins
        (np.linspace(0.0, 1000.0, 10**6), 10.0),  # at most 100 bins
        (np.full(7, 3.5), 1.0),  # one value
    ],
)
def test_suggest_bin_width(labels: np.ndarray, expected: float) -> None:
    w = suggest_bin_width(labels)
    assert w == expected and _nice(w)
    span = labels.max() - labels.min()
    if span > 0 and not np.all(labels == np.round(labels)):
        assert 10 / 2.5 <= span / w <= 100 * 2.5  # rounding to 1-2-5 moves the bin count by < 2.5x


def test_suggest_bin_width_errors() -> None:
    with pytest.raises(ValueError, match="`labels` must be a non-empty array of finite values"):
        suggest_bin_width(np.array([]))
    with pytest.raises(ValueError, match="`labels` must be a non-empty array of finite values"):
        suggest_bin_width(np.array([1.0, np.nan]))


def test_suggest_shot_thresholds() -> None:
    labels = np.array([1.0] * 60 + [2.0] * 30 + [3.0] * 3)  # 3 occupied bins, mean 31
    assert suggest_shot_thresholds(labels, 1.0) == (31.0, 6.2)
    # empty bins between occupied ones do not count: bins 0 and 5 only
    assert suggest_shot_thresholds(np.array([0.5] * 10 + [5.5] * 30), 1.0) == (20.0, 4.0)
    with pytest.raises(ValueError, match="`train_labels` must not be empty"):
        suggest_shot_thresholds(np.array([]), 1.0)


def test_diabetes_csv_has_every_shot_group(tmp_path) -> None:
    """sklearn's diabetes (442 rows, integer targets 25..346) through the generic CSV loader: with unit bins
    and the fixed 100 / 20 thresholds every test row would be few-shot; the data-driven defaults give
    many-, medium- and few-shot rows."""
    datasets = pytest.importorskip("sklearn.datasets")
    frame = datasets.load_diabetes(as_frame=True, scaled=False).frame
    path = tmp_path / "diabetes.csv"
    frame.to_csv(path, index=False)
    data = get_dataset("csv", path=path, target="target", seed=0)
    assert data.sizes() == (310, 44, 88)
    assert data.bin_width == 20.0
    many, few = data.shot_thresholds
    hist = label_histogram(data.train_labels, data.bin_width)
    occupied = hist.counts[hist.counts > 0]
    assert many == pytest.approx(occupied.mean()) and few == pytest.approx(many / 5)
    groups = shot_groups(data.test_labels, data.train_labels, many_shot=many, few_shot=few, bin_width=data.bin_width)
    sizes = {k: int(v.sum()) for k, v in groups.items()}
    assert all(n > 0 for n in sizes.values()), sizes
    assert sum(sizes.values()) == 88
    fixed = shot_groups(data.test_labels, data.train_labels, many_shot=100, few_shot=20, bin_width=1.0)
    assert int(fixed["few"].sum()) == 88  # what the old defaults gave


def test_explicit_bin_width_and_benchmark_thresholds(tmp_path) -> None:
    rows = ["x,y"] + [f"{i % 7},{i % 13}" for i in range(200)]
    path = tmp_path / "small.csv"
    path.write_text("\n".join(rows) + "\n")
    assert load_csv(path, "y", bin_width=2.0).bin_width == 2.0
    assert load_csv(path, "y").bin_width == 1.0  # integers 0..12
    pytest.importorskip("sklego")
    assert load_abalone().shot_thresholds == (100, 20)  # the DIR benchmark's definition
