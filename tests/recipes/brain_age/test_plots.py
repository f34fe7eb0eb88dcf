"""The brain-age evaluation plots: their correlations are the one Pearson of ``rankwise._stats`` and an
undefined one (a constant prediction, fewer than two ages) is drawn as ``nan``, never an error."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from rankwise.recipes.brain_age import plots


def test_a_correlation_title_reads_nan_where_it_is_undefined():
    assert plots._r(None, 3) == "nan"
    assert plots._r(0.98765, 2) == "0.99"


@pytest.mark.parametrize(
    ("pred", "age"),
    [
        (np.array([22.0, 29.0, 41.0, 48.0]), np.array([20.0, 30.0, 40.0, 50.0])),
        (np.full(4, 35.0), np.array([20.0, 30.0, 40.0, 50.0])),  # a constant prediction
        (np.array([31.0]), np.array([30.0])),  # one subject
    ],
)
def test_the_plots_are_written_for_any_predictions(tmp_path, pred, age):
    a = plots.plot_pred_vs_age(pred, age, tmp_path / "pred.png", title="t")
    b = plots.plot_bag_vs_age(pred, age, {"gap": pred - 1.0}, tmp_path / "bag.png", title="t")
    assert a.stat().st_size > 0 and b.stat().st_size > 0
