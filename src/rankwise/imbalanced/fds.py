"""Feature distribution smoothing (FDS): per-bin running feature statistics, smoothed and calibrated."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from rankwise._binning import snap_bucketize, snap_floor
from rankwise._validation import (
    check_choice,
    check_floating,
    check_positive,
    check_positive_int,
    check_tensor,
    to_compute,
)
from rankwise.distributed import all_reduce_sum
from rankwise.imbalanced.lds import Kernel, as_float64_tensor, get_lds_kernel_window, range_num_bins, smooth_bins

__all__ = ["FDS"]

_KERNELS = ("gaussian", "triang", "laplace")

#: the most per-bin statistics (bins x feature_dim) one buffer may hold: 2**26 float32 = 256 MiB, six buffers
_MAX_STAT_ELEMENTS = 2**26
#: statistics and calibration without autograd go over the rows in blocks of about this many elements
#: (cache-sized temporaries instead of several full-size copies of a whole data set)
_ROW_BLOCK_ELEMENTS = 1 << 20


def _block_rows(rows: int, dim: int) -> int:
    """Rows per block of the blockwise passes: about ``_ROW_BLOCK_ELEMENTS`` values, at most ``rows``."""
    return max(1, min(_ROW_BLOCK_ELEMENTS // dim, rows))


class FDS(nn.Module):
    r"""Feature distribution smoothing (Yang et al., ICML'21) as a drop-in layer after the encoder.

    For every label bin :math:`b` FDS keeps running per-dimension statistics of the features
    :math:`(\mu_b, \sigma^2_b)`, smooths them across neighbouring bins with the (sum-normalized) kernel
    window, :math:`\tilde\mu_b = \sum_{b'} k(b, b')\mu_{b'}`, :math:`\tilde\sigma^2_b = \sum_{b'} k(b,
    b')\sigma^2_{b'}` (reflect padding at the end bins, as the reference), and in training re-scales a
    feature :math:`z` whose label falls in bin :math:`b`, per dimension:

    .. math::
        \tilde z = (z - \mu_b)\,\sqrt{\mathrm{clip}(\tilde\sigma^2_b / \sigma^2_b,\ 0.1,\ 10)} + \tilde\mu_b .

    As in the reference, a bin whose variances sum to less than ``1e-10`` (e.g. one seen with a single
    sample) and dimensions with :math:`\sigma^2_b = 0` are left unchanged.

    Design (what differs from the DIR reference, same numbers otherwise):

    * **Two sets of statistics.** ``running_mean/var`` are updated from each epoch's features;
      ``update_last_epoch_stats(epoch)`` *copies* them into ``running_mean/var_last_epoch`` and stores their
      smoothed versions in ``smoothed_mean/var_last_epoch``; ``forward`` calibrates with these frozen
      copies only. (The reference assigns the running buffer to the "last epoch" attribute, so the two
      alias and later updates leak into the calibration, and a reloaded checkpoint behaves differently.)
    * **Vectorized updates** with ``index_add_`` over bins (no Python loop over labels), in float64.
      Statistics are per epoch: the mean and unbiased variance of all features of a bin passed in one
      ``update_running_stats`` call (variance 0 for a single sample), blended as
      ``stat = (1 - m) * epoch_stat + m * stat`` with ``m = momentum``; ``m = 0`` at ``epoch ==
      start_update`` (the first update replaces the initial values) and ``m = 1 - n_epoch / n_tracked``
      (a cumulative average) when ``momentum=None``. Bins without samples keep their statistics.
    * **All-reduce-able.** ``bin_stats(features, labels)`` returns per-bin ``(sum, sum of squares,
      count)``; these can be summed over batches and over ranks (``torch.distributed.all_reduce``)
      before ``update_from_stats(sum, sumsq, count, epoch)``; ``update_running_stats(..., sync=True)``
      does the all-reduce itself when a process group is initialized, so every rank holds the same
      statistics.
    * **No in-place change** of the caller's features (the reference smooths in place); ``forward`` is the
      identity (it returns its input) in eval mode and before ``start_smooth``; gradients flow to the
      features (statistics are buffers, never differentiated); device and dtype follow the module/inputs
      (fp16/bf16 features are calibrated in float32 and returned in their dtype).
    * All statistics are registered buffers, saved in ``state_dict`` (``epoch`` included); bin edges and
      the kernel are float64 attributes that ``module.half()`` does not round.
    * **Non-finite inputs.** A NaN/inf feature or label never enters the statistics: the update raises
      ``ValueError`` naming ``features`` or ``labels`` (the reference keeps NaN statistics forever).
      The check costs one host sync per update (once per epoch); :meth:`bin_stats` (per batch) and the
      calibration have none. Calibration propagates NaN features, and a NaN/inf label gives a NaN row.
    * **Binning.** Labels are binned by the rule of :func:`rankwise.data.label_bins` (the same bin for
      float32 and float64 labels), vectorized on the features' device.

    Schedule (same as the reference): ``epoch`` starts at ``start_update``; the last-epoch copies are
    refreshed at the end of epochs ``start_update + 1, ...``, so with the defaults the calibration uses
    the initial ``(0, 1)`` statistics (identity) during epoch 1, and during epoch ``e >= 2`` the running
    statistics as they stood after epoch ``e - 2`` (mean, variance and their smoothed versions all from
    that same snapshot, which the reference's aliasing breaks). Instead of collecting all
    features, sum :meth:`bin_stats` over the epoch's batches and call :meth:`update_last_epoch_stats`
    and :meth:`update_from_stats`. ``clip`` is the variance-ratio range ``(0.1, 10)``.

    Bins: ``bins`` edges, or ``label_range=(lo, hi)`` cut into ``bin_width`` bins (default ``(0, 121)``
    with unit bins: ages 0..120 as in the reference's AgeDB/IMDB-WIKI setup); labels outside are clipped
    into the end bins.

    Typical loop (the reference's)::

        fds = FDS(512)
        for epoch in range(epochs):
            feats, ys = [], []
            for x, y in loader:
                z = encoder(x)
                feats.append(z.detach()); ys.append(y)
                pred = head(fds(z, y, epoch))          # calibrated in training only
                ...
            fds.update(torch.cat(feats), torch.cat(ys), epoch)  # = update_last_epoch_stats + update_running_stats

    Shape:
        - features: :math:`(B, D)` floating; labels: :math:`(B,)` or :math:`(B, 1)`.
        - output: :math:`(B, D)`, dtype of ``features``.

    Example:
        >>> import torch
        >>> from rankwise.imbalanced import FDS
        >>> fds = FDS(4, label_range=(0, 10), start_smooth=1)
        >>> z, y = torch.randn(32, 4), torch.randint(0, 10, (32,))
        >>> fds.update(z, y, epoch=0)
        >>> fds.update(z, y, epoch=1)
        >>> int(fds.epoch)
        1
        >>> fds(z, y, epoch=2).shape
        torch.Size([32, 4])
        >>> torch.equal(fds.eval()(z, y, epoch=2), z)
        True
    """

    epoch: torch.Tensor
    edges: torch.Tensor
    kernel_window: torch.Tensor
    running_mean: torch.Tensor
    running_var: torch.Tensor
    running_mean_last_epoch: torch.Tensor
    running_var_last_epoch: torch.Tensor
    smoothed_mean_last_epoch: torch.Tensor
    smoothed_var_last_epoch: torch.Tensor
    num_samples_tracked: torch.Tensor

    def __init__(
        self,
        feature_dim: int,
        *,
        bins: torch.Tensor | np.ndarray | Sequence[float] | None = None,
        bin_width: float = 1.0,
        label_range: tuple[float, float] = (0, 121),
        kernel: Kernel = "gaussian",
        ks: int = 5,
        sigma: float = 2.0,
        momentum: float | None = 0.9,
        start_update: int = 0,
        start_smooth: int = 1,
        clip: tuple[float, float] = (0.1, 10.0),
    ) -> None:
        super().__init__()
        check_positive_int(feature_dim, "feature_dim")
        check_choice(kernel, "kernel", _KERNELS)
        if momentum is not None and not 0.0 <= float(momentum) <= 1.0:
            raise ValueError(f"`momentum` must be in [0, 1] or None, got {momentum!r}")
        for name, v in (("start_update", start_update), ("start_smooth", start_smooth)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"`{name}` must be an int, got {type(v).__name__}")
        if start_smooth < start_update + 1:
            raise ValueError(
                f"`start_smooth` must be > `start_update` (statistics must exist before smoothing), "
                f"got start_smooth={start_smooth}, start_update={start_update}"
            )
        lo_c, hi_c = (float(c) for c in clip)
        if not 0 < lo_c <= hi_c:
            raise ValueError(f"`clip` must be (low, high) with 0 < low <= high, got {clip!r}")
        if bins is not None:
            edges = as_float64_tensor(bins, "bins").reshape(-1)
            if edges.numel() < 2 or not bool((edges[1:] > edges[:-1]).all()):
                raise ValueError("`bins` must be at least 2 strictly increasing edges")
            if not bool(torch.isfinite(edges).all()):
                raise ValueError("`bins` must be finite edges, got NaN or inf")
        else:
            w = check_positive(bin_width, "bin_width")
            lo, hi = (float(v) for v in label_range)
            if not hi > lo:
                raise ValueError(f"`label_range` must be (low, high) with high > low, got {label_range!r}")
            nb = range_num_bins(lo, hi, w)
            edges = lo + w * torch.arange(nb + 1, dtype=torch.float64)
        nb = edges.numel() - 1
        if nb * feature_dim > _MAX_STAT_ELEMENTS:
            raise ValueError(
                f"`feature_dim`={feature_dim} times {nb:,} bins (from `bins` / `label_range` and `bin_width`) "
                f"gives {nb * feature_dim:,} statistics per buffer; at most {_MAX_STAT_ELEMENTS:,} are allowed: "
                "use fewer bins"
            )
        self.feature_dim, self.num_bins = feature_dim, nb
        self.kernel, self.ks, self.sigma = kernel, ks, float(sigma)
        self.momentum = None if momentum is None else float(momentum)
        self.start_update, self.start_smooth = start_update, start_smooth
        self.clip = (lo_c, hi_c)
        window = get_lds_kernel_window(kernel, ks, sigma)
        gaps = edges[1:] - edges[:-1]
        # plain float64 CPU attributes, not buffers: ``module.half()`` must not round the bin edges
        self._uniform = bool(torch.allclose(gaps, gaps[:1].expand_as(gaps)))
        self._lo, self._width = float(edges[0]), float(gaps[0])
        self.edges = edges
        self.kernel_window = window / window.sum()
        self.register_buffer("epoch", torch.tensor(start_update, dtype=torch.long))
        for name, fill in (
            ("running_mean", 0.0),
            ("running_var", 1.0),
            ("running_mean_last_epoch", 0.0),
            ("running_var_last_epoch", 1.0),
            ("smoothed_mean_last_epoch", 0.0),
            ("smoothed_var_last_epoch", 1.0),
        ):
            self.register_buffer(name, torch.full((nb, feature_dim), fill))
        self.register_buffer("num_samples_tracked", torch.zeros(nb))

    def extra_repr(self) -> str:
        return (
            f"feature_dim={self.feature_dim}, num_bins={self.num_bins}, kernel={self.kernel!r}, ks={self.ks}, "
            f"sigma={self.sigma}, momentum={self.momentum}, start_update={self.start_update}, "
            f"start_smooth={self.start_smooth}"
        )

    # ------------------------------------------------------------------ binning and statistics
    def bin_index(self, labels: torch.Tensor) -> torch.Tensor:
        """Bin of every label, ``(B,)`` long, clipped into ``[0, num_bins)``; no host sync.

        Labels are binned from their float64 value by the rule of :func:`rankwise.data.label_bins`
        (a label less than 1/1024 of a bin width below an edge counts as lying on it): float32 and float64
        labels get the same bins. A NaN label gets bin 0 here; :meth:`bin_stats` and :meth:`calibrate`
        treat non-finite labels separately.
        """
        check_tensor(labels, "labels")
        y = labels.detach().reshape(-1).to(torch.float64)
        if self._uniform:
            k = snap_floor(y, self._width, self._lo)
        else:
            k = snap_bucketize(y, self.edges.to(device=y.device)).to(torch.float64)
        # clamp in float64 before the integer conversion (far-away labels cannot overflow int64)
        k = torch.nan_to_num(k, nan=0.0).clamp(0, self.num_bins - 1)
        return k.long()

    def _check_pair(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        check_floating(features, "features")
        check_tensor(labels, "labels")
        if features.dim() != 2 or features.shape[1] != self.feature_dim:
            raise ValueError(f"`features` must have shape (B, {self.feature_dim}), got {tuple(features.shape)}")
        if labels.numel() != features.shape[0] or labels.dim() > 2:
            raise ValueError(
                f"`labels` must have shape ({features.shape[0]},) or ({features.shape[0]}, 1), "
                f"got {tuple(labels.shape)}"
            )

    def bin_stats(
        self, features: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-bin ``(sum (K, D), sum of squares (K, D), count (K,))`` of the features, float64.

        Additive over batches and ranks: sum them (e.g. ``torch.distributed.all_reduce``) before
        :meth:`update_from_stats`.
        """
        self._check_pair(features, labels)
        z = features.detach()
        y = labels.detach().reshape(-1).to(z.device)
        idx = self.bin_index(y)
        k, d = self.num_bins, self.feature_dim
        s = torch.zeros(k, d, dtype=torch.float64, device=z.device)
        q = torch.zeros(k, d, dtype=torch.float64, device=z.device)
        # float64 sums over row blocks: the float64 copies of a whole set (e.g. 100k x 512) never exist at once
        step = _block_rows(z.shape[0], d)
        buf = torch.empty(step, d, dtype=torch.float64, device=z.device)  # one block buffer, reused
        for a in range(0, z.shape[0], step):
            zb = buf[: min(step, z.shape[0] - a)].copy_(z[a : a + step])
            ib = idx[a : a + step]
            s.index_add_(0, ib, zb)
            q.index_add_(0, ib, zb.mul_(zb))
        # a non-finite label counts NaN (no host sync here): update_from_stats then rejects the stats
        one = torch.where(torch.isfinite(y), 1.0, math.nan).to(torch.float64) if y.is_floating_point() else None
        c = torch.zeros(k, dtype=torch.float64, device=z.device).index_add_(
            0, idx, torch.ones(z.shape[0], dtype=torch.float64, device=z.device) if one is None else one
        )
        return s, q, c

    @torch.no_grad()
    def update_from_stats(
        self, feature_sum: torch.Tensor, feature_sumsq: torch.Tensor, count: torch.Tensor, epoch: int
    ) -> None:
        """Blend one epoch's per-bin statistics (from :meth:`bin_stats`, summed) into the running ones.

        Ignored when ``epoch < start_update`` or ``epoch`` is older than the last refreshed epoch.

        Non-finite statistics (a NaN/inf feature or label reached :meth:`bin_stats`) raise ``ValueError``
        naming ``features`` or ``labels`` and leave every statistic unchanged; the check reads two flags
        on the host (one sync per call, i.e. per epoch, never per training step).
        """
        if epoch < self.start_update or epoch < int(self.epoch):
            return
        self._check_stats(feature_sum, feature_sumsq, count)
        self._blend(feature_sum, feature_sumsq, count, epoch)

    def _check_stats(self, feature_sum: torch.Tensor, feature_sumsq: torch.Tensor, count: torch.Tensor) -> None:
        k, d = self.num_bins, self.feature_dim
        for name, t, shape in (
            ("feature_sum", feature_sum, (k, d)),
            ("feature_sumsq", feature_sumsq, (k, d)),
            ("count", count, (k,)),
        ):
            check_tensor(t, name)
            if tuple(t.shape) != shape:
                raise ValueError(f"`{name}` must have shape {shape}, got {tuple(t.shape)}")
        finite = torch.stack(
            [torch.isfinite(count).all(), torch.isfinite(feature_sum).all() & torch.isfinite(feature_sumsq).all()]
        )
        labels_ok, features_ok = finite.tolist()  # the one host sync of an update
        if not labels_ok:
            raise ValueError(
                "`labels` must be finite, got NaN or inf (the per-bin `count` is not finite); "
                "FDS statistics were not updated"
            )
        if not features_ok:
            raise ValueError(
                "`features` must be finite, got NaN or inf (the per-bin `feature_sum`/`feature_sumsq` are not "
                "finite); FDS statistics were not updated"
            )

    def _blend(self, feature_sum: torch.Tensor, feature_sumsq: torch.Tensor, count: torch.Tensor, epoch: int) -> None:
        dev = self.running_mean.device
        s, q, c = (t.to(device=dev, dtype=torch.float64) for t in (feature_sum, feature_sumsq, count))
        seen = c > 0
        cc = c.clamp_min(1)[:, None]
        mean = s / cc
        var = ((q - cc * mean * mean) / (cc - 1).clamp_min(1)).clamp_min(0)
        var = torch.where((c > 1)[:, None], var, torch.zeros_like(var))  # one sample: biased variance = 0
        tracked = self.num_samples_tracked.to(torch.float64) + c
        if epoch == self.start_update:
            factor = torch.zeros_like(c)
        elif self.momentum is None:
            factor = 1 - c / tracked.clamp_min(1)
        else:
            factor = torch.full_like(c, self.momentum)
        f = factor[:, None]
        new_mean = (1 - f) * mean + f * self.running_mean.to(torch.float64)
        new_var = (1 - f) * var + f * self.running_var.to(torch.float64)
        self.running_mean.copy_(torch.where(seen[:, None], new_mean, self.running_mean.to(torch.float64)))
        self.running_var.copy_(torch.where(seen[:, None], new_var, self.running_var.to(torch.float64)))
        self.num_samples_tracked.copy_(tracked)

    @torch.no_grad()
    def update_running_stats(
        self, features: torch.Tensor, labels: torch.Tensor, epoch: int, *, sync: bool = False
    ) -> None:
        """Update the running statistics with (all of) an epoch's ``features`` and ``labels``.

        ``sync=True`` all-reduces the per-bin sums over the default process group first (when
        ``torch.distributed`` is initialized), so every rank ends with identical statistics.
        """
        if epoch < self.start_update or epoch < int(self.epoch):
            return
        self.update_from_stats(*self._epoch_stats(features, labels, sync), epoch)

    def _epoch_stats(
        self, features: torch.Tensor, labels: torch.Tensor, sync: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s, q, c = self.bin_stats(features, labels)
        if sync:
            packed = all_reduce_sum(torch.cat([s.reshape(-1), q.reshape(-1), c]))
            kd = self.num_bins * self.feature_dim
            s, q, c = packed[:kd].view_as(s), packed[kd : 2 * kd].view_as(q), packed[2 * kd :]
        return s, q, c

    @torch.no_grad()
    def smoothed_stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Kernel-smoothed copies of ``(running_mean, running_var)`` (new tensors; buffers untouched)."""
        w = self.kernel_window
        mean = smooth_bins(self.running_mean.to(torch.float64), w, mode="reflect")
        var = smooth_bins(self.running_var.to(torch.float64), w, mode="reflect")
        return mean.to(self.running_mean.dtype), var.to(self.running_var.dtype)

    @torch.no_grad()
    def update_last_epoch_stats(self, epoch: int) -> None:
        """At ``epoch == self.epoch + 1``: freeze copies of the running statistics and their smoothed versions.

        Call it once per epoch (before :meth:`update_running_stats`, as the reference training loop does).
        """
        if epoch != int(self.epoch) + 1:
            return
        self.epoch.fill_(epoch)
        self.running_mean_last_epoch.copy_(self.running_mean)
        self.running_var_last_epoch.copy_(self.running_var)
        mean, var = self.smoothed_stats()
        self.smoothed_mean_last_epoch.copy_(mean)
        self.smoothed_var_last_epoch.copy_(var)

    def update(self, features: torch.Tensor, labels: torch.Tensor, epoch: int, *, sync: bool = False) -> None:
        """End-of-epoch refresh: :meth:`update_last_epoch_stats` then :meth:`update_running_stats`.

        NaN/inf ``features`` or ``labels`` raise ``ValueError`` naming the argument and leave the running
        statistics unchanged (see :meth:`update_from_stats`; one host sync per call). The epoch's
        last-epoch refresh has happened by then (it only copies the statistics gathered before), so a
        loop that catches the error and goes on keeps the schedule.
        """
        self.update_last_epoch_stats(epoch)
        self.update_running_stats(features, labels, epoch, sync=sync)

    # ------------------------------------------------------------------ calibration
    def calibrate(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The calibration with the frozen last-epoch statistics, regardless of mode and epoch.

        NaN propagates (a NaN feature gives NaN in its row); a row whose label is NaN or inf (it has no
        bin) comes out all NaN. No host sync.
        """
        self._check_pair(features, labels)
        out_dtype = features.dtype
        z = to_compute(features)
        idx = self.bin_index(labels).to(z.device)
        scale, shift = self._scale_shift(z.dtype, z.device)
        if labels.is_floating_point():  # a NaN/inf label has no bin: its row is NaN (NaN policy), zero gradient
            finite = torch.isfinite(labels.detach().reshape(-1)).to(z.device)
            idx = torch.where(finite, idx, self.num_bins)
        if torch.is_grad_enabled() and z.requires_grad:
            out = torch.addcmul(shift[idx], z, scale[idx])
        else:  # no autograd: over row blocks into one output (no full-size gathered tables)
            out = torch.empty_like(z)
            step = _block_rows(z.shape[0], self.feature_dim)
            # the gathered per-row tables go into two block buffers reused across blocks (fresh
            # multi-MiB blocks cost a page fault per page every time)
            sb = torch.empty(step, z.shape[1], dtype=z.dtype, device=z.device)
            hb = torch.empty_like(sb)
            for a in range(0, z.shape[0], step):
                ib = idx[a : a + step]
                m = ib.shape[0]
                torch.index_select(scale, 0, ib, out=sb[:m])
                torch.index_select(shift, 0, ib, out=hb[:m])
                torch.addcmul(hb[:m], z[a : a + step], sb[:m], out=out[a : a + step])
        return out.to(out_dtype)

    def _scale_shift(self, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-bin ``(scale, shift)`` tables ``(num_bins + 1, D)`` with ``calibrated = z * scale + shift``
        (``= (z - mu_b) * scale + smoothed mu_b``; ``scale = 1, shift = 0`` where the bin or dimension is
        left unchanged), computed in float64; the extra last row (``0, NaN``) serves non-finite labels."""
        m1, v1, m2, v2 = (
            t.to(device=device, dtype=torch.float64)
            for t in (
                self.running_mean_last_epoch,
                self.running_var_last_epoch,
                self.smoothed_mean_last_epoch,
                self.smoothed_var_last_epoch,
            )
        )
        ok = (v1.sum(-1, keepdim=True) >= 1e-10) & (v1 != 0)
        ratio = (v2 / torch.where(ok, v1, torch.ones_like(v1))).clamp(self.clip[0], self.clip[1])
        scale = torch.where(ok, ratio.sqrt(), torch.ones_like(v1))
        shift = torch.where(ok, m2 - m1 * scale, torch.zeros_like(v1))
        scale = torch.cat([scale, torch.zeros_like(scale[:1])])
        shift = torch.cat([shift, torch.full_like(shift[:1], math.nan)])
        return scale.to(dtype), shift.to(dtype)

    def forward(self, features: torch.Tensor, labels: torch.Tensor, epoch: int) -> torch.Tensor:
        """Calibrated features in training mode from ``start_smooth`` on; ``features`` itself otherwise."""
        if not self.training or epoch < self.start_smooth:
            return features
        return self.calibrate(features, labels)
