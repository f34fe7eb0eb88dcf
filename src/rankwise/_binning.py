r"""One label-binning rule for every dtype and device (private).

Used by :func:`rankwise.data.label_bins` (data splits, reports), :func:`rankwise.imbalanced.bin_labels`
(LDS weights), :class:`rankwise.imbalanced.FDS` and :func:`rankwise.imbalanced.shot_groups` /
``regression_metrics``, so that a label lands in the same bin everywhere.

The rule: with bins of width :math:`w` starting at :math:`lo` (edges :math:`e_j = lo + j w`), label
:math:`y` (as a float64 value) goes to bin :math:`\lfloor (y - lo) / w \rfloor`, except that a label less
than :data:`SNAP` :math:`\cdot w` below an edge :math:`e_j` counts as lying on it (bin :math:`j`).
``SNAP`` = :math:`2^{-10}` of a bin width: a decimal label stored in float32 (``0.7`` is
``0.699999988...``) lands in the bin of the same decimal stored in float64 (``floor`` alone puts it one
bin lower: 6 instead of 7 for width 0.1), and ``0.3 / 0.1 = 2.9999999999999996`` gives bin 3. The
window is a fixed fraction of the bin width, so the rule does not depend on the labels' dtype or
magnitude; it absorbs float32 round-off (:math:`2^{-24}` relative) for labels up to :math:`2^{14}` bin
widths from ``lo`` (beyond, float32 cannot resolve a bin to better than 1/1024 of its width anyway).
Explicit, non-uniform edges use the same rule with :math:`w` the width of the bin below the edge.
float16/bfloat16 labels carry round-off (:math:`2^{-11}`, :math:`2^{-8}` relative) beyond the window:
bin them from float32 or float64 data.

The torch functions are vectorized and never synchronize with the host (FDS runs them on the training
device every step); the range checks (:func:`check_bin_span`) need the labels' min/max and are used only
where the caller already reads them on the host.
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = [
    "MAX_BINS",
    "MAX_INDEX",
    "MAX_ORDINAL_CLASSES",
    "SNAP",
    "LabelClasses",
    "check_bin_span",
    "label_bins_np",
    "snap_bucketize",
    "snap_floor",
    "snap_floor_np",
]

#: a label less than ``SNAP * bin_width`` below a bin edge counts as lying on the edge
SNAP = 2.0**-10

#: the most bins a binning may create (LDS keeps a float64 count per bin, FDS statistics per bin)
MAX_BINS = 2**24

#: the most classes an ordinal head over integer labels gets (wider integer spans are binned)
MAX_ORDINAL_CLASSES = 1000

#: ``|label - lo| / bin_width`` must stay below this: every bin index is then an exact integer in
#: float64 (and far from int64 overflow)
MAX_INDEX = 2.0**53


def snap_floor_np(y: np.ndarray, width: float, lo: float = 0.0) -> np.ndarray:
    """Bin index (float64 array of integral values) of every float64 label, by the module's rule."""
    q = (np.asarray(y, dtype=np.float64) - lo) / width
    return np.floor(q + SNAP)


def snap_floor(y: torch.Tensor, width: float, lo: float = 0.0) -> torch.Tensor:
    """Bin index (float64 tensor of integral values, NaN for NaN) of every label; no host sync."""
    q = (y.to(torch.float64) - lo) / width
    return torch.floor(q + SNAP)


def snap_bucketize(y: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """Index ``i`` (int64) with ``edges[i] <= y < edges[i + 1]`` by the module's rule, in ``[-1, K]``.

    ``edges`` (float64, strictly increasing, ``K + 1 >= 2`` entries, on ``y``'s device). ``-1``: below the
    first edge; ``K``: at or above the last one. No host sync.
    """
    y = y.to(torch.float64)
    k = edges.numel() - 1
    i = torch.bucketize(y, edges, right=True) - 1  # in [-1, K]
    j = (i + 1).clamp(max=k)  # the next edge up (i + 1 = K + 1 has none)
    e = edges[j]
    gap = edges[j] - edges[(j - 1).clamp(min=0)]
    gap = torch.where(j == 0, edges[1] - edges[0], gap)
    snap = (i < k) & (e - y < SNAP * gap)
    return torch.where(snap, j, i)


def check_bin_span(k_min: float, k_max: float, *, what: str) -> int:
    """Number of bins ``k_max - k_min + 1`` for extreme bin indices read on the host; ``ValueError`` when
    an index reaches :data:`MAX_INDEX` or the span exceeds :data:`MAX_BINS`. ``what`` names the labels and
    options in the message (e.g. ``"`labels` with `bin_width`=1.0"``)."""
    if not (math.isfinite(k_min) and math.isfinite(k_max)):
        raise ValueError(f"{what}: the labels must be finite, got NaN or inf")
    if max(abs(k_min), abs(k_max)) >= MAX_INDEX:
        raise ValueError(
            f"{what}: a label is {max(abs(k_min), abs(k_max)):.3g} bin widths from the origin; bin indices must "
            f"stay below 2**53 (exact in float64): use a larger `bin_width` or explicit `bins`"
        )
    span = int(k_max) - int(k_min) + 1
    if span > MAX_BINS:
        raise ValueError(
            f"{what}: the labels span {span:,} bins (bin {int(k_min):,} to {int(k_max):,}); at most "
            f"{MAX_BINS:,} bins are allowed: use a larger `bin_width` or explicit `bins`"
        )
    return span


def label_bins_np(labels: np.ndarray, width: float, *, name: str = "labels") -> np.ndarray:
    """int64 bins of finite float64 ``labels`` (``ValueError`` naming ``name`` for NaN/inf or huge bins)."""
    lab = np.asarray(labels, dtype=np.float64)
    if lab.size and not np.isfinite(lab).all():
        raise ValueError(f"`{name}` must be finite, got NaN or inf values")
    k = snap_floor_np(lab, width)
    if k.size and np.abs(k).max() >= MAX_INDEX:
        check_bin_span(float(k.min()), float(k.max()), what=f"`{name}` with `bin_width`={width!r}")
    return k.astype(np.int64)


class LabelClasses:
    """The map between labels and the ``K`` ordered classes ``0..K-1`` of an ordinal head.

    Class ``c`` covers the labels of ``[lo + c w, lo + (c + 1) w)`` (the module's binning rule) and
    stands for its centre ``lo + (c + 1/2) w``. :meth:`fit` chooses it from the training labels:
    integer-valued labels (ratings, grades, ages in years) get one class per integer from the
    smallest to the largest (``w = 1``, class ``c`` = label ``min + c``), unless that makes more
    than :data:`MAX_ORDINAL_CLASSES` classes; other labels are binned with the run's label bin
    width (the bins of LDS, FDS and the shot groups), class ``c`` the ``c``-th bin from the
    smallest training label's. Labels beyond the training range map to the first or last class.
    """

    def __init__(self, lo: float, width: float, num_classes: int) -> None:
        if not (math.isfinite(lo) and math.isfinite(width) and width > 0):
            raise ValueError(f"`lo` and `width` must be finite with `width` > 0, got lo={lo!r}, width={width!r}")
        if int(num_classes) < 2:
            raise ValueError(f"`num_classes` must be >= 2, got {num_classes!r}")
        self.lo, self.width, self.num_classes = float(lo), float(width), int(num_classes)

    @classmethod
    def fit(cls, train_labels: np.ndarray, bin_width: float) -> LabelClasses:
        """The classes of ``train_labels`` (finite; at least two classes, else ``ValueError``)."""
        lab = np.asarray(train_labels, dtype=np.float64).reshape(-1)
        if lab.size == 0 or not np.isfinite(lab).all():
            raise ValueError("an ordinal head needs finite training labels, got none or NaN/inf values")
        lo, hi = float(lab.min()), float(lab.max())
        if np.array_equal(lab, np.round(lab)) and hi - lo + 1 <= MAX_ORDINAL_CLASSES:
            out = cls(lo - 0.5, 1.0, int(hi - lo) + 1) if hi > lo else None
        else:
            k = label_bins_np(lab, bin_width, name="train_labels")
            out = (
                cls(float(k.min()) * bin_width, float(bin_width), int(k.max() - k.min()) + 1)
                if k.max() > k.min()
                else None
            )
        if out is None:
            raise ValueError(
                f"an ordinal head needs training labels in at least two classes; every training label is {lo:g}"
            )
        return out

    @property
    def integer(self) -> bool:
        """Whether the classes are the integers ``min..max`` (width 1, centred on integers)."""
        return self.width == 1.0 and float(self.lo + 0.5).is_integer()

    def classes(self, y: torch.Tensor) -> torch.Tensor:
        """int64 class of every label (clipped to ``0..K-1``; NaN labels give class 0); no host sync."""
        c = torch.nan_to_num(snap_floor(y, self.width, self.lo), nan=0.0)
        return c.clamp(0, self.num_classes - 1).to(torch.int64)

    def values(self, c: torch.Tensor) -> torch.Tensor:
        """The label each class position stands for (a fractional position interpolates), float64."""
        return self.lo + (c.to(torch.float64) + 0.5) * self.width

    def describe(self) -> str:
        """One line: how many classes and which labels they stand for."""
        first, last = self.lo + 0.5 * self.width, self.lo + (self.num_classes - 0.5) * self.width
        if self.integer:
            return f"{self.num_classes} classes: labels {first:g} .. {last:g} (one class per integer)"
        return (
            f"{self.num_classes} classes: bins of width {self.width:g} from {self.lo:g} "
            f"(class 0 = {first:g}, class {self.num_classes - 1} = {last:g}, the bin centres)"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LabelClasses) and (self.lo, self.width, self.num_classes) == (
            other.lo,
            other.width,
            other.num_classes,
        )

    def __hash__(self) -> int:
        return hash((self.lo, self.width, self.num_classes))

    def __repr__(self) -> str:
        return f"LabelClasses(lo={self.lo!r}, width={self.width!r}, num_classes={self.num_classes})"
