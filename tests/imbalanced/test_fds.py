"""FDS: statistics and calibration vs slow per-bin loops, no in-place change, eval identity, buffers, gradients."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rankwise.imbalanced import FDS, get_lds_kernel_window
from tests.conftest import gradcheck

D = 6


def slow_calibrate(z, labels, m1, v1, m2, v2, lo=0.0) -> torch.Tensor:
    """The reference's per-label loop (on a copy), for integer labels with unit bins starting at ``lo``."""
    out = z.clone()
    for lab in torch.unique(labels).tolist():
        rows = labels == lab
        b = int(lab - lo)
        if float(v1[b].sum()) < 1e-10:
            continue
        valid = v1[b] != 0
        factor = torch.clamp(v2[b][valid] / v1[b][valid], 0.1, 10)
        block = out[rows]
        block[:, valid] = (block[:, valid] - m1[b][valid]) * torch.sqrt(factor) + m2[b][valid]
        out[rows] = block
    return out


def slow_update(mean, var, tracked, z, labels, epoch, start_update, momentum, lo=0.0):
    """The reference's per-label update loop, on copies."""
    mean, var, tracked = mean.clone(), var.clone(), tracked.clone()
    for lab in torch.unique(labels).tolist():
        feats = z[labels == lab]
        b = int(lab - lo)
        n = feats.shape[0]
        cm = feats.mean(0)
        cv = feats.var(0, unbiased=n != 1)
        tracked[b] += n
        factor = momentum if momentum is not None else 1 - n / float(tracked[b])
        factor = 0 if epoch == start_update else factor
        mean[b] = (1 - factor) * cm + factor * mean[b]
        var[b] = (1 - factor) * cv + factor * var[b]
    return mean, var, tracked


def slow_smooth(stats, kernel, ks, sigma):
    w = get_lds_kernel_window(kernel, ks, sigma)
    w = (w / w.sum()).to(stats.dtype)
    x = F.pad(stats.unsqueeze(1).permute(2, 1, 0), ((ks - 1) // 2, (ks - 1) // 2), mode="reflect")
    return F.conv1d(x, w.view(1, 1, -1)).permute(2, 1, 0).squeeze(1)


def random_fds(seed: int = 0, dtype=torch.float64, **kw) -> FDS:
    g = torch.Generator().manual_seed(seed)
    fds = FDS(D, label_range=(0, 12), **kw).to(dtype)
    with torch.no_grad():
        for name in ("running_mean_last_epoch", "smoothed_mean_last_epoch"):
            getattr(fds, name).copy_(torch.randn(12, D, generator=g))
        for name in ("running_var_last_epoch", "smoothed_var_last_epoch"):
            getattr(fds, name).copy_(torch.rand(12, D, generator=g) * 3)
        fds.running_var_last_epoch[2, 1] = 0.0  # a zero-variance dimension: left unchanged
        fds.running_var_last_epoch[3] = 0.0  # a bin with no variance: left unchanged
        fds.smoothed_var_last_epoch[4] *= 100  # ratio clipped at 10
        fds.smoothed_var_last_epoch[5] /= 100  # ratio clipped at 0.1
    return fds


def test_calibration_matches_slow_loop() -> None:
    fds = random_fds()
    g = torch.Generator().manual_seed(1)
    z = torch.randn(40, D, generator=g, dtype=torch.float64)
    y = torch.randint(0, 12, (40,), generator=g)
    y[:4] = torch.tensor([2, 3, 4, 5])
    z_before = z.clone()
    out = fds(z, y, epoch=1)
    expected = slow_calibrate(
        z,
        y,
        fds.running_mean_last_epoch,
        fds.running_var_last_epoch,
        fds.smoothed_mean_last_epoch,
        fds.smoothed_var_last_epoch,
    )
    torch.testing.assert_close(out, expected)
    assert torch.equal(z, z_before), "FDS must not modify the caller's features"
    assert out.data_ptr() != z.data_ptr()
    assert torch.equal(out[y == 3], z[y == 3])
    assert torch.equal(out[y == 2][:, 1], z[y == 2][:, 1])
    # float labels in the same unit bin, and (B, 1) labels, give the same result
    torch.testing.assert_close(fds(z, (y + 0.5).view(-1, 1).double(), epoch=1), out)


def test_identity_in_eval_and_before_start_smooth() -> None:
    fds = random_fds(start_smooth=3)
    z, y = torch.randn(10, D, dtype=torch.float64), torch.randint(0, 12, (10,))
    assert fds(z, y, epoch=2) is z
    assert not torch.equal(fds(z, y, epoch=3), z)
    fds.eval()
    assert fds(z, y, epoch=5) is z


def test_gradients_flow() -> None:
    fds = random_fds()
    y = torch.randint(0, 12, (9,))
    z = torch.randn(9, D, dtype=torch.float64, requires_grad=True)
    fds(z, y, epoch=1).pow(2).sum().backward()
    assert z.grad is not None and torch.isfinite(z.grad).all() and z.grad.abs().sum() > 0
    assert gradcheck(lambda a: fds(a, y, epoch=1), z)
    assert not any(b.requires_grad for b in fds.buffers())


@pytest.mark.parametrize("momentum", [0.9, 0.5, None])
def test_running_stats_match_slow_loop(momentum) -> None:
    fds = FDS(D, label_range=(0, 12), momentum=momentum, start_update=0).double()
    mean, var, tracked = fds.running_mean.clone(), fds.running_var.clone(), fds.num_samples_tracked.clone()
    g = torch.Generator().manual_seed(4)
    for epoch in range(3):
        z = torch.randn(60, D, generator=g, dtype=torch.float64) * 2 + 1
        y = torch.randint(0, 10, (60,), generator=g)  # bins 10, 11 never seen
        y[0] = 11 if epoch == 2 else y[0]  # bin 11 seen once: variance 0
        y[y == 11] = 11
        fds.update_running_stats(z, y, epoch)
        mean, var, tracked = slow_update(mean, var, tracked, z, y, epoch, 0, momentum)
        torch.testing.assert_close(fds.running_mean, mean)
        torch.testing.assert_close(fds.running_var, var)
        torch.testing.assert_close(fds.num_samples_tracked, tracked)
    assert torch.equal(fds.running_mean[10], torch.zeros(D, dtype=torch.float64))
    assert torch.equal(fds.running_var[10], torch.ones(D, dtype=torch.float64))


def test_updates_before_start_update_are_ignored() -> None:
    fds = FDS(D, label_range=(0, 12), start_update=2, start_smooth=3)
    state = copy.deepcopy(fds.state_dict())
    fds.update(torch.randn(8, D), torch.randint(0, 12, (8,)), epoch=1)
    for k, v in fds.state_dict().items():
        assert torch.equal(v, state[k]), k


@pytest.mark.parametrize(("kernel", "ks", "sigma"), [("gaussian", 5, 2.0), ("triang", 3, 1.0), ("laplace", 7, 1.5)])
def test_last_epoch_stats_are_smoothed_copies(kernel, ks, sigma) -> None:
    fds = FDS(D, label_range=(0, 12), kernel=kernel, ks=ks, sigma=sigma).double()
    g = torch.Generator().manual_seed(5)
    z, y = torch.randn(80, D, generator=g, dtype=torch.float64), torch.randint(0, 12, (80,), generator=g)
    fds.update(z, y, epoch=0)  # epoch 0: running stats only
    assert int(fds.epoch) == 0 and torch.equal(fds.running_mean_last_epoch, torch.zeros_like(fds.running_mean))
    fds.update_last_epoch_stats(1)
    assert int(fds.epoch) == 1
    torch.testing.assert_close(fds.running_mean_last_epoch, fds.running_mean)
    torch.testing.assert_close(fds.smoothed_mean_last_epoch, slow_smooth(fds.running_mean, kernel, ks, sigma))
    torch.testing.assert_close(fds.smoothed_var_last_epoch, slow_smooth(fds.running_var, kernel, ks, sigma))
    frozen = {
        k: getattr(fds, k).clone()
        for k in (
            "running_mean_last_epoch",
            "running_var_last_epoch",
            "smoothed_mean_last_epoch",
            "smoothed_var_last_epoch",
        )
    }
    running_before = fds.running_mean.clone()
    fds.update_running_stats(z * 3 + 2, y, epoch=1)
    assert not torch.equal(fds.running_mean, running_before)
    for k, v in frozen.items():  # no aliasing: the frozen copies did not move
        assert torch.equal(getattr(fds, k), v), k
    fds.update_last_epoch_stats(1)  # same epoch again: no-op
    for k, v in frozen.items():
        assert torch.equal(getattr(fds, k), v), k


def test_bin_stats_are_additive_and_update_from_stats() -> None:
    g = torch.Generator().manual_seed(6)
    z, y = torch.randn(50, D, generator=g, dtype=torch.float64), torch.randint(0, 12, (50,), generator=g)
    a = FDS(D, label_range=(0, 12)).double()
    b = FDS(D, label_range=(0, 12)).double()
    a.update_running_stats(z, y, epoch=0)
    s1, q1, c1 = b.bin_stats(z[:20], y[:20])  # e.g. two ranks or two batches
    s2, q2, c2 = b.bin_stats(z[20:], y[20:])
    b.update_from_stats(s1 + s2, q1 + q2, c1 + c2, epoch=0)
    for k, v in a.state_dict().items():
        torch.testing.assert_close(b.state_dict()[k], v)
    with pytest.raises(ValueError, match="`count` must have shape"):
        b.update_from_stats(s1, q1, c1[:3], epoch=1)


def test_sync_with_single_process_group(tmp_path) -> None:
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch.distributed unavailable")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        z, y = torch.randn(30, D), torch.randint(0, 12, (30,))
        a, b = FDS(D, label_range=(0, 12)), FDS(D, label_range=(0, 12))
        a.update_running_stats(z, y, 0, sync=True)
        b.update_running_stats(z, y, 0)
        torch.testing.assert_close(a.running_var, b.running_var)
    finally:
        dist.destroy_process_group()


def test_state_dict_round_trip() -> None:
    g = torch.Generator().manual_seed(7)
    z, y = torch.randn(64, D, generator=g), torch.randint(0, 12, (64,), generator=g)
    fds = FDS(D, label_range=(0, 12))
    for epoch in range(3):
        fds.update(z + epoch, y, epoch)
    sd = fds.state_dict()
    assert {
        "epoch",
        "running_mean",
        "running_var",
        "running_mean_last_epoch",
        "running_var_last_epoch",
        "smoothed_mean_last_epoch",
        "smoothed_var_last_epoch",
        "num_samples_tracked",
    } <= set(sd)
    other = FDS(D, label_range=(0, 12))
    other.load_state_dict(sd)
    assert int(other.epoch) == 2
    torch.testing.assert_close(other(z, y, epoch=3), fds(z, y, epoch=3))
    fds.update(z, y, 3)
    other.update(z, y, 3)
    for k, v in fds.state_dict().items():
        torch.testing.assert_close(other.state_dict()[k], v)


def test_dtype_device_and_half(device: torch.device) -> None:
    fds = random_fds(dtype=torch.float32).to(device)
    z = torch.randn(16, D, device=device)
    y = torch.randint(0, 12, (16,), device=device)
    out = fds(z, y, epoch=1)
    assert out.device == z.device and out.dtype == torch.float32
    out_h = fds(z.half(), y, epoch=1)
    assert out_h.dtype == torch.float16
    torch.testing.assert_close(out_h.float(), out, rtol=1e-2, atol=1e-2)
    fds.update(z.half(), y, epoch=1)  # half features update float32 statistics
    assert fds.running_mean.dtype == torch.float32 and torch.isfinite(fds.running_mean).all()


def test_bins_and_clipping() -> None:
    fds = FDS(2, bins=[0.0, 0.5, 2.0, 10.0], ks=3)
    assert fds.num_bins == 3
    assert fds.bin_index(torch.tensor([-1.0, 0.0, 0.49, 0.5, 9.9, 50.0])).tolist() == [0, 0, 0, 1, 2, 2]
    fw = FDS(2, label_range=(-1.0, 1.0), bin_width=0.25)
    assert fw.num_bins == 8
    assert fw.bin_index(torch.tensor([-1.0, -0.76, -0.75, 0.99, 3.0])).tolist() == [0, 0, 1, 7, 7]
    # module.half() casts the statistics but never rounds the bin edges
    fine = FDS(2, label_range=(0, 1000), bin_width=0.1).half()
    assert fine.bin_index(torch.tensor([999.95, 0.05])).tolist() == [9999, 0]
    # a single bin: smoothing with reflect padding still works
    one = FDS(2, label_range=(0, 1))
    one.update(torch.randn(5, 2), torch.zeros(5), 0)
    one.update_last_epoch_stats(1)
    torch.testing.assert_close(one.smoothed_mean_last_epoch, one.running_mean)


def test_errors() -> None:
    with pytest.raises(ValueError, match="`feature_dim` must be a positive int"):
        FDS(0)
    with pytest.raises(ValueError, match="`start_smooth` must be > `start_update`"):
        FDS(4, start_update=2, start_smooth=2)
    with pytest.raises(ValueError, match="`momentum` must be in"):
        FDS(4, momentum=1.5)
    with pytest.raises(ValueError, match="`kernel` must be one of"):
        FDS(4, kernel="box")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`ks` must be a positive odd int"):
        FDS(4, ks=4)
    with pytest.raises(ValueError, match="`bins` must be at least 2 strictly increasing"):
        FDS(4, bins=[1.0, 1.0])
    fds = FDS(4)
    with pytest.raises(ValueError, match=r"`features` must have shape \(B, 4\)"):
        fds.calibrate(torch.randn(3, 5), torch.zeros(3))
    with pytest.raises(ValueError, match="`labels` must have shape"):
        fds.calibrate(torch.randn(3, 4), torch.zeros(4))
    with pytest.raises(TypeError, match="`features` must be a floating-point tensor"):
        fds.calibrate(torch.ones(3, 4, dtype=torch.long), torch.zeros(3))


def test_agedb_like_training_timeline() -> None:
    """Reference loop: update at each epoch end; smoothing acts from epoch 2 with epoch-(e-1) statistics."""
    rng = np.random.default_rng(8)
    fds = FDS(D, label_range=(0, 12))
    feats = [torch.from_numpy(rng.normal(size=(40, D))).float() for _ in range(3)]
    ys = [torch.from_numpy(rng.integers(0, 12, 40)) for _ in range(3)]
    assert torch.equal(fds(feats[0], ys[0], 1), feats[0])  # epoch 1, before any refresh: identity
    fds.update(feats[0], ys[0], 0)
    assert torch.equal(fds(feats[0], ys[0], 1), feats[0])  # still the initial (0, 1) statistics
    fds.update(feats[1], ys[1], 1)
    out = fds(feats[2], ys[2], 2)
    assert not torch.equal(out, feats[2])


def test_blockwise_calibration_and_statistics_equal_the_one_shot_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without autograd, calibration and the per-bin sums go over row blocks (a whole data set never
    gets full-size temporaries); with a tiny block size (many blocks, a ragged last one) they equal
    the autograd path / one block, the slow loop, and never touch the caller's features."""
    from rankwise.imbalanced import fds as fds_module

    fds = random_fds()
    g = torch.Generator().manual_seed(5)
    z = torch.randn(103, D, generator=g, dtype=torch.float64)
    y = torch.randint(0, 12, (103,), generator=g)
    z_before = z.clone()
    with torch.no_grad():
        one_block = fds.calibrate(z, y)
        s1, q1, c1 = fds.bin_stats(z, y)
    monkeypatch.setattr(fds_module, "_ROW_BLOCK_ELEMENTS", 4 * D)  # blocks of 4 rows
    with torch.no_grad():
        blocks = fds.calibrate(z, y)
        s2, q2, c2 = fds.bin_stats(z, y)
    with_grad = fds.calibrate(z.clone().requires_grad_(), y)
    assert with_grad.requires_grad
    torch.testing.assert_close(blocks, one_block, rtol=0, atol=0)
    torch.testing.assert_close(blocks, with_grad.detach(), rtol=0, atol=0)
    expected = slow_calibrate(
        z,
        y,
        fds.running_mean_last_epoch,
        fds.running_var_last_epoch,
        fds.smoothed_mean_last_epoch,
        fds.smoothed_var_last_epoch,
    )
    torch.testing.assert_close(blocks, expected)
    torch.testing.assert_close(s2, s1)
    torch.testing.assert_close(q2, q1)
    torch.testing.assert_close(c2, c1)
    torch.testing.assert_close(s2, torch.zeros(12, D, dtype=torch.float64).index_add_(0, y, z))
    torch.testing.assert_close(q2, torch.zeros(12, D, dtype=torch.float64).index_add_(0, y, z * z))
    assert torch.equal(z, z_before), "the float64 blocks must be copies: FDS never modifies its input"


def test_non_finite_label_rows_are_nan_with_zero_gradient() -> None:
    """A NaN/inf label has no bin: its row is NaN (both paths) and passes no gradient to the features."""
    fds = random_fds()
    z = torch.randn(5, D, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([1.0, float("nan"), 2.0, float("inf"), 4.0], dtype=torch.float64)
    out = fds.calibrate(z, y)
    assert torch.isnan(out[[1, 3]]).all() and torch.isfinite(out[[0, 2, 4]]).all()
    with torch.no_grad():
        torch.testing.assert_close(fds.calibrate(z, y), out.detach(), equal_nan=True)
    out[[0, 2, 4]].sum().backward()
    assert z.grad is not None and (z.grad[[1, 3]] == 0).all() and torch.isfinite(z.grad).all()
