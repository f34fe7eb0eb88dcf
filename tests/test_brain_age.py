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
    with pytest.raises(ValueError, match=r"`fit_age` varies by 0 only .*the fitted line is not determined"):
        rankwise.correct_age_bias([1.0], [1.0], fit_pred=[3.0, 4.0], fit_age=[5.0, 5.0])
    with pytest.raises(ValueError, match="`method` must be 'gap' or 'prediction'"):
        rankwise.correct_age_bias([1.0], [1.0], fit_pred=[3.0, 4.0], fit_age=[5.0, 6.0], method="cole")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`fit_pred` varies by 0 only .*no age signal"):
        rankwise.correct_age_bias([1.0], [1.0], fit_pred=[3.0, 3.0], fit_age=[5.0, 6.0], method="prediction")
    with pytest.raises(ValueError, match="`pred` and `age` must have the same number"):
        rankwise.correct_age_bias([1.0, 2.0], [1.0], fit_pred=[3.0, 4.0], fit_age=[5.0, 6.0])
    with pytest.raises(ValueError, match="`fit_pred` must be finite"):
        rankwise.correct_age_bias([1.0], [1.0], fit_pred=[np.nan, 4.0], fit_age=[5.0, 6.0])


def test_a_degenerate_fit_is_refused_with_its_reason() -> None:
    rng = np.random.default_rng(0)
    fit_age, age = rng.uniform(20, 90, 40), rng.uniform(20, 90, 10)
    flat = {"fit_pred": 50 + rng.uniform(0, 1e-6, 40), "fit_age": fit_age}
    for method in ("gap", "prediction"):  # float rounding is no age signal
        with pytest.raises(ValueError, match=r"`fit_pred` varies by \d\.\d+e-07 only .*no age signal"):
            rankwise.correct_age_bias(50 + rng.uniform(0, 1e-6, 10), age, **flat, method=method)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`fit_age` varies by 1e-09 only \(values up to 50"):
        rankwise.correct_age_bias(
            [40.0, 60.0], [40.0, 60.0], fit_pred=[49.0, 51, 50, 52], fit_age=50 + np.array([0, 1e-9, 5e-10, 1e-9])
        )
    noise = 50 + rng.normal(0, 3, 40)  # predictions unrelated to age: dividing by the slope magnifies noise
    with pytest.raises(ValueError, match=r"slope of `fit_pred` on `fit_age`, .* \+- .* is not distinguishable from 0"):
        rankwise.correct_age_bias([50.0], [50.0], fit_pred=noise, fit_age=fit_age, method="prediction")
    out = rankwise.correct_age_bias([50.0], [50.0], fit_pred=noise, fit_age=fit_age, method="gap")  # well defined
    assert np.isfinite(out).all()


def test_non_numbers_are_a_type_error() -> None:
    for bad in (["45"], [True, 30.0], np.array([True, False]), np.array(["45"]), torch.tensor([True]), [[1.0], 2.0]):
        with pytest.raises(TypeError, match="`fit_age` must be a tensor or array of real numbers, got "):
            rankwise.correct_age_bias([1.0], [1.0], fit_pred=[3.0, 4.0], fit_age=bad)
    with pytest.raises(TypeError, match="`age` must be"):
        brain_age_metrics([30.0], ["30"])
    out = rankwise.correct_age_bias(
        np.int64(40), 45, fit_pred=[np.float32(30), 45, 61, 70] * 3, fit_age=[25, 40, 60, 80] * 3
    )
    assert np.isfinite(out).all()


def test_a_fit_on_few_subjects_says_how_few() -> None:
    with pytest.warns(rankwise.brain_age.BiasCorrectionWarning, match=r"fitted on only 4 subjects \(fewer than 10\)"):
        rankwise.correct_age_bias([40.0], [45.0], fit_pred=[30.0, 40, 55, 70], fit_age=[25.0, 40, 60, 80])
    age, pred = _cohort(1, 10)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rankwise.correct_age_bias(pred, age, fit_pred=pred, fit_age=age)


def test_the_recipe_says_why_a_correction_is_skipped() -> None:
    pytest.importorskip("lightning")
    from rankwise.recipes.brain_age.recipe import _bias_corrected
    from rankwise.recipes.common import DataDefaultsWarning

    age = np.array([25.0, 40, 60, 80])
    with pytest.warns(DataDefaultsWarning) as caught:
        out = _bias_corrected(np.array([50.0]), np.array([45.0]), 50.0 + np.array([0, 1e-6, 0, 1e-6]), age)
    messages = [str(w.message) for w in caught]
    assert any("no 'gap' bias correction: `fit_pred` varies by 1e-06 only" in m for m in messages), messages
    assert any("no 'prediction' bias correction" in m for m in messages), messages
    assert np.isnan(out["gap"]).all() and np.isnan(out["prediction"]).all()
    with pytest.warns(DataDefaultsWarning) as caught:
        out = _bias_corrected(np.array([50.0]), np.array([45.0]), np.array([30.0, 40, 55, 70]), age)
    messages = [str(w.message) for w in caught]
    assert messages == [
        "the bias correction is fitted on only 4 subjects (fewer than 10): its line is uncertain (the validation set)"
    ]
    assert np.isfinite(out["gap"]).all()


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
