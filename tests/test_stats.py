"""``rankwise._stats``: the one Pearson correlation and average-tie ranks of the library, against numpy and scipy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rankwise._stats import average_ranks, pearson, pearson_np


def test_matches_numpy_and_scipy() -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    g = torch.Generator().manual_seed(0)
    a = torch.randn(50, generator=g, dtype=torch.float64)
    b = 0.3 * a + torch.randn(50, generator=g, dtype=torch.float64)
    got = float(pearson(a, b))
    assert got == pytest.approx(float(np.corrcoef(a.numpy(), b.numpy())[0, 1]), rel=1e-12)
    assert got == pytest.approx(float(scipy_stats.pearsonr(a.numpy(), b.numpy())[0]), rel=1e-12)


def test_batched_along_dim() -> None:
    g = torch.Generator().manual_seed(1)
    a = torch.randn(3, 7, 4, generator=g, dtype=torch.float64)
    b = torch.randn(3, 7, 4, generator=g, dtype=torch.float64)
    got = pearson(a, b, dim=1)
    assert got.shape == (3, 4)
    for i in range(3):
        for j in range(4):
            want = np.corrcoef(a[i, :, j].numpy(), b[i, :, j].numpy())[0, 1]
            assert float(got[i, j]) == pytest.approx(float(want), rel=1e-12)
    torch.testing.assert_close(pearson(a.movedim(1, -1), b.movedim(1, -1)), got)


def test_undefined_is_nan() -> None:
    x = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)
    assert pearson(x, torch.full_like(x, 3.0)).isnan()  # constant b
    assert pearson(torch.full_like(x, 3.0), x).isnan()  # constant a
    assert pearson(x[:1], x[:1]).isnan()  # one value
    assert pearson(x[:0], x[:0]).isnan()  # none
    assert pearson(torch.tensor([1.0, float("nan"), 2.0]), x.float()).isnan()
    rows = pearson(torch.tensor([[1.0, 2.0, 3.0], [5.0, 5.0, 5.0]]), torch.tensor([[1.0, 2.0, 4.0], [1.0, 2.0, 3.0]]))
    assert not rows[0].isnan() and rows[1].isnan()


def test_dtypes_and_errors() -> None:
    a, b = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([3.0, 1.0, 2.0])
    assert pearson(a.half(), b.half()).dtype == torch.float32
    assert pearson(a.long(), b.long()).dtype == torch.float32
    assert pearson(a.double(), b).dtype == torch.float64
    assert float(pearson(a, b)) == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="same shape"):
        pearson(a, b[:2])


def test_average_ranks_match_scipy_with_ties() -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for x in (rng.integers(0, 5, 40).astype(float), rng.normal(size=17), np.array([2.0]), np.array([3.0, 3.0, 3.0])):
        np.testing.assert_array_equal(average_ranks(x), scipy_stats.rankdata(x))
    assert average_ranks(np.array([])).shape == (0,)


def test_pearson_np_is_pearson_or_none() -> None:
    a, b = np.array([1.0, 2.0, 3.0]), np.array([2.0, 4.0, 7.0])
    assert pearson_np(a, b) == pytest.approx(float(np.corrcoef(a, b)[0, 1]), rel=1e-12)
    assert pearson_np(a, np.array([5.0, 5.0, 5.0])) is None
    assert pearson_np(np.array([1.0]), np.array([2.0])) is None
    assert pearson_np(np.array([1.0, np.nan]), np.array([2.0, 3.0])) is None
