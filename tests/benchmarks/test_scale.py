"""The brain-age loader case of ``benchmarks/scale.py`` at toy size."""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pytest

from tests.benchmarks._scripts import import_script


@pytest.fixture(scope="module")
def bench():
    module = import_script("scale", "scale_bench")
    yield module
    sys.modules.pop("scale_bench", None)


def test_replicated_volumes_are_distinct_cache_entries(bench, tmp_path):
    nib = pytest.importorskip("nibabel")
    pytest.importorskip("torchio")
    from rankwise.data.nifti import load_nifti_csv
    from rankwise.data.synthetic_mri import make_brain_age_synthetic

    csv = make_brain_age_synthetic(tmp_path / "cohort", n=2, spacing=8.0, seed=0)
    big = bench._replicate_cohort(csv, 5)
    lines = big.read_text().splitlines()
    assert len(lines) == 6
    paths = [csv.parent / line.split(",")[0] for line in lines[1:]]
    assert len({p.read_bytes() for p in paths}) == 5  # byte-distinct: five cache keys
    first, copy = (np.asarray(nib.load(p).dataobj) for p in (paths[0], paths[2]))
    np.testing.assert_array_equal(first, copy)  # the same voxels
    subjects = sorted(line.split(",")[-1] for line in lines[1:])
    assert subjects == ["sub-0001"] * 3 + ["sub-0002"] * 2  # a copy stays its original's subject
    data = load_nifti_csv(str(big), cache_dir=str(tmp_path / "cache"))
    assert len(data.train) + len(data.val) + len(data.test) == 5
    assert len(list((tmp_path / "cache").rglob("*.npy"))) == 5


def test_loader_case_reports_volumes_per_second(bench, tmp_path):
    pytest.importorskip("nibabel")
    pytest.importorskip("torchio")
    args = argparse.Namespace(
        cohort=6,
        cohort_distinct=3,
        cohort_spacing=8.0,
        cohort_csv=None,
        loader_workers="0,1",
        loader_batches="2",
        step_batches="",
        step_repeats=1,
    )
    res = bench.bench_loader(args, tmp_path)
    assert res["volumes"] == 6 and res["distinct_volumes"] == 3
    assert [(r["workers"], r["batch"]) for r in res["rates"]] == [(0, 2), (1, 2)]
    for rate in res["rates"]:
        assert rate["volumes"] == rate["batch"] * (res["train"] // rate["batch"])
        assert rate["volumes_per_s"] > 0
    assert not (tmp_path / "cohort").exists() and not (tmp_path / "cache").exists()
    table = bench.markdown({"machine": bench._machine(), "cases": {"loader": res}})
    assert table.count("brain-age training loader from the cache") == 2
