"""Abalone and generic CSV loaders, DIR split rule, label histogram, dataset registry."""

from __future__ import annotations

import collections
import zipfile

import numpy as np
import pytest
import torch

from rankwise.data import (
    DataFormatError,
    RegressionData,
    dataset_info,
    dir_split,
    get_dataset,
    label_bins,
    label_histogram,
    list_datasets,
    load_abalone,
    load_csv,
)

pytest.importorskip("sklego")


def _shots(train_labels: np.ndarray, labels: np.ndarray) -> dict[str, int]:
    counts = collections.Counter(train_labels.tolist())
    out = {"many": 0, "medium": 0, "few": 0}
    for y in labels.tolist():
        c = counts.get(y, 0)
        out["many" if c > 100 else "few" if c < 20 else "medium"] += 1
    return out


@pytest.fixture(scope="module")
def abalone() -> RegressionData:
    return load_abalone()


def test_abalone_sizes_dtypes(abalone: RegressionData) -> None:
    d = abalone
    assert d.sizes() == (3813, 182, 182)
    assert sum(d.sizes()) == 4177
    assert (len(d.train), len(d.val), len(d.test)) == d.sizes()
    assert d.modality == "table" and d.input_dim == 10 and d.bin_width == 1.0 and d.label_name == "age"
    x, y = d.train[0]
    assert x.shape == (10,) and x.dtype == torch.float32
    assert y.shape == () and y.dtype == torch.float32
    for lab in (d.train_labels, d.val_labels, d.test_labels):
        assert lab.dtype == np.float64 and lab.ndim == 1
    # age = rings + 1.5, rings 1..29
    all_ages = np.concatenate([d.train_labels, d.val_labels, d.test_labels])
    assert all_ages.min() == 2.5 and all_ages.max() == 30.5
    assert np.allclose(all_ages - 1.5, np.round(all_ages - 1.5))
    # items agree with the label arrays
    ys = torch.stack([d.test[i][1] for i in range(len(d.test))]).numpy()
    np.testing.assert_allclose(ys, d.test_labels, rtol=0, atol=1e-6)


def test_abalone_features_standardized_on_train(abalone: RegressionData) -> None:
    x = abalone.train.x.double()  # type: ignore[attr-defined]
    assert torch.allclose(x[:, 3:].mean(0), torch.zeros(7, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(x[:, 3:].std(0, unbiased=False), torch.ones(7, dtype=torch.float64), atol=1e-4)
    onehot = x[:, :3]
    assert set(onehot.unique().tolist()) == {0.0, 1.0}
    assert torch.equal(onehot.sum(1), torch.ones(len(x), dtype=torch.float64))
    assert abalone.meta["feature_names"][:3] == ["sex_F", "sex_I", "sex_M"]


def test_abalone_split_rule_and_shots(abalone: RegressionData) -> None:
    d = abalone
    idx = d.meta["indices"]
    tr, va, te = idx["train"], idx["val"], idx["test"]
    assert not set(tr) & set(va) and not set(tr) & set(te) and not set(va) & set(te)
    assert len(set(tr) | set(va) | set(te)) == 4177
    val_counts = collections.Counter(d.val_labels.tolist())
    test_counts = collections.Counter(d.test_labels.tolist())
    assert val_counts == test_counts
    assert max(val_counts.values()) == 10
    assert _shots(d.train_labels, d.test_labels) == {"many": 90, "medium": 60, "few": 32}


def test_abalone_seeded(abalone: RegressionData) -> None:
    again = get_dataset("abalone", seed=0)
    other = get_dataset("abalone", seed=1)
    assert np.array_equal(again.meta["indices"]["test"], abalone.meta["indices"]["test"])
    assert torch.equal(again.train.x, abalone.train.x)  # type: ignore[attr-defined]
    assert not np.array_equal(other.meta["indices"]["test"], abalone.meta["indices"]["test"])
    assert other.sizes() == abalone.sizes()


def test_abalone_per_label_option() -> None:
    d = get_dataset("abalone", per_label=5)
    assert max(collections.Counter(d.test_labels.tolist()).values()) == 5
    assert sum(d.sizes()) == 4177


def _write_abalone(tmp_path, rows: list[str]):
    header = "sex,length,diameter,height,whole_weight,shucked_weight,viscera_weight,shell_weight,rings"
    p = tmp_path / "abalone.csv"
    p.write_text("\n".join([header, *rows]) + "\n")
    return p


def test_abalone_bad_rows_name_file_and_row(tmp_path) -> None:
    good = "M,0.4,0.3,0.1,0.5,0.2,0.1,0.15,9"
    p = _write_abalone(tmp_path, [good, good, "X,0.4,0.3,0.1,0.5,0.2,0.1,0.15,9"])
    with pytest.raises(DataFormatError, match=r"abalone\.csv, row 4: column 'sex'"):
        load_abalone(path=p)
    p = _write_abalone(tmp_path, [good, "F,0.4,abc,0.1,0.5,0.2,0.1,0.15,9"])
    with pytest.raises(DataFormatError, match=r"abalone\.csv, row 3: column 'diameter': cannot parse 'abc'"):
        load_abalone(path=p)
    p = _write_abalone(tmp_path, [good, "F,0.4,0.3,0.1,0.5,0.2,0.1,0.15,"])
    with pytest.raises(DataFormatError, match=r"row 3: missing value in column 'rings'"):
        load_abalone(path=p)
    p = _write_abalone(tmp_path, [good, "F,0.4,0.3"])
    with pytest.raises(DataFormatError, match=r"row 3: expected 9 fields, got 3"):
        load_abalone(path=p)


def test_abalone_from_zip(tmp_path) -> None:
    rows = [f"{'MFI'[i % 3]},0.{i % 9 + 1},0.3,0.1,0.5,0.2,0.1,0.15,{5 + i % 4}" for i in range(40)]
    csv_path = _write_abalone(tmp_path, rows)
    zpath = tmp_path / "ab.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        zf.write(csv_path, "abalone.csv")
    d = load_abalone(path=zpath, per_label=2)
    assert sum(d.sizes()) == 40 and d.sizes()[1] == 8
    assert "ab.zip::abalone.csv" in d.meta["source"]


# ----------------------------------------------------------------------------------------- generic csv


def _write_csv(tmp_path, n: int = 50, name: str = "data.csv"):
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=n), rng.normal(size=n)
    y = np.round(3 * a + rng.normal(size=n) + 10)
    lines = ["a,b,y"] + [f"{a[i]:.6f},{b[i]:.6f},{y[i]:.1f}" for i in range(n)]
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def test_csv_random_split(tmp_path) -> None:
    p = _write_csv(tmp_path)
    d = get_dataset("csv", path=p, target="y", seed=3)
    assert d.sizes() == (35, 5, 10)
    assert d.input_dim == 2 and d.label_name == "y" and d.name == "data"
    idx = d.meta["indices"]
    allidx = np.concatenate([idx["train"], idx["val"], idx["test"]])
    assert sorted(allidx.tolist()) == list(range(50))
    x, y = d.val[0]
    assert x.dtype == torch.float32 and y.shape == () and y.dtype == torch.float32
    d2 = load_csv(p, "y", seed=3)
    assert np.array_equal(d2.test_labels, d.test_labels)
    d3 = load_csv(p, "y", ["b"], split="dir", per_label=2, bin_width=2.0, standardize_features=False)
    assert d3.input_dim == 1 and d3.bin_width == 2.0
    assert max(collections.Counter(label_bins(d3.test_labels, 2.0).tolist()).values()) <= 2


def test_csv_errors(tmp_path) -> None:
    p = tmp_path / "bad.csv"
    p.write_text("a,b,y\n1,2,3\n4,five,6\n")
    with pytest.raises(DataFormatError, match=r"bad\.csv, row 3: column 'b': cannot parse 'five'"):
        load_csv(p, "y")
    p.write_text("a,b,y\n1,2,3\n4,5,\n")
    with pytest.raises(DataFormatError, match=r"bad\.csv, row 3: missing target value in column 'y'"):
        load_csv(p, "y")
    p.write_text("a,b,y\n1,2,3\n4,nan,3\n")
    with pytest.raises(DataFormatError, match=r"row 3: column 'b': value 'nan' is not finite"):
        load_csv(p, "y")
    p.write_text("a,b,y\n1,2,3\n")
    with pytest.raises(ValueError, match=r"`target` must be a column .* got 'z'"):
        load_csv(p, "z")
    with pytest.raises(ValueError, match=r"`features` must be columns .* unknown \['c'\]"):
        load_csv(p, "y", ["c"])
    with pytest.raises(ValueError, match=r"`split` must be one of"):
        load_csv(_write_csv(tmp_path), "y", split="stratified")  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match=r"missing\.csv"):
        load_csv(tmp_path / "missing.csv", "y")


# ----------------------------------------------------------------------------------------- helpers


def test_dir_split_rule() -> None:
    labels = np.repeat(np.arange(6, dtype=np.float64), [1, 2, 3, 8, 40, 200])
    tr, va, te = dir_split(labels, per_label=10, seed=0)
    assert sorted(np.concatenate([tr, va, te]).tolist()) == list(range(len(labels)))
    want = {2.0: 1, 3.0: 2, 4.0: 10, 5.0: 10}  # min(per_label, count // 3)
    assert dict(collections.Counter(labels[va].tolist())) == want
    assert dict(collections.Counter(labels[te].tolist())) == want
    _tr2, va2, te2 = dir_split(labels, per_label=10, seed=0)
    assert np.array_equal(va, va2) and np.array_equal(te, te2)
    with pytest.raises(ValueError, match="`per_label` must be an int >= 0"):
        dir_split(labels, per_label=-1, seed=0)


def test_label_histogram() -> None:
    h = label_histogram(np.array([0.3, 0.31, 0.5, 0.0]), 0.1)
    assert h.counts.tolist() == [1, 0, 0, 2, 0, 1]
    np.testing.assert_allclose(h.edges, np.arange(7) * 0.1)
    h = label_histogram(np.array([]), 1.0)
    assert h.counts.size == 0 and h.edges.size == 0
    assert label_bins(np.array([0.3, 0.7, 2.5]), 0.1).tolist() == [3, 7, 25]
    with pytest.raises(ValueError, match="`bin_width` must be finite and > 0"):
        label_histogram(np.array([1.0]), 0.0)
    with pytest.raises(ValueError, match="`labels` must be finite"):
        label_histogram(np.array([1.0, np.nan]), 1.0)


def test_registry() -> None:
    names = list_datasets()
    assert {"abalone", "csv", "mnist5k", "agedb_dir", "imdb_wiki_dir", "stsb_dir"} <= set(names)
    assert "rings + 1.5" in dataset_info("abalone")
    assert all(len(dataset_info(n)) > 40 for n in names)
    with pytest.raises(ValueError, match=r"unknown dataset 'nope'; expected one of: .*abalone"):
        get_dataset("nope")


def test_abalone_histogram(abalone: RegressionData) -> None:
    h = label_histogram(abalone.train_labels, abalone.bin_width)
    assert h.counts.sum() == 3813 and h.edges[0] == 2.0 and h.edges[-1] == 31.0
    assert h.counts[h.edges[:-1].tolist().index(10.0)] == 669  # age 10.5 (rings 9)


def test_import_is_light() -> None:
    """``import rankwise.data`` / ``rankwise.models`` import no optional dependency."""
    import subprocess
    import sys

    code = (
        "import sys, rankwise.data, rankwise.models; "
        "heavy = ('torchvision', 'sklearn', 'PIL', 'pandas', 'sklego', 'mlxtend', 'lightning'); "
        "print([m for m in sys.modules if m.split('.')[0] in heavy])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
