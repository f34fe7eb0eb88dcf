"""retrieval_metrics against pytorch-metric-learning's AccuracyCalculator and a brute-force reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rankwise.metrics import retrieval_metrics

acc_mod = pytest.importorskip("pytorch_metric_learning.utils.accuracy_calculator")
from pytorch_metric_learning.distances import LpDistance  # noqa: E402
from pytorch_metric_learning.utils.inference import CustomKNN  # noqa: E402


def _data(n: int, d: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(classes, (n,), generator=g)
    centers = torch.randn(classes, d, generator=g, dtype=torch.float64)
    x = centers[y] + 1.5 * torch.randn(n, d, generator=g, dtype=torch.float64)
    return x, y


def _brute_recall(x: np.ndarray, y: np.ndarray, k: int) -> float:
    d = ((x[:, None] - x[None]) ** 2).sum(-1)
    np.fill_diagonal(d, np.inf)
    hits = []
    for q in range(len(y)):
        if (y == y[q]).sum() < 2:
            continue
        nn = np.argsort(d[q], kind="stable")[:k]
        hits.append((y[nn] == y[q]).any())
    return float(np.mean(hits))


@pytest.mark.parametrize(("n", "classes", "block"), [(60, 4, 7), (200, 12, 64), (333, 40, 1024)])
def test_equals_accuracy_calculator(n: int, classes: int, block: int) -> None:
    calc = acc_mod.AccuracyCalculator(
        include=("precision_at_1", "r_precision", "mean_average_precision_at_r"),
        knn_func=CustomKNN(LpDistance(normalize_embeddings=False)),
    )
    for seed in range(3):
        x, y = _data(n, 8, classes, seed)
        y[0] = classes + 5  # a lone label: left out by both
        ref = calc.get_accuracy(x.float(), y)
        got = retrieval_metrics(x, y, ks=(1, 2, 4, 8), block_size=block)
        assert got["recall@1"] == pytest.approx(ref["precision_at_1"], abs=1e-12)
        assert got["r_precision"] == pytest.approx(ref["r_precision"], abs=1e-12)
        assert got["map@r"] == pytest.approx(ref["mean_average_precision_at_r"], abs=1e-12)
        assert got["num_queries"] == n - 1
        for k in (2, 4, 8):
            assert got[f"recall@{k}"] == pytest.approx(_brute_recall(x.numpy(), y.numpy(), k), abs=1e-12)


def test_cosine_distance_and_hand_example() -> None:
    # query 0: neighbours 4 (label 1), 1 (label 0): R = 1, MAP@R = 0
    # neighbours: 0 -> 4 1 ..; 1 -> 4 0 ..; 2 -> 3 1 4 ..; 3 -> 2 1 4 ..; 4 -> 0 1 2 ..
    x = torch.tensor([[0.0], [0.1], [1.0], [1.2], [0.04]])
    m = retrieval_metrics(x, torch.tensor([0, 0, 1, 1, 1]), ks=(1, 2))
    assert (m["recall@1"], m["recall@2"]) == (pytest.approx(2 / 5), pytest.approx(4 / 5))
    # R = 1, 1, 2, 2, 2: AP@R 0, 0, 1/2, 1/2, 0; R-precision 0, 0, 1/2, 1/2, 0
    assert m["map@r"] == pytest.approx(1 / 5)
    assert m["r_precision"] == pytest.approx(1 / 5)
    # scale-invariant cosine: rescaling each vector changes nothing
    x2, y2 = _data(50, 5, 3, 9)
    a = retrieval_metrics(x2, y2, distance="cosine")
    b = retrieval_metrics(x2 * torch.rand(50, 1, dtype=torch.float64).add(0.5), y2, distance="cosine")
    assert a == b


def test_no_query_with_a_positive_gives_nan() -> None:
    m = retrieval_metrics(torch.randn(4, 2), torch.arange(4))
    assert m["num_queries"] == 0 and np.isnan(m["recall@1"])


def test_errors() -> None:
    with pytest.raises(ValueError, match="labels"):
        retrieval_metrics(torch.randn(4, 2), torch.arange(3))
    with pytest.raises(TypeError, match="ks"):
        retrieval_metrics(torch.randn(4, 2), torch.arange(4), ks=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="distance"):
        retrieval_metrics(torch.randn(4, 2), torch.arange(4), distance="l1")  # type: ignore[arg-type]


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize("scale", [1e20, 1e-20, 1e-30])
def test_metrics_do_not_depend_on_the_magnitude(distance: str, scale: float) -> None:
    x = torch.randn(40, 3, generator=torch.Generator().manual_seed(1))
    y = torch.arange(40) % 5
    assert retrieval_metrics(x * scale, y, distance=distance) == retrieval_metrics(x, y, distance=distance)


def test_a_nan_or_infinite_embedding_gives_nan_metrics() -> None:
    x = torch.randn(10, 3, generator=torch.Generator().manual_seed(2))
    y = torch.arange(10) % 2
    for bad in (float("nan"), float("inf")):
        x2 = x.clone()
        x2[4, 1] = bad
        m = retrieval_metrics(x2, y)
        assert m["num_queries"] == 10.0
        assert all(np.isnan(v) for k, v in m.items() if k != "num_queries"), m


def _offset_clusters(offset: float, spread: float) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 clusters (unit-normal centres, noise of std ``spread``) all shifted by ``offset``."""
    g = torch.Generator().manual_seed(0)
    y = torch.randint(10, (300,), generator=g)
    centres = torch.randn(10, 16, generator=g, dtype=torch.float64)
    x = offset + centres[y] + spread * torch.randn(300, 16, generator=g, dtype=torch.float64)
    return x.float(), y


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize(("offset", "spread"), [(1e4, 1.0), (1e4, 0.3), (1e6, 1.0)])
def test_offset_float32_embeddings_give_the_float64_metrics(distance: str, offset: float, spread: float) -> None:
    # |x|^2 ~ 1e9 and more: the expanded 2 x.y - |x|^2 - |y|^2 cancels in float32, and so does 1 - cos
    x, y = _offset_clusters(offset, spread)
    got = retrieval_metrics(x, y, distance=distance)
    want = retrieval_metrics(x.double(), y, distance=distance)
    assert got == pytest.approx(want, abs=0.01), (got, want)
