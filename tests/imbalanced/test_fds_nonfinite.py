"""FDS and non-finite inputs: NaN/inf features or labels are rejected by the
statistics update with a ValueError naming the argument, and nothing changes; calibration
propagates NaN instead of binning a NaN label into bin 0."""

from __future__ import annotations

import math

import pytest
import torch

from rankwise.imbalanced import FDS


def _state(fds: FDS) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in fds.state_dict().items()}


def _fds() -> FDS:
    torch.manual_seed(0)
    fds = FDS(3, label_range=(0, 6), ks=3, start_smooth=1)
    z, y = torch.randn(6, 3), torch.arange(6.0)
    fds.update(z, y, epoch=0)
    fds.update(z * 2, y, epoch=1)
    return fds


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("where", ["features", "labels"])
@pytest.mark.parametrize("method", ["update", "update_running_stats", "bin_stats+update_from_stats"])
def test_update_rejects_non_finite_and_keeps_the_statistics(bad: float, where: str, method: str) -> None:
    fds = _fds()
    before = _state(fds)
    z, y = torch.randn(6, 3), torch.arange(6.0)
    if where == "features":
        z[2, 1] = bad
    else:
        y[4] = bad
    with pytest.raises(ValueError, match=rf"`{where}` must be finite, got NaN or inf"):
        if method == "update":
            fds.update(z, y, epoch=2)
        elif method == "update_running_stats":
            fds.update_running_stats(z, y, epoch=2)
        else:
            fds.update_from_stats(*fds.bin_stats(z, y), epoch=2)
    after = _state(fds)
    # the running statistics are untouched; update() has done its scheduled last-epoch refresh
    refreshed = {"epoch", *(k for k in before if k.endswith("_last_epoch"))} if method == "update" else set()
    for k, v in before.items():
        if k not in refreshed:
            assert torch.equal(v, after[k]), k
    if method == "update":
        assert int(after["epoch"]) == 2
        assert torch.equal(after["running_mean_last_epoch"], before["running_mean"])
    # a clean update afterwards works and keeps everything finite
    fds.update(torch.randn(6, 3), torch.arange(6.0), epoch=2)
    out = fds.train()(torch.randn(6, 3), torch.arange(6.0), epoch=3)
    assert torch.isfinite(out).all()


def test_issue_reproduction_one_nan_batch_no_longer_poisons_later_epochs() -> None:
    """Before: one NaN batch left NaN running statistics forever (those bins silently stopped calibrating)."""
    torch.manual_seed(0)
    fds = FDS(3, label_range=(0, 6), ks=3, start_smooth=1)
    y = torch.arange(6.0).repeat(4)
    for epoch in range(6):
        z = torch.randn(24, 3) * (1 + torch.arange(24.0)[:, None] % 3)
        if epoch == 1:
            z[:, 0] = math.nan
            with pytest.raises(ValueError, match="`features`"):
                fds.update(z, y, epoch)
            continue
        fds.update(z, y, epoch)
    for name in ("running_mean", "running_var", "smoothed_mean_last_epoch", "smoothed_var_last_epoch"):
        assert torch.isfinite(getattr(fds, name)).all(), name
    z = torch.randn(24, 3)
    out = fds.train()(z, y, epoch=6)
    assert torch.isfinite(out).all()
    assert not torch.allclose(out, z)  # every bin still calibrates


def test_calibration_propagates_nan_and_gives_non_finite_labels_nan_rows() -> None:
    fds = _fds().train()
    z = torch.randn(5, 3)
    y = torch.tensor([0.0, math.nan, 2.0, math.inf, 4.0])
    z[4, 0] = math.nan
    out = fds(z, y, epoch=2)
    assert torch.isnan(out[1]).all() and torch.isnan(out[3]).all()  # no bin: NaN row (was bin 0 before)
    assert torch.isnan(out[4, 0]) and torch.isfinite(out[4, 1:]).all()  # NaN feature propagates
    assert torch.isfinite(out[[0, 2]]).all()
    clean = fds(z[[0, 2]], y[[0, 2]], epoch=2)
    torch.testing.assert_close(out[[0, 2]], clean)
    # integer labels are always finite
    assert torch.isfinite(fds(torch.randn(3, 3), torch.tensor([0, 1, 5]), epoch=2)).all()


def test_nan_check_is_one_host_sync_per_update_not_per_step() -> None:
    """bin_stats (per batch) reads nothing on the host: it runs on the meta device."""
    fds = FDS(3, label_range=(0, 6)).to("meta")
    s, q, c = fds.bin_stats(torch.empty(4, 3, device="meta"), torch.empty(4, device="meta"))
    assert s.device.type == q.device.type == c.device.type == "meta"
    out = fds.calibrate(torch.empty(4, 3, device="meta"), torch.empty(4, device="meta"))
    assert out.device.type == "meta"
