"""``NiftiPreprocessing``: validation, the loaders' two ways of taking it, and its record in a run's data."""

from __future__ import annotations

import dataclasses

import pytest

from rankwise.data import NiftiPreprocessing
from rankwise.data.nifti import PREPROCESSING_OPTIONS


def test_fields_are_the_loaders_preprocessing_options() -> None:
    import inspect

    from rankwise.data.nifti import load_nifti_cohort, load_nifti_csv

    assert PREPROCESSING_OPTIONS == ("shape", "spacing", "resize", "normalize", "cache_dir")
    defaults = NiftiPreprocessing()
    for loader in (load_nifti_csv, load_nifti_cohort):
        params = inspect.signature(loader).parameters
        assert "preprocessing" in params
        for name in PREPROCESSING_OPTIONS:
            assert params[name].default == getattr(defaults, name), (loader.__name__, name)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"shape": [1, 2]}, "shape"),
        ({"shape": [0, 2, 2]}, "shape"),
        ({"shape": "abc"}, "shape"),
        ({"shape": [True, 2, 2]}, "shape"),
        ({"shape": [4096, 4096, 4096]}, "shape"),
        ({"spacing": -1}, "spacing"),
        ({"spacing": [1, 2]}, "spacing"),
        ({"spacing": float("nan")}, "spacing"),
        ({"resize": "pad"}, "resize"),
        ({"normalize": "minmax"}, "normalize"),
        ({"cache_dir": 3}, "cache_dir"),
    ],
)
def test_a_bad_field_is_a_value_error_naming_it(options, field) -> None:
    with pytest.raises(ValueError, match=f"^`{field}`"):
        NiftiPreprocessing(**options)


def test_values_are_normalised_and_round_trip_through_json(tmp_path) -> None:
    import json

    prep = NiftiPreprocessing(shape=[8, 9, 10], spacing=[2, 2, 3], resize="resample", cache_dir=tmp_path)
    assert prep.shape == (8, 9, 10) and prep.spacing == (2.0, 2.0, 3.0) and prep.cache_dir == str(tmp_path)
    assert prep.cache == tmp_path
    back = NiftiPreprocessing.from_dict(json.loads(json.dumps(prep.to_dict())))
    assert back == prep and hash(back) == hash(prep)
    assert NiftiPreprocessing(spacing=2).spacing == 2.0 and NiftiPreprocessing(cache_dir="").cache_dir is None
    with pytest.raises(ValueError, match=r"unknown NiftiPreprocessing field.*'grid'"):
        NiftiPreprocessing.from_dict({"grid": [1, 2, 3]})
    with pytest.raises(dataclasses.FrozenInstanceError):
        prep.shape = (1, 1, 1)  # type: ignore[misc]


def test_whole_or_as_options_but_not_both(tmp_path) -> None:
    prep = NiftiPreprocessing(shape=[8, 9, 10])
    assert NiftiPreprocessing.of(prep) is prep
    assert NiftiPreprocessing.of(prep.to_dict()) == prep
    assert NiftiPreprocessing.of(None, shape=[8, 9, 10]) == prep
    assert NiftiPreprocessing.of(prep, resize="crop_or_pad") is prep  # a default is no conflict
    with pytest.raises(ValueError, match=r"either whole .* not both .*`spacing`"):
        NiftiPreprocessing.of(prep, spacing=2)
    with pytest.raises(TypeError, match="`preprocessing` must be a NiftiPreprocessing"):
        NiftiPreprocessing.of([8, 9, 10])  # type: ignore[arg-type]


def test_loaders_take_it_whole_and_record_it_in_the_meta(tmp_path) -> None:
    pytest.importorskip("nibabel")
    pytest.importorskip("nilearn")
    from rankwise.data import get_dataset, load_nifti_csv
    from rankwise.data.nifti import load_nifti_cohort
    from rankwise.data.synthetic_mri import make_brain_age_synthetic

    src = make_brain_age_synthetic(tmp_path / "cohort", n=10, spacing=8.0, seed=1)
    prep = NiftiPreprocessing(shape=[20, 24, 20], cache_dir=str(tmp_path / "cache"))
    whole = load_nifti_csv(str(src), preprocessing=prep)
    apart = get_dataset("nifti", csv=str(src), shape=[20, 24, 20], cache_dir=str(tmp_path / "cache"))
    assert whole.meta["preprocessing"] == apart.meta["preprocessing"] == prep.to_dict()
    assert NiftiPreprocessing.from_dict(whole.meta["preprocessing"]) == prep
    assert whole.meta["shape"] == [20, 24, 20] and whole.modality == "volumes"
    cohort = load_nifti_cohort(src, preprocessing=whole.meta["preprocessing"], grid=whole.meta["shape"])
    assert cohort.meta["preprocessing"] == prep.to_dict() and cohort.meta["shape"] == [20, 24, 20]
    with pytest.raises(ValueError, match="not both"):
        load_nifti_csv(str(src), preprocessing=prep, normalize="none")
