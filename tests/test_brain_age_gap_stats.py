import math

import numpy as np
import pytest
from scipy.stats import mannwhitneyu, norm, ttest_ind
from sklearn.metrics import roc_auc_score

from rankwise.brain_age import gap_by_group, gap_by_site


def _shifted(delta: float, n: int = 2000):
    rng = np.random.default_rng(0)
    hc = rng.normal(0.0, 1.0, n)
    pt = rng.normal(delta, 1.0, n)
    gap = np.concatenate([hc, pt])
    groups = np.array(["hc"] * n + ["patient"] * n, dtype=object)
    return gap, groups, hc, pt


@pytest.mark.parametrize("delta", [0.0, 0.5, 1.5])
def test_shifted_group_known_d_and_auc(delta):
    gap, groups, hc, pt = _shifted(delta)
    row = gap_by_group(gap, groups, reference="hc")["patient"]
    # sampling error of d and AUC with n=2000 per group is about 0.03 and 0.01
    assert row["d"] == pytest.approx(delta, abs=0.1)
    assert row["auc"] == pytest.approx(norm.cdf(delta / math.sqrt(2)), abs=0.03)
    y = np.r_[np.zeros(hc.size), np.ones(pt.size)]
    assert row["auc"] == pytest.approx(roc_auc_score(y, np.r_[hc, pt]), abs=1e-12)
    assert row["p_welch"] == pytest.approx(ttest_ind(pt, hc, equal_var=False).pvalue, rel=1e-12, abs=1e-300)
    assert row["p_mannwhitney"] == pytest.approx(mannwhitneyu(pt, hc).pvalue, rel=1e-12, abs=1e-300)
    sp = math.sqrt((pt.var(ddof=1) + hc.var(ddof=1)) / 2)
    assert row["d"] == pytest.approx((pt.mean() - hc.mean()) / sp, rel=1e-12)
    assert row["n"] == 2000 and row["mean"] == pytest.approx(pt.mean())


def test_ties_auc_matches_sklearn_and_default_reference():
    gap = np.array([1.0, 1.0, 2.0, 1.0, 2.0, 3.0])
    groups = ["b", "b", "b", "a", "a", "a"]
    t = gap_by_group(gap, groups)
    assert "d" not in t["a"]  # the default reference is the first sorted group
    y = [1, 1, 1, 0, 0, 0]
    assert t["b"]["auc"] == pytest.approx(roc_auc_score(y, gap))


def test_group_of_one_and_zero_spread():
    t = gap_by_group([0.0, 1.0, 2.0, 5.0], ["hc", "hc", "hc", "x"], reference="hc")
    assert math.isnan(t["x"]["d"]) and math.isnan(t["x"]["p_welch"]) and math.isnan(t["x"]["sd"])
    assert t["x"]["auc"] == 1.0 and 0 < t["x"]["p_mannwhitney"] <= 1
    flat = gap_by_group([1.0, 1.0, 1.0, 1.0], ["a", "a", "b", "b"])
    assert math.isnan(flat["b"]["d"]) and flat["b"]["auc"] == 0.5


def test_gap_by_site():
    gap = np.array([1.0, 3.0, -2.0, 0.5])
    t = gap_by_site(gap, np.array(["s2", "s2", "s1", "s3"]))
    assert list(t) == ["s1", "s2", "s3"]
    assert t["s2"] == {"n": 2, "mean": 2.0, "sd": pytest.approx(math.sqrt(2))}
    assert math.isnan(t["s1"]["sd"])
    one = gap_by_site(gap, ["only"] * 4)
    assert one["only"]["n"] == 4 and one["only"]["mean"] == pytest.approx(gap.mean())


def test_refusals():
    with pytest.raises(ValueError, match="`gap`"):
        gap_by_site([1.0, math.nan], ["a", "b"])
    with pytest.raises(ValueError, match="`gap`"):
        gap_by_group([math.nan, 1.0], ["a", "b"])
    with pytest.raises(ValueError, match="`sites`"):
        gap_by_site([1.0, 2.0], ["a"])
    with pytest.raises(ValueError, match="`groups`"):
        gap_by_group([1.0, 2.0], ["a", "b", "c"])
    with pytest.raises(ValueError, match="`reference`"):
        gap_by_group([1.0, 2.0], ["a", "b"], reference="zz")
    with pytest.raises(ValueError, match="`gap`"):
        gap_by_site([], [])
