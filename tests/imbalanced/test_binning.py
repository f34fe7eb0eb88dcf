"""One binning rule for every label dtype: data.label_bins, LDS bin_labels, FDS buckets, shot metrics.

float32 labels used to land one bin low (``label_bins(np.float32([0.7, 3.8, 4.6]), 0.1)``
gave [6, 37, 45]); item 6: absurd label ranges overflowed int64 or tried huge allocations.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
import torch

from rankwise import _binning
from rankwise.data import label_bins, label_histogram
from rankwise.imbalanced import FDS, bin_labels, lds_weights, regression_metrics, shot_groups

DECIMALS = [f"{k / 1000:.3f}" for k in range(0, 5001, 7)] + ["0.7", "3.8", "4.6", "0.3", "2.5", "4.9", "5.0"]


def _decimal_bins(values: list[str], width: str, lo: str = "0") -> list[int]:
    """Exact bins of decimal strings: floor((y - lo) / w) in decimal arithmetic."""
    q = [(Decimal(v) - Decimal(lo)) / Decimal(width) for v in values]
    return [int(x.to_integral_value(rounding="ROUND_FLOOR")) for x in q]


def test_issue_reproduction_float32_labels() -> None:
    assert label_bins(np.float32([0.7, 3.8, 4.6]), 0.1).tolist() == [7, 38, 46]
    assert label_bins(np.float64([0.7, 3.8, 4.6]), 0.1).tolist() == [7, 38, 46]
    m = regression_metrics(torch.tensor([0.7]), torch.tensor([0.7]), [0.7] * 150, bin_width=0.1)
    assert m["many"]["count"] == 1 and m["few"]["count"] == 0


@pytest.mark.parametrize("width", ["0.1", "0.25", "0.05", "1", "0.2"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_decimal_labels_get_their_exact_bins_in_every_dtype(width: str, dtype: type) -> None:
    want = _decimal_bins(DECIMALS, width)
    y = np.array([float(v) for v in DECIMALS], dtype=dtype)
    w = float(width)
    assert label_bins(y, w).tolist() == want
    t = torch.from_numpy(y)
    k, nb = bin_labels(t, bin_width=w)
    assert (k + min(want)).tolist() == want and nb == max(want) - min(want) + 1
    k, _ = bin_labels(t, bin_width=w, label_range=(0.0, 5.0 + w))
    assert k.tolist() == want
    assert _binning.snap_floor(t, w).long().tolist() == want
    fds = FDS(2, bin_width=w, label_range=(0.0, 5.0 + w))
    assert fds.bin_index(t).tolist() == want
    # explicit (non-uniform in general) edges: the same rule
    edges = torch.arange(0, round(5.0 / w) + 2, dtype=torch.float64) * w
    assert FDS(2, bins=edges).bin_index(t).tolist() == want
    k, _ = bin_labels(t, bins=edges)
    assert k.tolist() == want


def test_offset_bins_and_negative_labels() -> None:
    vals = ["-2.3", "-0.1", "-0.05", "0.0", "1.15", "2.35", "-1.0"]
    want = _decimal_bins(vals, "0.05", lo="-2.5")
    for dt in (torch.float32, torch.float64):
        y = torch.tensor([float(v) for v in vals], dtype=dt)
        assert FDS(2, bin_width=0.05, label_range=(-2.5, 2.5)).bin_index(y).tolist() == want
        k, _ = bin_labels(y, bin_width=0.05, label_range=(-2.5, 2.5))
        assert k.tolist() == want
    assert label_bins(np.float32([-0.7, -0.3]), 0.1).tolist() == [-7, -3]


def test_snap_window_is_a_fixed_fraction_of_the_bin() -> None:
    """Labels less than 1/1024 of a bin below an edge count as on it, at any magnitude; others do not move."""
    y = np.array([0.7 - 1e-3, 0.7 - 1e-5, 1e6 + 0.1 - 1e-3, 1e6 + 0.1 - 1e-5, 1e6 + 0.05])
    want = [6, 7, 10000000, 10000001, 10000000]
    assert label_bins(y, 0.1).tolist() == want
    assert _binning.snap_floor(torch.from_numpy(y), 0.1).long().tolist() == want


def test_torch_and_numpy_rules_agree() -> None:
    g = torch.Generator().manual_seed(0)
    y = torch.cat([torch.randn(5000, generator=g, dtype=torch.float64) * 30, torch.arange(-300, 300) * 0.1])
    for w, lo in [(0.1, 0.0), (0.25, -1.0), (3.0, 0.5), (1e-3, 2.0)]:
        a = _binning.snap_floor(y, w, lo).numpy()
        b = _binning.snap_floor_np(y.numpy(), w, lo)
        np.testing.assert_array_equal(a, b)
        assert np.abs(a - np.floor((y.numpy() - lo) / w)).max() <= 1


def test_fds_bucket_lookup_runs_on_the_meta_device() -> None:
    """The FDS lookup is vectorized torch (no host values): it runs on a device without data."""
    fds = FDS(3, bin_width=0.1, label_range=(0, 5)).to("meta")
    idx = fds.bin_index(torch.empty(8, device="meta"))
    assert idx.device.type == "meta" and idx.shape == (8,)
    edges = FDS(3, bins=[0.0, 0.5, 2.0, 5.0])
    assert edges.bin_index(torch.empty(4, device="meta")).shape == (4,)


# --------------------------------------------------------------------------------------------------
# item 6: absurd ranges give clear errors
# --------------------------------------------------------------------------------------------------
def test_huge_labels_and_ranges_are_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"`labels`.*2\*\*53"):
        lds_weights(torch.tensor([0.0, 9.3e18], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"`labels`.*2\*\*53"):
        lds_weights(np.array([1e300]))
    with pytest.raises(ValueError, match=r"span 10,000,000,001 bins.*at most 16,777,216"):
        lds_weights(np.array([0.0, 1e10]), bin_width=1.0)
    with pytest.raises(ValueError, match=r"`label_range`.*bins"):
        lds_weights(np.array([0.0, 1.0]), label_range=(0.0, 1e10))
    with pytest.raises(ValueError, match=r"span.*bins"):
        label_histogram(np.array([0.0, 1e10]), 1e-3)
    with pytest.raises(ValueError, match=r"`labels`.*2\*\*53"):
        label_bins(np.array([1e20]), 1.0)
    with pytest.raises(ValueError, match=r"`labels` must be finite"):
        label_bins(np.array([1.0, np.nan]), 1.0)
    with pytest.raises(ValueError, match=r"`label_range`.*bins"):
        FDS(4, label_range=(0, 1e10))
    with pytest.raises(ValueError, match=r"`feature_dim`.*bins"):
        FDS(4096, label_range=(0, 1e5))
    # label_range bins clip far-away (finite) labels without int64 overflow
    k, nb = bin_labels(torch.tensor([-1e300, 1e19, 5.0], dtype=torch.float64), label_range=(0, 10))
    assert k.tolist() == [0, 9, 5] and nb == 10
    assert FDS(2, label_range=(0, 10)).bin_index(torch.tensor([-1e300, 1e19, 5.0], dtype=torch.float64)).tolist() == [
        0,
        9,
        5,
    ]


# --------------------------------------------------------------------------------------------------
# the real STS-B-DIR labels
# --------------------------------------------------------------------------------------------------
def _stsb_scores(root: Path, name: str) -> np.ndarray:
    import csv

    with open(root / name, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return np.array([float(r["score"]) for r in rows], dtype=np.float64)


@pytest.mark.parametrize("dtype", ["float64", "float32", "torch.float32"])
def test_stsb_dir_shot_groups(shared_dir: Path, dtype: str) -> None:
    root = shared_dir / "data" / "sts-b-dir"
    if not root.is_dir():
        pytest.skip("STS-B-DIR is absent from ../shared")
    train = _stsb_scores(root, "train_new.tsv")
    test = _stsb_scores(root, "test_new.tsv")
    assert len(train) == 5249 and len(test) == 1000

    def conv(a: np.ndarray) -> np.ndarray | torch.Tensor:
        if dtype == "torch.float32":
            return torch.from_numpy(a).float()
        return a.astype(dtype)

    groups = shot_groups(conv(test), conv(train), bin_width=0.1)
    assert [int(groups[k].sum()) for k in ("many", "medium", "few")] == [775, 202, 23]
    m = regression_metrics(conv(test), conv(test), conv(train), bin_width=0.1)
    assert [m[k]["count"] for k in ("many", "medium", "few")] == [775, 202, 23]
    # every consumer puts every training score in the same bin, whatever the dtype
    want = label_bins(train, 0.1)
    assert label_bins(np.asarray(conv(train)), 0.1).tolist() == want.tolist()
    k, _ = bin_labels(torch.as_tensor(np.asarray(conv(train))), bin_width=0.1, label_range=(0.0, 5.1))
    assert k.tolist() == want.tolist()
    fds = FDS(2, bin_width=0.1, label_range=(0.0, 5.1))
    assert fds.bin_index(torch.as_tensor(np.asarray(conv(train)))).tolist() == want.tolist()
    w32 = lds_weights(torch.from_numpy(train).float(), bin_width=0.1)
    w64 = lds_weights(torch.from_numpy(train), bin_width=0.1)
    torch.testing.assert_close(w32.double(), w64, rtol=1e-6, atol=1e-6)
