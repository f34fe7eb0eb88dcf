"""``rankwise.correct_age_bias`` and ``brain_age_metrics`` against independent numpy computations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rankwise
from rankwise.brain_age import brain_age_metrics

pytest.importorskip("scipy")


def _cohort(seed: int = 0, n: int = 200) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    age = rng.uniform(20, 90, n)
    pred = 0.6 * age + 22 + rng.normal(0, 4, n)  # regression to the mean: corr(BAG, age) < 0
    return age, pred


def test_gap_correction_removes_the_age_dependence() -> None:
    fit_age, fit_pred = _cohort(0)
    age, pred = _cohort(1)
    out = rankwise.correct_age_bias(pred, age, fit_pred=fit_pred, fit_age=fit_age, method="gap")
    slope, icpt = np.polyfit(fit_age, fit_pred - fit_age, 1)
    np.testing.assert_allclose(out, pred - (slope * age + icpt))
    assert np.corrcoef(pred - age, age)[0, 1] < -0.5
    assert abs(np.corrcoef(out - age, age)[0, 1]) < 0.15


def test_prediction_correction_inverts_the_fitted_line() -> None:
    fit_age, fit_pred = _cohort(0)
    age, pred = _cohort(2)
    out = rankwise.correct_age_bias(
        torch.tensor(pred), torch.tensor(age), fit_pred=fit_pred, fit_age=fit_age, method="prediction"
    )
    alpha, beta = np.polyfit(fit_age, fit_pred, 1)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64
    np.testing.assert_allclose(out.numpy(), (pred - beta) / alpha)


def test_correct_age_bias_errors() -> None:
    with pytest.raises(ValueError, match="at least 2 different ages"):
        rankwise.correct_age_bias([1.0], [1.0], fit_pred=[3.0, 4.0], fit_age=[5.0, 5.0])
    with pytest.raises(ValueError, match="`method` must be 'gap' or 'prediction'"):
        rankwise.correct_age_bias([1.0], [1.0], fit_pred=[3.0, 4.0], fit_age=[5.0, 6.0], method="cole")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"slope .* is 0"):
        rankwise.correct_age_bias([1.0], [1.0], fit_pred=[3.0, 3.0], fit_age=[5.0, 6.0], method="prediction")
    with pytest.raises(ValueError, match="`pred` and `age` must have the same number"):
        rankwise.correct_age_bias([1.0, 2.0], [1.0], fit_pred=[3.0, 4.0], fit_age=[5.0, 6.0])
    with pytest.raises(ValueError, match="`fit_pred` must be finite"):
        rankwise.correct_age_bias([1.0], [1.0], fit_pred=[np.nan, 4.0], fit_age=[5.0, 6.0])


def test_metrics_match_numpy_and_scipy() -> None:
    from scipy import stats

    age, pred = _cohort(3, 50)
    m = brain_age_metrics(pred, age, corrected=pred - 0.5)
    err = pred - age
    assert m["mae"] == pytest.approx(np.abs(err).mean())
    assert m["rmse"] == pytest.approx(np.sqrt((err**2).mean()))
    assert m["pearson"] == pytest.approx(stats.pearsonr(pred, age)[0])
    assert m["spearman"] == pytest.approx(stats.spearmanr(pred, age)[0])
    assert m["r2"] == pytest.approx(1 - (err**2).sum() / ((age - age.mean()) ** 2).sum())
    assert m["bag_sd"] == pytest.approx(err.std(ddof=1)) and m["bag_mean"] == pytest.approx(err.mean())
    assert m["corr_bag_age"] == pytest.approx(stats.pearsonr(err, age)[0])
    assert m["corrected"]["bag_mean"] == pytest.approx(err.mean() - 0.5)
    d = (age // 10 * 10).astype(int)
    assert m["mae_by_decade"]["40-49"] == pytest.approx(np.abs(err[d == 40]).mean())
    assert sum(m["mae_by_decade"].values()) > 0 and m["n"] == 50
