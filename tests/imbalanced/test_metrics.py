"""regression_metrics / shot_groups: hand computations, slow per-label loop, AgeDB-DIR shot facts, empty groups."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from rankwise.imbalanced import regression_metrics, shot_groups

scipy_stats = pytest.importorskip("scipy.stats")


def slow_metrics(preds, labels, train_labels, many=100, few=20):
    """The reference's per-label loop: per-class error sums, pooled per group (sample-averaged)."""
    groups: dict[str, list[float]] = {"many": [], "medium": [], "few": []}
    for lab in np.unique(labels):
        n_train = int(np.sum(train_labels == lab))
        errs = list(np.abs(preds[labels == lab] - labels[labels == lab]))
        key = "many" if n_train > many else ("few" if n_train < few else "medium")
        groups[key] += errs
    groups_all = list(np.abs(preds - labels))
    out = {}
    for k, errs in [("all", groups_all), *groups.items()]:
        if not errs:
            out[k] = {"mae": None, "mse": None, "gmean": None, "count": 0}
            continue
        out[k] = {
            "mae": sum(errs) / len(errs),
            "mse": sum(e * e for e in errs) / len(errs),
            "gmean": 0.0 if min(errs) == 0 else math.exp(sum(math.log(e) for e in errs) / len(errs)),
            "count": len(errs),
        }
    return out


def test_hand_computed() -> None:
    train = [1] * 150 + [2] * 50 + [3] * 5
    preds = [1.0, 3.0, 2.0, 5.0, 3.5]
    labels = [1, 1, 2, 3, 4]  # label 4 never seen in training: few-shot
    m = regression_metrics(preds, labels, train)
    assert m["all"] == {"mae": pytest.approx(4.5 / 5), "mse": pytest.approx(8.25 / 5), "gmean": 0.0, "count": 5}
    assert m["many"] == {"mae": 1.0, "mse": 2.0, "gmean": 0.0, "count": 2}
    assert m["medium"] == {"mae": 0.0, "mse": 0.0, "gmean": 0.0, "count": 1}
    assert m["few"]["count"] == 2
    assert m["few"]["mae"] == pytest.approx(1.25) and m["few"]["mse"] == pytest.approx((4 + 0.25) / 2)
    assert m["few"]["gmean"] == pytest.approx(math.sqrt(2 * 0.5))
    for group in ("all", "many", "medium", "few"):
        for key in ("mae", "mse", "gmean"):
            assert isinstance(m[group][key], float)
        assert isinstance(m[group]["count"], int)
    assert isinstance(m["pearson"], float) and isinstance(m["spearman"], float)


def test_thresholds_are_strict() -> None:
    train = [0] * 101 + [1] * 100 + [2] * 20 + [3] * 19
    g = shot_groups([0, 1, 2, 3], train)
    assert g["many"].tolist() == [True, False, False, False]
    assert g["medium"].tolist() == [False, True, True, False]
    assert g["few"].tolist() == [False, False, False, True]
    g2 = shot_groups([0, 1, 2, 3], train, many_shot=19, few_shot=19)
    assert g2["many"].tolist() == [True, True, True, False]
    assert g2["medium"].tolist() == [False, False, False, True]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_slow_loop(seed: int) -> None:
    rng = np.random.default_rng(seed)
    train = np.round(rng.gamma(2.0, 12.0, size=3000))
    labels = rng.integers(0, 80, size=400).astype(float)
    preds = labels + rng.normal(0, 5, size=400)
    got = regression_metrics(torch.from_numpy(preds).float().view(-1, 1), torch.from_numpy(labels), train)
    ref = slow_metrics(torch.from_numpy(preds).float().double().numpy(), labels, train)
    for k in ("all", "many", "medium", "few"):
        assert got[k]["count"] == ref[k]["count"]
        for key in ("mae", "mse", "gmean"):
            if ref[k][key] is None:
                assert got[k][key] is None
            else:
                assert got[k][key] == pytest.approx(ref[k][key], rel=1e-10)
    assert got["pearson"] == pytest.approx(scipy_stats.pearsonr(preds, labels)[0], rel=1e-6)
    assert got["spearman"] == pytest.approx(scipy_stats.spearmanr(preds, labels)[0], rel=1e-6)


def test_spearman_ties_and_scipy_gmean() -> None:
    preds = np.array([1.0, 1.0, 2.0, 3.0, 3.0, 3.0, 0.5])
    labels = np.array([2.0, 1.0, 2.0, 4.0, 4.0, 5.0, 1.0])
    m = regression_metrics(preds, labels, labels)
    assert m["spearman"] == pytest.approx(scipy_stats.spearmanr(preds, labels)[0], rel=1e-12)
    assert m["pearson"] == pytest.approx(scipy_stats.pearsonr(preds, labels)[0], rel=1e-12)
    p2 = preds + 0.125
    assert regression_metrics(p2, labels, labels)["all"]["gmean"] == pytest.approx(
        scipy_stats.gmean(np.abs(p2 - labels)), rel=1e-12
    )


def test_gmean_zero_handling() -> None:
    preds, labels = [1.0, 2.0, 4.0], [1.0, 3.0, 6.0]
    assert regression_metrics(preds, labels, [1])["all"]["gmean"] == 0.0  # reference: one exact zero -> 0
    eps = 1e-8
    got = regression_metrics(preds, labels, [1], gmean_eps=eps)["all"]["gmean"]
    assert got == pytest.approx(math.exp((math.log(eps) + math.log(1 + eps) + math.log(2 + eps)) / 3))


def test_empty_groups_and_degenerate() -> None:
    m = regression_metrics([1.0, 2.0], [1.0, 2.0], [])
    assert m["many"] == {"mae": None, "mse": None, "gmean": None, "count": 0}
    assert m["medium"]["count"] == 0 and m["few"]["count"] == 2
    one = regression_metrics([1.0], [2.0], [2.0] * 200)
    assert one["all"]["mae"] == 1.0 and one["pearson"] is None and one["spearman"] is None
    const = regression_metrics([1.0, 1.0, 1.0], [1.0, 2.0, 3.0], [1.0])
    assert const["pearson"] is None and const["spearman"] is None
    empty = regression_metrics([], [], [1, 2])
    assert empty["all"]["count"] == 0 and empty["all"]["mae"] is None and empty["pearson"] is None


def test_bin_width_groups_continuous_labels() -> None:
    """STS-B-like scores: shot counts per 0.1-wide bin of the training labels."""
    train = np.concatenate([np.full(150, 2.03), np.full(30, 2.17), np.full(5, 4.91)])
    labels = np.array([2.0, 2.09, 2.1, 4.95, 0.3])
    g = shot_groups(labels, train, bin_width=0.1)
    assert g["many"].tolist() == [True, True, False, False, False]
    assert g["medium"].tolist() == [False, False, True, False, False]
    assert g["few"].tolist() == [False, False, False, True, True]
    m = regression_metrics(labels + 0.5, labels, train, bin_width=0.1)
    assert (m["many"]["count"], m["medium"]["count"], m["few"]["count"]) == (2, 1, 2)


def test_agedb_dir_test_split_shots(shared_dir: Path) -> None:
    path = shared_dir / "data" / "agedb-dir" / "agedb.csv"
    if not path.is_file():
        pytest.skip("agedb.csv is absent")
    with path.open() as f:
        rows = list(csv.DictReader(f))
    train = np.array([int(r["age"]) for r in rows if r["split"] == "train"])
    test = np.array([int(r["age"]) for r in rows if r["split"] == "test"])
    assert (len(train), len(test)) == (12208, 2140)
    g = shot_groups(test, train)
    assert [len(np.unique(test[g[k]])) for k in ("many", "medium", "few")] == [51, 16, 25]
    assert [int(g[k].sum()) for k in ("many", "medium", "few")] == [1530, 448, 162]
    m = regression_metrics(test + 1.5, test, train)
    assert [m[k]["count"] for k in ("all", "many", "medium", "few")] == [2140, 1530, 448, 162]
    assert m["all"]["mae"] == pytest.approx(1.5) and m["few"]["gmean"] == pytest.approx(1.5)


def test_errors() -> None:
    with pytest.raises(ValueError, match="`preds` and `labels` must hold the same number"):
        regression_metrics([1.0, 2.0], [1.0], [1.0])
    with pytest.raises(ValueError, match="`few_shot` must be <= `many_shot`"):
        regression_metrics([1.0], [1.0], [1.0], many_shot=10, few_shot=20)
    with pytest.raises(ValueError, match="`preds` must be finite"):
        regression_metrics([float("nan")], [1.0], [1.0])
    with pytest.raises(ValueError, match="`bin_width` must be finite and > 0"):
        regression_metrics([1.0], [1.0], [1.0], bin_width=0)
    with pytest.raises(ValueError, match="`gmean_eps` must be finite and >= 0"):
        regression_metrics([1.0], [1.0], [1.0], gmean_eps=-1)
    with pytest.raises(TypeError, match="`train_labels` must be a tensor, array or sequence"):
        regression_metrics([1.0], [1.0], object())
