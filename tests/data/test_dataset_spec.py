"""The one dataset registry: every dataset's :class:`DatasetSpec` and the views of it."""

from __future__ import annotations

import dataclasses

import pytest

from rankwise.data import (
    DATASET_SPECS,
    DATASETS,
    MODALITIES,
    ClassificationData,
    DatasetSpec,
    RankingData,
    RegressionData,
    dataset_spec,
    get_dataset,
    list_datasets,
    modality_of,
    register_dataset,
    task_of,
    update_dataset,
)

#: the modality of every built-in dataset
EXPECTED = {
    "abalone": "table",
    "csv": "table",
    "agedb_dir": "images",
    "imdb_wiki_dir": "images",
    "image_csv": "images",
    "stsb_dir": "text_pairs",
    "nifti": "volumes",
    "letor": "query_lists",
    "ltr_synthetic": "query_lists",
    "mnist5k": "classes",
    "image_folder": "classes",
    "cifar_dir": "classes",
    "topk_synthetic": "classes",
}


@pytest.fixture
def scratch():
    """Names registered by a test, removed after it."""
    names: list[str] = []
    yield names
    for name in names:
        DATASET_SPECS.pop(name)


def test_every_registered_dataset_has_a_spec_with_a_modality() -> None:
    assert list_datasets() == sorted(EXPECTED) == DATASET_SPECS.names()
    for name in list_datasets():
        spec = dataset_spec(name)
        assert isinstance(spec, DatasetSpec) and spec.name == name
        assert spec.modality == EXPECTED[name] and spec.modality in MODALITIES
        assert spec.loader is DATASETS.get(name) is DATASETS[name]
        assert spec.task == {"query_lists": "ranking", "classes": "classification"}.get(spec.modality, "regression")
        assert task_of(name) == spec.task


def test_the_loaded_data_declare_the_spec_s_modality() -> None:
    for name, options, cls in [
        ("abalone", {"seed": 0}, RegressionData),
        ("ltr_synthetic", {"train_queries": 4, "val_queries": 2, "test_queries": 2}, RankingData),
        ("mnist5k", {"source": "sklearn"}, ClassificationData),
    ]:
        try:
            data = get_dataset(name, **options)
        except (ImportError, FileNotFoundError) as e:  # mnist5k's sources are optional packages
            pytest.skip(f"{name}: {e}")
        assert isinstance(data, cls)
        assert modality_of(data) == dataset_spec(name).modality


def test_what_the_recipes_fill_in_is_in_the_spec() -> None:
    from rankwise.recipes import own_data, predict_data

    assert set(own_data.own_datasets()) == {"csv", "image_csv", "nifti"}
    for name, own in own_data.own_datasets().items():
        assert dataset_spec(name).own_data is own
    readers = predict_data.PREDICTION_READERS
    assert readers.names() == ["abalone", "agedb_dir", "csv", "image_csv", "imdb_wiki_dir"]
    for name in readers.names():
        assert readers[name].read is dataset_spec(name).read_new_rows
    assert readers["agedb_dir"].target == dataset_spec("agedb_dir").target_column == "age"
    classes = predict_data.CLASS_PREDICTION_READERS
    assert classes.names() == ["cifar_dir", "image_folder", "mnist5k", "topk_synthetic"]
    assert all(dataset_spec(n).modality == "classes" and classes[n] is dataset_spec(n).read_new_rows for n in classes)
    assert "letor" not in readers and "letor" not in classes and dataset_spec("letor").read_new_rows is None


def test_unknown_names_are_one_error_listing_the_datasets() -> None:
    for lookup in (dataset_spec, DATASETS.get, get_dataset, task_of):
        with pytest.raises(ValueError, match=r"unknown dataset 'abalon'; did you mean 'abalone'\?.*expected one of"):
            lookup("abalon")
    with pytest.raises(ValueError, match="unknown dataset 'nope'"):
        update_dataset("nope", target_column="y")
    from rankwise.recipes.own_data import register_own_data

    with pytest.raises(ValueError, match="unknown dataset 'nope'"):
        register_own_data("nope")


def test_a_new_dataset_registers_its_spec_and_shows_in_every_view(scratch) -> None:
    from rankwise.recipes import predict_data

    def load_tiny(**options):
        return get_dataset("abalone", seed=0)

    register_dataset("tiny", modality="table", description="a tiny table")(load_tiny)
    scratch.append("tiny")
    assert "tiny" in DATASETS and DATASETS.get("tiny") is load_tiny and "tiny" in list_datasets()
    assert "tiny" not in predict_data.PREDICTION_READERS

    @predict_data.register_prediction_reader("tiny", target="rings")
    def read(run, path):
        raise AssertionError("not called")

    spec = dataset_spec("tiny")
    assert (spec.read_new_rows, spec.target_column, spec.description) == (read, "rings", "a tiny table")
    assert predict_data.PREDICTION_READERS["tiny"] == predict_data.PredictionReader(read, "rings")
    # a second loader under the same name is refused; the same one again keeps what was filled in
    with pytest.raises(ValueError, match="dataset 'tiny' is already registered"):
        register_dataset("tiny", modality="table")(lambda: None)
    register_dataset("tiny", modality="table", description="a tiny table")(load_tiny)
    assert dataset_spec("tiny").read_new_rows is read
    assert predict_data.PREDICTION_READERS.pop("tiny").read is read
    assert "tiny" not in predict_data.PREDICTION_READERS and dataset_spec("tiny").read_new_rows is None
    assert predict_data.PREDICTION_READERS.pop("tiny", "absent") == "absent" and "tiny" in DATASETS
    # the loader view writes into the specs
    DATASETS.register("tiny2")(load_tiny)
    scratch.append("tiny2")
    assert dataset_spec("tiny2").loader is load_tiny and dataset_spec("tiny2").modality is None


def test_a_spec_without_modality_takes_the_loaded_data_s(scratch) -> None:
    data = get_dataset("abalone", seed=0)
    register_dataset("undeclared")(lambda: data)
    scratch.append("undeclared")
    assert dataset_spec("undeclared").modality is None and dataset_spec("undeclared").task is None
    assert task_of("undeclared", data) == "regression"
    with pytest.raises(TypeError, match="declares no dataset modality"):
        task_of("undeclared", object())


def test_bad_specs_and_fields_name_the_argument() -> None:
    with pytest.raises(ValueError, match="`modality` must be one of table, images"):
        DatasetSpec("x", "tables", print)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`loader` must be callable"):
        DatasetSpec("x", "table", None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`name` must be"):
        DatasetSpec("a.b", "table", print)
    with pytest.raises(TypeError, match="cannot set kind of a dataset spec"):
        update_dataset("abalone", kind="x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        dataset_spec("abalone").modality = "images"  # type: ignore[misc]


def test_the_run_checks_the_recipe_against_the_spec_not_the_object_s_attributes(scratch) -> None:
    from types import SimpleNamespace

    from rankwise.recipes.config import ConfigError
    from rankwise.recipes.rundir import check_data

    data = get_dataset("abalone", seed=0)  # a RegressionData, with train_labels
    register_dataset("as_lists", modality="query_lists")(lambda: data)
    scratch.append("as_lists")
    cfg = SimpleNamespace(data=SimpleNamespace(name="as_lists", options={}), trainer=SimpleNamespace(precision="32"))
    with pytest.raises(ConfigError, match=r"`as_lists` is a ranking .*recipe 'dir' needs a regression dataset"):
        check_data(cfg, SimpleNamespace(name="dir", learns="regression"), data)  # type: ignore[arg-type]
    cfg.data.name = "abalone"
    check_data(cfg, SimpleNamespace(name="dir", learns="regression"), data)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="needs a classification dataset, got the regression dataset `abalone`"):
        check_data(cfg, SimpleNamespace(name="supcon", learns="classification"), data)  # type: ignore[arg-type]
