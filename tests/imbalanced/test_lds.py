"""lds_weights / get_lds_kernel_window: exact parity with the DIR reference procedure, generalizations, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwise.imbalanced import bin_labels, get_lds_kernel_window, lds_weights, smooth_bins

ndimage = pytest.importorskip("scipy.ndimage")
windows = pytest.importorskip("scipy.signal.windows")

KERNELS = ["gaussian", "triang", "laplace"]


# ---------------------------------------------------------------- the reference procedure, written out
def ref_window(kernel: str, ks: int, sigma: float) -> np.ndarray:
    half = (ks - 1) // 2
    if kernel == "gaussian":
        delta = np.array([0.0] * half + [1.0] + [0.0] * half)
        w = ndimage.gaussian_filter1d(delta, sigma=sigma)
        return w / w.max()
    if kernel == "triang":
        return windows.triang(ks)
    lap = [np.exp(-abs(x) / sigma) / (2.0 * sigma) for x in np.arange(-half, half + 1)]
    return np.array(lap) / max(lap)


def ref_weights(
    labels,
    reweight: str,
    lds: bool,
    kernel: str = "gaussian",
    ks: int = 5,
    sigma: float = 2.0,
    max_target: int = 121,
    float32: bool = True,
) -> np.ndarray:
    """Literal reference: counts per int label clipped to 0..120, transform, smooth, invert, rescale."""
    value_dict = {x: 0 for x in range(max_target)}
    for label in labels:
        value_dict[min(max_target - 1, int(label))] += 1
    if reweight == "sqrt_inv":
        value_dict = {k: np.sqrt(v) for k, v in value_dict.items()}
    elif reweight == "inverse":
        value_dict = {k: np.clip(v, 5, 1000) for k, v in value_dict.items()}
    num_per_label = [value_dict[min(max_target - 1, int(label))] for label in labels]
    if lds:
        window = ref_window(kernel, ks, sigma)
        smoothed = ndimage.convolve1d(
            np.asarray([v for _, v in value_dict.items()], dtype=float), weights=window, mode="constant"
        )
        num_per_label = [smoothed[min(max_target - 1, int(label))] for label in labels]
    cast = np.float32 if float32 else np.float64
    weights = [cast(1 / x) for x in num_per_label]
    scaling = len(weights) / np.sum(weights)
    return np.array([scaling * x for x in weights], dtype=np.float64)


def agedb_train_ages(shared_dir: Path) -> np.ndarray:
    path = shared_dir / "data" / "agedb-dir" / "agedb.csv"
    if not path.is_file():
        pytest.skip("agedb.csv is absent")
    import csv

    with path.open() as f:
        rows = [r for r in csv.DictReader(f) if r["split"] == "train"]
    return np.array([int(r["age"]) for r in rows])


# ---------------------------------------------------------------- kernel windows
@pytest.mark.parametrize("ks", [1, 3, 5, 7, 9, 15])
@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0, 3.0, 8.0])
@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_window_matches_scipy(kernel: str, ks: int, sigma: float) -> None:
    w = get_lds_kernel_window(kernel, ks, sigma)
    assert w.dtype == torch.float64 and w.shape == (ks,)
    np.testing.assert_allclose(w.numpy(), ref_window(kernel, ks, sigma), rtol=0, atol=1e-15)
    assert float(w.max()) == 1.0


def test_kernel_window_errors() -> None:
    with pytest.raises(ValueError, match="`ks` must be a positive odd int"):
        get_lds_kernel_window("gaussian", 4, 2.0)
    with pytest.raises(TypeError, match="`ks` must be an int"):
        get_lds_kernel_window("gaussian", 5.0, 2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`kernel` must be one of"):
        get_lds_kernel_window("box", 5, 2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`sigma` must be finite and > 0"):
        get_lds_kernel_window("laplace", 5, 0.0)


@pytest.mark.parametrize("mode", ["constant", "reflect"])
def test_smooth_bins_matches_scipy(mode: str) -> None:
    rng = np.random.default_rng(0)
    v = rng.random((9, 3))
    w = get_lds_kernel_window("gaussian", 5, 1.0)
    got = smooth_bins(torch.from_numpy(v), w, mode=mode).numpy()
    scipy_mode = "constant" if mode == "constant" else "mirror"  # torch "reflect" == scipy "mirror"
    np.testing.assert_allclose(got, ndimage.convolve1d(v, w.numpy(), axis=0, mode=scipy_mode), rtol=1e-12)
    # 1-D input, and fewer bins than the half window (reflection repeated)
    np.testing.assert_allclose(smooth_bins(torch.from_numpy(v[:, 0]), w, mode=mode).numpy(), got[:, 0])
    small = rng.random(2)
    np.testing.assert_allclose(
        smooth_bins(torch.from_numpy(small), w, mode=mode).numpy(),
        ndimage.convolve1d(small, w.numpy(), mode=scipy_mode),
        rtol=1e-12,
    )


# ---------------------------------------------------------------- parity with the reference
@pytest.mark.parametrize(
    ("reweight", "lds"), [("sqrt_inv", True), ("sqrt_inv", False), ("inverse", True), ("inverse", False)]
)
@pytest.mark.parametrize("kernel", KERNELS)
def test_agedb_train_ages_match_reference(shared_dir: Path, reweight: str, lds: bool, kernel: str) -> None:
    ages = agedb_train_ages(shared_dir)
    assert len(ages) == 12208
    # the reference's fixed 121 bins; for sqrt_inv the data-driven default bins give the same numbers
    got = lds_weights(ages, reweight=reweight, lds=lds, kernel=kernel, label_range=(0, 121))
    ref32 = ref_weights(ages, reweight, lds, kernel)
    ref64 = ref_weights(ages, reweight, lds, kernel, float32=False)
    assert isinstance(got, np.ndarray) and got.shape == ages.shape
    np.testing.assert_allclose(got, ref64, rtol=1e-12)
    np.testing.assert_allclose(got, ref32, rtol=1e-6)  # the reference rounds 1/x to float32
    assert got.mean() == pytest.approx(1.0, abs=1e-12)
    if reweight == "sqrt_inv":
        np.testing.assert_allclose(lds_weights(ages, reweight=reweight, lds=lds, kernel=kernel), ref64, rtol=1e-12)


def test_agedb_readme_setting_values(shared_dir: Path) -> None:
    """The README command (sqrt_inv, LDS gaussian ks=5 sigma=2): rarer ages get larger weights."""
    ages = agedb_train_ages(shared_dir)
    w = lds_weights(torch.from_numpy(ages), reweight="sqrt_inv", kernel="gaussian", ks=5, sigma=2.0)
    assert w.dtype == torch.get_default_dtype()
    counts = np.bincount(ages)
    young, common = int(np.argmin(np.where(counts > 0, counts, 10**9))), int(np.argmax(counts))
    assert w[torch.from_numpy(ages == young)].min() > w[torch.from_numpy(ages == common)].max()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("reweight", ["sqrt_inv", "inverse"])
def test_synthetic_integer_labels_match_reference(seed: int, reweight: str) -> None:
    rng = np.random.default_rng(seed)
    labels = np.clip(np.round(rng.gamma(2.0, 15.0, size=700)), 0, 130).astype(int)  # includes > 120
    labels[:2] = [0, 120]
    kernel = KERNELS[seed]
    ks, sigma = [(5, 2.0), (3, 1.0), (7, 3.0)][seed]
    ref = ref_weights(labels, reweight, True, kernel, ks, sigma, float32=False)
    got = lds_weights(labels, reweight=reweight, kernel=kernel, ks=ks, sigma=sigma, label_range=(0, 121))
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    # explicit edges 0..121 are the same bins
    got_edges = lds_weights(labels, reweight=reweight, kernel=kernel, ks=ks, sigma=sigma, bins=np.arange(122))
    np.testing.assert_allclose(got_edges, ref, rtol=1e-12)


# ---------------------------------------------------------------- beyond the reference
def test_float_and_negative_labels_and_bin_width() -> None:
    rng = np.random.default_rng(3)
    y = rng.integers(0, 40, size=300)
    base = lds_weights(y)
    np.testing.assert_allclose(lds_weights(y - 100), base, rtol=1e-12)  # negative labels: shift invariant
    np.testing.assert_allclose(lds_weights(y + 0.25), base, rtol=1e-12)  # same bins for y + 0.25
    np.testing.assert_allclose(lds_weights(y * 0.1, bin_width=0.1), base, rtol=1e-12)  # scaled bins
    np.testing.assert_allclose(lds_weights(y * 2.5 - 7.5, bin_width=2.5), base, rtol=1e-12)
    # a wider bin merges labels: weights are constant within each width-4 bin
    w4 = lds_weights(y.astype(float), bin_width=4.0)
    for b in np.unique(y // 4):
        assert np.ptp(w4[y // 4 == b]) == 0


def test_explicit_nonuniform_bins_slow() -> None:
    y = np.array([-3.0, -2.5, -1.0, 0.0, 0.2, 0.7, 5.0, 9.9, 12.0])
    edges = np.array([-5.0, -2.0, 0.0, 1.0, 10.0])
    got = lds_weights(y, bins=edges, reweight="sqrt_inv", kernel="triang", ks=3)
    idx = [min(max(int(np.searchsorted(edges, v, side="right")) - 1, 0), len(edges) - 2) for v in y]
    counts = np.bincount(idx, minlength=len(edges) - 1).astype(float)
    smoothed = ndimage.convolve1d(np.sqrt(counts), windows.triang(3), mode="constant")
    inv = np.array([1.0 / smoothed[i] for i in idx])
    np.testing.assert_allclose(got, inv * len(y) / inv.sum(), rtol=1e-12)
    ix, nb = bin_labels(torch.tensor(y), bins=edges)
    assert nb == 4 and ix.tolist() == idx


def test_output_types_and_mean_one(device: torch.device) -> None:
    y = torch.tensor([3.0, 3.0, 4.0, 9.0, 9.0, 9.0], device=device)
    w = lds_weights(y)
    assert isinstance(w, torch.Tensor) and w.device == y.device and w.dtype == torch.float32
    assert float(w.mean()) == pytest.approx(1.0, abs=1e-6)
    assert lds_weights(y.double()).dtype == torch.float64
    assert lds_weights(y.half()).dtype == torch.float32
    assert lds_weights(y.view(2, 3).long()).shape == (6,)
    np.testing.assert_allclose(lds_weights([3, 3, 4, 9, 9, 9]), w.double().cpu().numpy(), rtol=1e-6)
    assert lds_weights(torch.empty(0)).shape == (0,)
    assert lds_weights(np.zeros(0)).shape == (0,)
    single = lds_weights([7.0])
    np.testing.assert_allclose(single, [1.0])


def test_reweight_none_and_errors() -> None:
    y = [1, 2, 2, 3]
    np.testing.assert_array_equal(lds_weights(y, reweight="none", lds=False), np.ones(4))
    with pytest.raises(ValueError, match="`reweight` must be 'sqrt_inv' or 'inverse' when `lds=True`"):
        lds_weights(y, reweight="none")
    with pytest.raises(ValueError, match="`reweight` must be one of"):
        lds_weights(y, reweight="log")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`bins` must be strictly increasing"):
        lds_weights(y, bins=[0.0, 2.0, 1.0])
    with pytest.raises(ValueError, match="`bin_width` must be finite and > 0"):
        lds_weights(y, bin_width=0.0)
    with pytest.raises(ValueError, match="`label_range` must be"):
        lds_weights(y, label_range=(5, 5))
    with pytest.raises(ValueError, match="`labels` must be finite"):
        lds_weights([1.0, float("nan")])
    with pytest.raises(TypeError, match="`labels` must be a tensor, array or sequence"):
        lds_weights(object())
    with pytest.raises(ValueError, match="`inverse_clip` must be"):
        lds_weights(y, reweight="inverse", inverse_clip=(10, 5))


@settings(max_examples=40, deadline=None)
@given(
    labels=st.lists(st.integers(0, 135), min_size=1, max_size=60),
    reweight=st.sampled_from(["sqrt_inv", "inverse"]),
    lds=st.booleans(),
    kernel=st.sampled_from(KERNELS),
    ks=st.sampled_from([1, 3, 5, 7]),
    sigma=st.sampled_from([0.5, 1.0, 2.0]),
)
def test_property_reference_parity(labels, reweight, lds, kernel, ks, sigma) -> None:
    ref = ref_weights(labels, reweight, lds, kernel, ks, sigma, float32=False)
    got = lds_weights(labels, reweight=reweight, lds=lds, kernel=kernel, ks=ks, sigma=sigma, label_range=(0, 121))
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    if reweight == "sqrt_inv" and max(labels) <= 120:  # data-driven bins give the same numbers
        np.testing.assert_allclose(
            lds_weights(labels, reweight=reweight, lds=lds, kernel=kernel, ks=ks, sigma=sigma), ref, rtol=1e-12
        )
