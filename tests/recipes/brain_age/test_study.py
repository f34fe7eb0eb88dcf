"""A brain-age study's tables (:mod:`rankwise.recipes.brain_age.study`): the gap per site and per group,
ComBat fitted on the training split, the synthetic patients whose brains look older, and one short run."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from rankwise.brain_age import combat_fit, correct_age_bias, gap_by_group, gap_by_site
from rankwise.recipes.brain_age.study import check_study, study_metrics, write_study_report
from rankwise.recipes.config import ConfigError, StudyConfig


def _fake_run(tmp_path: Path, rows: list[dict[str, str]], splits: list[str], **study: Any) -> Any:
    """A run whose data are the CSV ``rows`` (no volumes: the study reads only the CSV and the sexes)."""
    path = tmp_path / "cohort.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    meta: dict[str, Any] = {"source": str(path)}
    data = SimpleNamespace(meta=meta)
    for s in ("train", "val", "test"):
        idx = [i for i, sp in enumerate(splits) if sp == s]
        meta[f"{s}_rows"] = [i + 2 for i in idx]  # CSV lines: the header is line 1
        setattr(data, s, SimpleNamespace(sex=np.array([int(rows[i].get("sex", "0") == "M") for i in idx])))
    cfg = SimpleNamespace(study=StudyConfig(**study), run=SimpleNamespace(name="fake", seed=0))
    return SimpleNamespace(cfg=cfg, data=data, results=tmp_path)


def _cohort(rng: np.random.Generator, n: int) -> tuple[list[dict[str, str]], list[str], np.ndarray, np.ndarray]:
    site = rng.integers(0, 3, n)
    group = rng.random(n) < 0.3
    age = rng.uniform(20, 80, n)
    rows = [
        {"path": f"s{i}.nii.gz", "age": f"{age[i]:.3f}", "sex": "MF"[i % 2], "site": f"site{site[i]}"}
        | {"group": "patient" if group[i] else "control"}
        for i in range(n)
    ]
    splits = list(np.array(["train", "val", "test"])[rng.choice(3, n, p=[0.6, 0.2, 0.2])])
    # shrunk predictions, a site offset (site2 +4 years) and the patients 5 years older
    pred = 0.7 * age + 15 + np.where(site == 2, 4.0, 0.0) + 5.0 * group + rng.normal(0, 2, n)
    return rows, splits, age, pred


def _same(table: dict[str, Any], ref: dict[Any, Any]) -> None:
    assert set(table) == {str(k) for k in ref}
    for k, row in ref.items():
        assert table[str(k)] == pytest.approx(row)


def _split(splits: list[str], x: np.ndarray, s: str) -> np.ndarray:
    return x[np.array(splits) == s]


def test_site_and_group_tables_are_those_of_the_bias_corrected_test_gap(tmp_path: Path) -> None:
    rows, splits, age, pred = _cohort(np.random.default_rng(0), 300)
    run = _fake_run(tmp_path, rows, splits, group_column="group")
    check_study(run)
    va, vp, ta, tp = (_split(splits, v, s) for s in ("val", "test") for v in (age, pred))
    study = study_metrics(run, lambda: pytest.fail("no ComBat, no training predictions"), (vp, va), (tp, ta))
    assert study is not None and study["gap"] == "gap_corrected_gap" and study["reference_group"] == "control"
    gap = correct_age_bias(tp, ta, fit_pred=vp, fit_age=va) - ta
    test_rows = [r for r, s in zip(rows, splits) if s == "test"]
    _same(study["sites"], gap_by_site(gap, [r["site"] for r in test_rows]))
    groups = gap_by_group(gap, [r["group"] for r in test_rows], reference="control")
    assert study["groups"]["patient"] == pytest.approx(groups["patient"])
    assert study["groups"]["patient"]["auc"] > 0.8  # the patients' gap is 5 years larger
    assert study["sites"]["site2"]["mean"] > study["sites"]["site0"]["mean"] + 2
    text = write_study_report(run, {"test": {"mae": 1.0}, "study": study}).read_text()
    assert "## Gap per site (`site`)" in text and "| control (reference) |" in text and "| patient |" in text
    json.dumps(study, allow_nan=False)  # JSON-ready: no NaN


def test_combat_is_fitted_on_the_training_split_and_removes_the_site_offset(tmp_path: Path) -> None:
    rows, splits, age, pred = _cohort(np.random.default_rng(1), 400)
    run = _fake_run(tmp_path, rows, splits, group_column="group", harmonize="combat")
    check_study(run)
    va, vp, ta, tp = (_split(splits, v, s) for s in ("val", "test") for v in (age, pred))
    tra, trp = _split(splits, age, "train"), _split(splits, pred, "train")
    calls = []

    def train() -> tuple[np.ndarray, np.ndarray]:
        calls.append(1)
        return trp, tra

    study = study_metrics(run, train, (vp, va), (tp, ta))
    assert calls == [1] and study is not None
    assert study["combat"]["fitted_on"] == "train"
    assert study["combat"]["covariates"] == ["age", "sex", "group=patient"]
    # the same harmonisation by hand: ComBat on the training gaps, applied to val/test, then the bias correction
    sites = {s: [r["site"] for r, sp in zip(rows, splits) if sp == s] for s in ("train", "val", "test")}

    def cov(s: str) -> np.ndarray:
        sel = [r for r, sp in zip(rows, splits) if sp == s]
        return np.stack(
            [
                _split(splits, age, s),
                [float(r["sex"] == "M") for r in sel],
                [float(r["group"] == "patient") for r in sel],
            ],
            axis=1,
        )

    fit = combat_fit(trp - tra, sites["train"], covariates=cov("train"), eb=False)
    hv = va + fit.apply(vp - va, sites["val"], covariates=cov("val"))
    ht = ta + fit.apply(tp - ta, sites["test"], covariates=cov("test"))
    gap = correct_age_bias(ht, ta, fit_pred=hv, fit_age=va) - ta
    _same(study["sites"], gap_by_site(gap, sites["test"]))
    before, after = study["sites_unharmonized"], study["sites"]
    assert before["site2"]["mean"] - before["site0"]["mean"] > 2
    assert abs(after["site2"]["mean"] - after["site0"]["mean"]) < 1.5
    assert study["groups"]["patient"]["auc"] > 0.8  # the group covariate is kept
    assert "Before harmonisation:" in write_study_report(run, {"test": {}, "study": study}).read_text()


def test_a_cohort_without_sites_or_groups_has_no_study(tmp_path: Path) -> None:
    rows = [{"path": f"s{i}.nii.gz", "age": "50"} for i in range(6)]
    run = _fake_run(tmp_path, rows, ["train"] * 4 + ["val", "test"])
    check_study(run)
    assert study_metrics(run, list, (np.ones(1), np.ones(1)), (np.ones(1), np.ones(1))) is None


def test_study_options_are_checked_before_training(tmp_path: Path) -> None:
    rows, splits, *_ = _cohort(np.random.default_rng(2), 60)
    with pytest.raises(ConfigError, match=r"`study.group_column` is 'dx', which .*cohort.csv lacks"):
        check_study(_fake_run(tmp_path, rows, splits, group_column="dx"))
    with pytest.raises(ConfigError, match=r"`study.reference_group` 'healthy' has no test subject"):
        check_study(_fake_run(tmp_path, rows, splits, group_column="group", reference_group="healthy"))
    rows2 = [r | {"site": "site9"} if s == "test" else r for r, s in zip(rows, splits)]
    with pytest.raises(ConfigError, match=r"no subject of the test sites \['site9'\]"):
        check_study(_fake_run(tmp_path, rows2, splits, harmonize="combat"))
    lone = [r | {"site": "lone"} if i == splits.index("train") else r for i, r in enumerate(rows)]
    with pytest.raises(ConfigError, match=r"sites \['lone'\] have fewer than 2"):
        check_study(_fake_run(tmp_path, lone, splits, harmonize="combat"))
    empty = [r | {"site": ""} if i == splits.index("val") else r for i, r in enumerate(rows)]
    with pytest.raises(ConfigError, match=r"some val rows have an empty `site`"):
        check_study(_fake_run(tmp_path, empty, splits, harmonize="combat"))
    no_site = [{k: v for k, v in r.items() if k != "site"} for r in rows]
    with pytest.raises(ConfigError, match=r"`study\.harmonize: combat` needs sites"):
        check_study(_fake_run(tmp_path, no_site, splits, harmonize="combat"))


def test_the_synthetic_patients_have_older_looking_brains(tmp_path: Path) -> None:
    pytest.importorskip("nilearn")
    pytest.importorskip("torchio")
    nib = pytest.importorskip("nibabel")
    from rankwise.data import make_brain_age_synthetic

    plain = make_brain_age_synthetic(tmp_path / "plain", n=8, spacing=8.0)
    sick = make_brain_age_synthetic(tmp_path / "sick", n=8, spacing=8.0, patients=0.25, patient_shift=10.0)
    a, b = list(csv.DictReader(plain.open())), list(csv.DictReader(sick.open()))
    assert list(a[0]) == ["path", "age", "sex", "site", "subject"]
    assert list(b[0]) == ["path", "age", "sex", "site", "subject", "group"]
    assert [r["group"] for r in b].count("patient") == 2
    for ra, rb in zip(a, b):
        assert {k: ra[k] for k in ("age", "sex", "site")} == {k: rb[k] for k in ("age", "sex", "site")}
        va = np.asarray(nib.load(str(plain.parent / ra["path"])).dataobj)
        vb = np.asarray(nib.load(str(sick.parent / rb["path"])).dataobj)
        assert np.array_equal(va, vb) == (rb["group"] == "control")
    for bad, match in (
        ({"patients": 1.0}, "`patients` must be a fraction"),
        ({"patient_shift": 99}, "`patient_shift`"),
    ):
        with pytest.raises(ValueError, match=match):
            make_brain_age_synthetic(tmp_path / "bad", n=2, spacing=8.0, **bad)


def test_study_options_that_contradict_each_other_are_refused() -> None:
    from rankwise.recipes import load_config

    with pytest.raises(ConfigError, match=r"`study\.reference_group` names a group of `study\.group_column`"):
        load_config("brain_age_tsan_synthetic", ["study.reference_group=HC"])
    with pytest.raises(ConfigError, match=r"`study\.harmonize: combat` harmonises across the sites"):
        load_config("brain_age_tsan_synthetic", ["study.harmonize=combat", "study.site_column=null"])
    cfg = load_config("brain_age_tsan_synthetic", ["study.group_column=dx", "study.reference_group=HC"])
    assert (cfg.study.group_column, cfg.study.reference_group, cfg.study.harmonize) == ("dx", "HC", "none")
