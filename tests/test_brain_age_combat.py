"""ComBat (:func:`rankwise.brain_age.combat_fit`): parity with neuroCombat, out-of-sample application.

``reference/combat_reference.npz`` holds neuroCombat 0.2.12's fits (``tools/combat_reference.py``); the
live comparison runs when the peer is installed (tests/peers.txt).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pytest

from rankwise.brain_age import combat_fit

REFERENCE = Path(__file__).parent / "reference" / "combat_reference.npz"


def _ref() -> dict[str, np.ndarray]:
    with np.load(REFERENCE, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("eb", [True, False])
def test_training_fit_matches_neurocombat(eb: bool) -> None:
    r = _ref()
    cov = np.stack([r["sex"], r["age"]], axis=1)  # sex: one indicator column, as neuroCombat's categorical
    fit = combat_fit(r["data"], r["sites"], covariates=cov, eb=eb)
    tag = "eb" if eb else "ls"
    np.testing.assert_allclose(fit.apply(r["data"], r["sites"], covariates=cov), r[f"{tag}_harmonized"], atol=1e-6)
    np.testing.assert_allclose(fit.gamma, r[f"{tag}_gamma"], atol=1e-6)
    np.testing.assert_allclose(fit.delta, r[f"{tag}_delta"], atol=1e-6)


def test_live_neurocombat_parity() -> None:
    pd = pytest.importorskip("pandas")
    neurocombat = pytest.importorskip("neuroCombat")
    rng = np.random.default_rng(3)
    sites = np.repeat(np.array(["x", "y", "z", "w"]), [12, 20, 15, 9])
    age = np.round(rng.uniform(10, 90, sites.size) * 4) / 4
    y = rng.normal(size=(sites.size, 4)) * np.where(sites == "y", 0.5, 1.0)[:, None] + 0.1 * age[:, None]
    with contextlib.redirect_stdout(io.StringIO()):
        ref = neurocombat.neuroCombat(y.T.copy(), pd.DataFrame({"s": sites, "age": age}), "s", continuous_cols=["age"])
    fit = combat_fit(y, sites, covariates=age)
    np.testing.assert_allclose(fit.apply(y, sites, covariates=age), np.asarray(ref["data"]).T, atol=1e-6)


def _cohort(rng: np.random.Generator, n_per: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    sites = np.repeat(np.array(["a", "b", "c"]), n_per)
    age = rng.uniform(20, 80, sites.size)
    shift = np.select([sites == "b", sites == "c"], [3.0, -2.0], 0.0)
    scale = np.select([sites == "b", sites == "c"], [2.0, 0.5], 1.0)
    y = 0.1 * age + shift + scale * rng.normal(size=sites.size)
    return y, sites, age


def test_applied_to_new_subjects_removes_site_effects_and_keeps_covariates() -> None:
    rng = np.random.default_rng(0)
    y, sites, age = _cohort(rng, 200)
    fit = combat_fit(y, sites, covariates=age, eb=False)
    y2, sites2, age2 = _cohort(rng, 200)  # new subjects of the same sites
    h = fit.apply(y2, sites2, covariates=age2)
    assert h.shape == y2.shape
    resid = h - 0.1 * age2
    means = [resid[sites2 == s].mean() for s in "abc"]
    sds = [resid[sites2 == s].std() for s in "abc"]
    raw_means = [(y2 - 0.1 * age2)[sites2 == s].mean() for s in "abc"]
    assert np.ptp(raw_means) > 4.0 and np.ptp(means) < 0.5
    assert np.ptp(sds) < 0.3 * np.mean(sds)
    slope = np.polyfit(age2, h, 1)[0]
    assert slope == pytest.approx(0.1, abs=0.02)  # the age effect survives the harmonisation


def test_apply_on_the_fitted_subjects_is_the_fit_and_eb_shrinks() -> None:
    rng = np.random.default_rng(1)
    feats = np.stack([_cohort(rng, 30)[0] for _ in range(5)], axis=1)
    sites = np.repeat(np.array(["a", "b", "c"]), 30)
    eb, ls = combat_fit(feats, sites), combat_fit(feats, sites, eb=False)
    np.testing.assert_array_equal(ls.gamma, ls.gamma_hat)
    # shrinkage: the EB additive effects lie between the per-feature estimates and their site mean
    dev_eb = np.abs(eb.gamma - eb.gamma_hat.mean(axis=1, keepdims=True))
    dev_ls = np.abs(eb.gamma_hat - eb.gamma_hat.mean(axis=1, keepdims=True))
    assert (dev_eb <= dev_ls + 1e-12).all()


def test_refusals() -> None:
    y = np.arange(10.0)
    sites = np.array(list("aaaaabbbbb"))
    with pytest.raises(ValueError, match="at least 2 features"):
        combat_fit(y, sites)
    with pytest.raises(ValueError, match=r"\['c'\] have 1"):
        combat_fit(y[:6], np.array(list("aaabbc")), eb=False)
    fit = combat_fit(y + np.sin(y), sites, eb=False)
    with pytest.raises(ValueError, match=r"\['z'\] were not in the fitted data"):
        fit.apply(y[:2], ["a", "z"])
    with pytest.raises(ValueError, match="rank-deficient"):
        combat_fit(y, sites, covariates=np.ones(10), eb=False)
    with pytest.raises(ValueError, match="one row per subject"):
        combat_fit(y, sites, covariates=np.ones(3), eb=False)
    with pytest.raises(TypeError, match="real numbers"):
        combat_fit(np.array(["x"] * 10), sites, eb=False)
