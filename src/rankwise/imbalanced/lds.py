"""Label distribution smoothing (LDS): kernel windows, label binning and per-sample weights."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from rankwise._binning import MAX_BINS, SNAP, check_bin_span, snap_bucketize, snap_floor
from rankwise._validation import check_choice, check_positive, compute_dtype

__all__ = ["bin_labels", "get_lds_kernel_window", "lds_weights", "smooth_bins"]

Kernel = Literal["gaussian", "triang", "laplace"]
Reweight = Literal["sqrt_inv", "inverse", "none"]
_KERNELS = ("gaussian", "triang", "laplace")
_REWEIGHTS = ("sqrt_inv", "inverse", "none")


def _check_ks(ks: Any) -> int:
    if isinstance(ks, bool) or not isinstance(ks, (int, np.integer)):
        raise TypeError(f"`ks` must be an int, got {type(ks).__name__}")
    if ks < 1 or ks % 2 == 0:
        raise ValueError(f"`ks` must be a positive odd int (the window is centred on a bin), got {ks}")
    return int(ks)


def get_lds_kernel_window(kernel: Kernel = "gaussian", ks: int = 5, sigma: float = 2.0) -> torch.Tensor:
    r"""The symmetric LDS/FDS kernel window of ``ks`` taps, normalized to a peak of 1 (float64, CPU).

    With :math:`h = (ks - 1) / 2` and offsets :math:`x = -h..h`:

    * ``"gaussian"``: the response of a Gaussian filter (standard deviation ``sigma``, truncated at
      :math:`4\sigma` taps, i.e. radius ``int(4 sigma + 0.5)``) to a unit impulse in the middle of a
      length-``ks`` signal whose ends are extended by half-sample symmetric reflection, divided by its
      maximum. This is exactly ``scipy.ndimage.gaussian_filter1d(delta, sigma) / max(...)``, the window
      of the DIR reference; when ``4 sigma`` exceeds ``h`` the reflected tails make it flatter than a
      sampled Gaussian.
    * ``"triang"``: ``scipy.signal.windows.triang(ks)``, i.e. :math:`1 - |x| / (h + 1)`.
    * ``"laplace"``: :math:`\exp(-|x| / \sigma)` (peak 1).

    FDS uses the same windows divided by their sum (see :class:`rankwise.imbalanced.FDS`).

    Example:
        >>> from rankwise.imbalanced import get_lds_kernel_window
        >>> get_lds_kernel_window("triang", 5)
        tensor([0.3333, 0.6667, 1.0000, 0.6667, 0.3333], dtype=torch.float64)
        >>> get_lds_kernel_window("gaussian", 5, 2.0)
        tensor([0.8583, 0.9458, 1.0000, 0.9458, 0.8583], dtype=torch.float64)
    """
    check_choice(kernel, "kernel", _KERNELS)
    ks = _check_ks(ks)
    sigma = check_positive(sigma, "sigma")
    h = (ks - 1) // 2
    x = np.arange(-h, h + 1, dtype=np.float64)
    if kernel == "triang":
        w = 1.0 - np.abs(x) / (h + 1)
    elif kernel == "laplace":
        w = np.exp(-np.abs(x) / sigma)
    else:
        radius = int(4.0 * sigma + 0.5)
        taps = np.arange(-radius, radius + 1, dtype=np.float64)
        phi = np.exp(-0.5 * taps**2 / sigma**2)
        phi = phi / phi.sum()
        # output[i] = sum_t phi[t] * delta_ext[i + t]; the extension reflects about the half-samples,
        # i.e. index j maps to m = j mod 2 ks, then m if m < ks else 2 ks - 1 - m.
        j = np.arange(ks)[:, None] + np.arange(-radius, radius + 1)[None, :]
        m = np.mod(j, 2 * ks)
        src = np.where(m < ks, m, 2 * ks - 1 - m)
        w = (phi[None, :] * (src == h)).sum(axis=1)
    return torch.from_numpy(w / w.max())


def as_float64_tensor(x: Any, name: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        t = x.detach()
    else:
        try:
            t = torch.from_numpy(np.array(x, dtype=np.float64, copy=True))
        except (TypeError, ValueError):
            raise TypeError(
                f"`{name}` must be a tensor, array or sequence of numbers, got {type(x).__name__}"
            ) from None
    if t.dtype == torch.bool or t.is_complex():
        raise TypeError(f"`{name}` must hold real numbers, got dtype {t.dtype}")
    return t.to(torch.float64)


def bin_labels(
    labels: Any,
    *,
    bin_width: float = 1.0,
    bins: torch.Tensor | np.ndarray | Sequence[float] | None = None,
    label_range: tuple[float, float] | None = None,
) -> tuple[torch.Tensor, int]:
    """Bin index of every label and the number of bins: ``(index (N,) long, num_bins)``.

    * ``bins`` given: strictly increasing edges :math:`e_0 < ... < e_K`; bin ``k`` is :math:`[e_k, e_{k+1})`.
    * else ``label_range=(lo, hi)``: ``ceil((hi - lo) / bin_width)`` bins :math:`[lo + k w, lo + (k + 1) w)`.
    * else the bins are the multiples of ``bin_width`` from the one holding the smallest label to the one
      holding the largest, i.e. bin of ``y`` is ``floor(y / bin_width)`` shifted to start at 0 (this
      needs the labels' min/max, a host sync).

    Every label is binned from its float64 value by the rule of :func:`rankwise.data.label_bins`: a label
    less than 1/1024 of a bin width below an edge counts as lying on it, so float32 and float64 labels get
    the same bins (``0.7`` is bin 7 of width 0.1 in both). Labels outside the bins are clipped into the
    first/last bin (the DIR reference clips ages to 0..120). For integer labels 0..120,
    ``label_range=(0, 121)`` reproduces the reference's 121 unit bins.

    ``ValueError`` for NaN/inf labels (checking them is a host sync: this is a data-preparation step),
    when the bins would number more than ``2**24`` (e.g. labels spanning ``1e10`` with ``bin_width=1``)
    or when a label lies ``2**53`` or more bin widths from 0 (data-driven bins).
    """
    y = as_float64_tensor(labels, "labels").reshape(-1)
    if y.numel() and not bool(torch.isfinite(y).all()):
        raise ValueError("`labels` must be finite, got NaN or inf")
    if bins is not None:
        edges = as_float64_tensor(bins, "bins").reshape(-1).to(y.device)
        if edges.numel() < 2:
            raise ValueError(f"`bins` must hold at least 2 edges, got {edges.numel()}")
        if not bool((edges[1:] > edges[:-1]).all()):
            raise ValueError("`bins` must be strictly increasing edges")
        nb = edges.numel() - 1
        if nb > MAX_BINS:
            raise ValueError(f"`bins` must define at most {MAX_BINS:,} bins, got {nb:,}")
        return snap_bucketize(y, edges).clamp(0, nb - 1), nb
    w = check_positive(bin_width, "bin_width")
    if label_range is not None:
        lo, hi = (float(v) for v in label_range)
        if not hi > lo:
            raise ValueError(f"`label_range` must be (low, high) with high > low, got {label_range!r}")
        nb = range_num_bins(lo, hi, w)
        # clamp in float64 before the integer conversion: far-away labels cannot overflow int64
        return snap_floor(y, w, lo).clamp(0, nb - 1).long(), nb
    if y.numel() == 0:
        return torch.zeros(0, dtype=torch.long, device=y.device), 0
    k = snap_floor(y, w)
    k0, k1 = torch.aminmax(k)
    span = check_bin_span(float(k0), float(k1), what=f"`labels` with `bin_width`={bin_width!r}")
    return (k - k0).long(), span


def range_num_bins(lo: float, hi: float, width: float) -> int:
    """Number of ``width`` bins covering ``label_range=(lo, hi)`` (the last one may stick out).

    ``ValueError`` naming ``label_range`` and ``bin_width`` beyond ``2**24`` bins.
    """
    q = (hi - lo) / width
    if not q < MAX_BINS:  # also catches inf
        raise ValueError(
            f"`label_range`=({lo!r}, {hi!r}) with `bin_width`={width!r} makes {q:,.0f} bins; at most "
            f"{MAX_BINS:,} bins are allowed: use a larger `bin_width` or explicit `bins`"
        )
    return max(1, math.ceil(q - SNAP))


def smooth_bins(values: torch.Tensor, window: torch.Tensor, *, mode: Literal["constant", "reflect"]) -> torch.Tensor:
    """Convolve per-bin values ``(K,)`` or ``(K, C)`` with a symmetric odd ``window`` along the bins.

    ``mode="constant"`` pads with zeros (``scipy.ndimage.convolve1d(..., mode="constant")``, used by LDS);
    ``mode="reflect"`` mirrors about the end bins without repeating them (``torch.nn.functional.pad``'s
    ``"reflect"``, used by FDS), for any number of bins. Output: same shape and dtype as ``values``.
    """
    check_choice(mode, "mode", ("constant", "reflect"))
    squeeze = values.dim() == 1
    v = values.unsqueeze(-1) if squeeze else values
    nb, ks = v.shape[0], window.numel()
    h = (ks - 1) // 2
    if nb == 0:
        return values.clone()
    pos = torch.arange(-h, nb + h, device=v.device)
    if mode == "constant":
        inside = (pos >= 0) & (pos < nb)
        padded = torch.where(inside[:, None], v[pos.clamp(0, nb - 1)], torch.zeros((), dtype=v.dtype, device=v.device))
    else:
        if nb == 1:
            src = torch.zeros_like(pos)
        else:
            period = 2 * (nb - 1)
            m = torch.remainder(pos, period)
            src = torch.where(m < nb, m, period - m)
        padded = v[src]
    kernel = window.to(dtype=v.dtype, device=v.device).flip(0).reshape(1, 1, ks)
    out = F.conv1d(padded.T.unsqueeze(1), kernel).squeeze(1).T  # (nb, C)
    return out.squeeze(-1) if squeeze else out


def lds_weights(
    labels: Any,
    *,
    bin_width: float = 1.0,
    bins: torch.Tensor | np.ndarray | Sequence[float] | None = None,
    reweight: Reweight = "sqrt_inv",
    lds: bool = True,
    kernel: Kernel = "gaussian",
    ks: int = 5,
    sigma: float = 2.0,
    inverse_clip: tuple[float, float] = (5, 1000),
    label_range: tuple[float, float] | None = None,
) -> Any:
    r"""Per-sample loss weights from the (smoothed) label density, averaging to 1 (Yang et al., ICML'21).

    Procedure (the DIR reference's, generalized to any bins):

    1. bin the labels (:func:`bin_labels`: unit bins by default, ``bin_width``, explicit ``bins`` edges or
       ``label_range``) and count the samples :math:`n_k` per bin, empty bins included;
    2. transform the counts: ``"sqrt_inv"`` :math:`\sqrt{n_k}`; ``"inverse"``
       :math:`\mathrm{clip}(n_k, 5, 1000)` (``inverse_clip``; empty bins also become 5); ``"none"`` 1;
    3. with ``lds=True`` convolve the transformed counts with the kernel window of
       :func:`get_lds_kernel_window` (peak 1, zero padding beyond the end bins, same length) to get the
       effective density :math:`\tilde n_k`;
    4. weight of sample :math:`i` = :math:`1 / \tilde n_{k(i)}`, rescaled so the weights average to 1.

    For integer labels in 0..120 with unit bins this reproduces the reference numbers exactly (up to the
    reference's float32 rounding): with ``reweight="sqrt_inv"`` for the default data-driven bins, and with
    ``reweight="inverse"`` when ``label_range=(0, 121)`` is passed (the reference's fixed 121 bins,
    whose empty bins get clipped to 5 and then enter the smoothing). Unlike the reference, float,
    negative and out-of-0..120 labels are binned correctly (out-of-range labels are clipped into the end
    bins only when ``bins``/``label_range`` are given). With explicit non-uniform ``bins`` the kernel acts
    on bin indices.

    ``lds=True`` requires reweighting (``reweight="none"`` raises ``ValueError``, the reference's
    "LDS requires reweighting" rule); ``reweight="none", lds=False`` gives all-ones weights.

    Shape:
        - labels: any shape holding :math:`N` real labels (tensor, numpy array or sequence).
        - output: :math:`(N,)` weights. A tensor input gives a tensor on its device (its floating dtype,
          float32 for fp16/bf16, the default dtype for integer labels); anything else gives a float64
          numpy array. Computed in float64; not differentiable (a data-preparation step).

    Example:
        >>> import torch
        >>> from rankwise.imbalanced import lds_weights
        >>> y = torch.tensor([1, 1, 1, 1, 2, 5])
        >>> w = lds_weights(y, lds=False)  # 1 / sqrt(count)
        >>> w
        tensor([0.7500, 0.7500, 0.7500, 0.7500, 1.5000, 1.5000])
        >>> float(w.mean())
        1.0
        >>> lds_weights(y, kernel="triang", ks=3)
        tensor([0.7742, 0.7742, 0.7742, 0.7742, 0.9677, 1.9355])
    """
    check_choice(reweight, "reweight", _REWEIGHTS)
    check_choice(kernel, "kernel", _KERNELS)
    if lds and reweight == "none":
        raise ValueError(
            "`reweight` must be 'sqrt_inv' or 'inverse' when `lds=True` (LDS smooths the reweighted "
            "label density); got reweight='none' — pass lds=False for uniform weights"
        )
    lo_clip, hi_clip = (float(v) for v in inverse_clip)
    if not 0 < lo_clip <= hi_clip:
        raise ValueError(f"`inverse_clip` must be (low, high) with 0 < low <= high, got {inverse_clip!r}")
    window = get_lds_kernel_window(kernel, ks, sigma) if lds else None
    is_tensor = isinstance(labels, torch.Tensor)
    y = as_float64_tensor(labels, "labels").reshape(-1)
    if is_tensor:
        out_dtype = compute_dtype(labels.dtype)
    n = y.numel()
    if n == 0:
        return torch.zeros(0, dtype=out_dtype, device=labels.device) if is_tensor else np.zeros(0)
    if not bool(torch.isfinite(y).all()):
        raise ValueError("`labels` must be finite, got NaN or inf")
    idx, nb = bin_labels(y, bin_width=bin_width, bins=bins, label_range=label_range)
    counts = torch.bincount(idx, minlength=nb).to(torch.float64)
    if reweight == "sqrt_inv":
        density = counts.sqrt()
    elif reweight == "inverse":
        density = counts.clamp(lo_clip, hi_clip)
    else:
        density = torch.ones_like(counts)
    if window is not None:
        density = smooth_bins(density, window.to(y.device), mode="constant")
    inv = 1.0 / density[idx]
    weights = inv * (n / inv.sum())
    if is_tensor:
        return weights.to(out_dtype)
    return weights.numpy()
