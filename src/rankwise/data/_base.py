"""Containers, the dataset registry, DIR-style splits and label histograms.

Only ``numpy`` and ``torch`` are imported here; every loader that needs an optional dependency
(torchvision, PIL, scikit-learn) imports it inside the function that uses it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, NamedTuple, TypeVar

import numpy as np
import torch
from torch.utils.data import Dataset

from rankwise._binning import check_bin_span, label_bins_np
from rankwise.data._spec import DATASETS, register_dataset

__all__ = [
    "DATASETS",
    "ClassificationData",
    "DataFileNotFoundError",
    "DataFormatError",
    "LabelHistogram",
    "RegressionData",
    "TensorPairDataset",
    "dataset_info",
    "dir_split",
    "get_dataset",
    "label_bins",
    "label_histogram",
    "list_datasets",
    "random_split_indices",
    "register_dataset",
    "standardize",
    "suggest_bin_width",
    "suggest_shot_thresholds",
]

F = TypeVar("F", bound=Callable[..., Any])


class DataFormatError(ValueError):
    """Bad data in a file: the message names the file and the (1-based, header = line 1) row.

    ``DataFormatError(path, row, message)`` reads ``"{path}, row {row}: {message}"`` (``row``
    None: ``"{path}: {message}"``); ``path`` and ``row`` are kept as attributes. Every loader
    in :mod:`rankwise.data` raises it (or :class:`DataFileNotFoundError`) for a bad data file,
    with a one-line message.

    A single argument is taken as the whole message (``path`` and ``row`` are then None). That is
    how torch's ``DataLoader`` re-raises an error from a worker process (``type(err)(traceback)``):
    the one-line message is recovered from the traceback's last line and the traceback text is
    kept in ``worker_traceback``.
    """

    def __init__(self, path: str | Path, row: int | None = None, message: str | None = None) -> None:
        self.worker_traceback: str | None = None
        if message is None:
            text = str(path)
            if text.startswith("Caught ") and "Traceback" in text:  # re-raised from a DataLoader worker
                self.worker_traceback = text
                last = text.rstrip().splitlines()[-1]
                found = re.match(rf"[\w.]*{type(self).__name__}: (.*)", last)
                text = found.group(1) if found else last
            super().__init__(text)
            self.path: str | None = None
            self.row = row
            return
        where = f"{path}" if row is None else f"{path}, row {row}"
        super().__init__(f"{where}: {message}")
        self.path = str(path)
        self.row = row


class DataFileNotFoundError(DataFormatError, FileNotFoundError):
    """A data file or folder that does not exist (also a :class:`FileNotFoundError`)."""


@dataclass
class RegressionData:
    """A regression dataset split into train / val / test.

    Items of ``train``/``val``/``test`` are ``(x, y)``: ``x`` is a float tensor of shape ``(D,)``
    (``modality="table"``), ``(C, H, W)`` (``"images"``), a pair of ``int64`` token-id tensors
    (``"text_pairs"``, batch them with :func:`rankwise.data.collate_text_pairs`, also in
    ``meta["collate_fn"]``) or a dict ``{"volume": (1, D, H, W), "sex": (2,)}`` (``"volumes"``, MRI
    from :func:`rankwise.data.load_nifti_csv`); ``y`` is a float32 scalar tensor. The ``*_labels`` arrays are the
    same labels as float64 numpy arrays (for LDS weights and shot metrics).

    ``meta`` holds loader-specific extras; common keys: ``"split"`` (the split rule),
    ``"seed"``, ``"source"``, ``"indices"`` (row indices of each split in the source file),
    ``"collate_fn"`` (text pairs), ``"backbone_options"`` (options the matching backbone needs,
    e.g. ``vocab_size``), ``"feature_names"`` (tabular), ``"image_size"`` (images).
    """

    name: str
    train: Dataset
    val: Dataset
    test: Dataset
    train_labels: np.ndarray
    val_labels: np.ndarray
    test_labels: np.ndarray
    #: what the items are (one of :data:`rankwise.data.MODALITIES`)
    modality: Literal["table", "images", "text_pairs", "volumes"]
    input_dim: int | None
    bin_width: float
    label_name: str
    meta: dict[str, Any] = field(default_factory=dict)
    #: ``(many_shot, few_shot)`` training counts per bin that define the shot groups (a bin is
    #: many-shot above the first, few-shot below the second); ``None``: derive them from the
    #: training labels with :func:`suggest_shot_thresholds`. The DIR benchmarks use ``(100, 20)``.
    shot_thresholds: tuple[float, float] | None = None
    #: unit of the label for plot axes ("years"), "" when it has none
    label_unit: str = ""
    #: longer name of the label for plot axes ("similarity score"), "" to use ``label_name``
    label_description: str = ""

    @property
    def label_axis(self) -> str:
        """The label's axis title in plots: ``"age (years)"``, ``"similarity score (0-5)"``, ``"y"``."""
        name = self.label_description or self.label_name
        return f"{name} ({self.label_unit})" if self.label_unit else name

    def sizes(self) -> tuple[int, int, int]:
        """``(len(train), len(val), len(test))``."""
        return len(self.train_labels), len(self.val_labels), len(self.test_labels)


@dataclass
class ClassificationData:
    """A classification dataset (items ``(x, y)`` with ``y`` an int64 scalar tensor)."""

    name: str
    train: Dataset
    test: Dataset
    val: Dataset | None
    num_classes: int
    image_shape: tuple[int, int, int]
    train_targets: np.ndarray
    test_targets: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)
    #: the dataset's modality (:data:`rankwise.data.MODALITIES`)
    modality: ClassVar[str] = "classes"


class TensorPairDataset(Dataset):
    """``(x[i], y[i])`` over two tensors with the same first dimension."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"`x` and `y` must have the same length, got {x.shape[0]} and {y.shape[0]}")
        self.x = x
        self.y = y

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]


# --------------------------------------------------------------------------------------------- registry


def get_dataset(name: str, **options: Any) -> RegressionData | ClassificationData:
    """Load the registered dataset ``name`` with keyword ``options`` (see :func:`dataset_info`).

    Example:
        >>> from rankwise.data import get_dataset
        >>> data = get_dataset("abalone", seed=0)
        >>> data.sizes()
        (3813, 182, 182)
    """
    return DATASETS.get(name)(**options)


def list_datasets() -> list[str]:
    """Names of the registered datasets, sorted."""
    return DATASETS.names()


def dataset_info(name: str) -> str:
    """The loader's docstring (description, options, sizes) for ``rankwise data show``."""
    fn = DATASETS.get(name)
    import inspect

    return inspect.cleandoc(fn.__doc__ or name)


# --------------------------------------------------------------------------------------------- labels


def label_bins(labels: np.ndarray, bin_width: float) -> np.ndarray:
    """Integer bin index ``floor(label / bin_width)`` of each label, the same for every label dtype.

    A label less than ``bin_width / 1024`` below a bin edge counts as lying on it, so ``0.3`` with
    ``bin_width=0.1`` is bin 3 (plain ``floor(0.3 / 0.1)`` gives 2) and a float32 ``0.7``
    (``0.699999988``) is bin 7 like the float64 ``0.7``. This is the one rule of every rankwise
    binning (LDS weights, FDS buckets, shot groups); see ``rankwise._binning``.

    Raises ``ValueError`` for NaN/inf labels and for labels ``2**53`` or more bin widths from 0.

    Example:
        >>> import numpy as np
        >>> label_bins(np.float32([0.7, 3.8, 4.6]), 0.1).tolist()
        [7, 38, 46]
    """
    if not bin_width > 0 or not math.isfinite(bin_width):
        raise ValueError(f"`bin_width` must be finite and > 0, got {bin_width!r}")
    return label_bins_np(labels, float(bin_width))


def suggest_bin_width(labels: np.ndarray | Sequence[float]) -> float:
    r"""A label bin width for LDS, FDS and the shot groups when the data do not define one.

    About :math:`\sqrt{N}` bins (at least 10, at most 100) over the range of the ``N`` labels,
    the width rounded to the nearest 1, 2 or 5 times a power of ten; never below 1 when every label
    is an integer (counts, ages in years, ratings). So a few hundred labels get bins holding about
    :math:`\sqrt{N}` labels each on average, instead of one bin per distinct value.

    Example:
        >>> suggest_bin_width(np.arange(25.0, 347.0))  # 322 integer labels, like sklearn's diabetes
        20.0
        >>> suggest_bin_width(np.linspace(0.0, 5.0, 5000))  # scores in [0, 5]
        0.05
        >>> suggest_bin_width(np.arange(1.0, 30.0).repeat(100))  # integer labels 1..29
        1.0
    """
    lab = np.asarray(labels, dtype=np.float64).reshape(-1)
    if lab.size == 0 or not np.isfinite(lab).all():
        raise ValueError("`labels` must be a non-empty array of finite values")
    span = float(lab.max() - lab.min())
    integer = bool(np.all(lab == np.round(lab)))
    if span == 0:
        return 1.0
    n_bins = min(max(round(math.sqrt(lab.size)), 10), 100)
    raw = span / n_bins
    exponent = math.floor(math.log10(raw))
    candidates = [m * 10.0**e for e in (exponent - 1, exponent, exponent + 1) for m in (1, 2, 5)]
    width = min(candidates, key=lambda c: abs(math.log(c / raw)))
    width = float(f"{width:.12g}")  # 0.05, not 0.05000000000000001
    return max(width, 1.0) if integer else width


def suggest_shot_thresholds(train_labels: np.ndarray | Sequence[float], bin_width: float) -> tuple[float, float]:
    """``(many_shot, few_shot)`` training counts relative to the data: the mean count of an occupied bin
    and a fifth of it.

    A bin is then many-shot when it holds more training labels than the average occupied bin and
    few-shot when it holds fewer than a fifth of that average, the 5 : 1 ratio of the DIR
    benchmarks' fixed thresholds (many > 100, few < 20 training images per age, for about 126
    images per age in AgeDB-DIR). Fixed thresholds of 100 and 20 make every bin of a dataset with a
    few hundred rows few-shot.

    Example:
        >>> suggest_shot_thresholds(np.array([1.0] * 60 + [2.0] * 30 + [3.0] * 3), 1.0)
        (31.0, 6.2)
    """
    bins = label_bins(np.asarray(train_labels, dtype=np.float64).reshape(-1), bin_width)
    if bins.size == 0:
        raise ValueError("`train_labels` must not be empty")
    mean = bins.size / np.unique(bins).size
    return float(mean), float(mean / 5)


class LabelHistogram(NamedTuple):
    """Counts of labels in contiguous bins ``[edges[i], edges[i + 1])`` (like ``np.histogram``)."""

    edges: np.ndarray  # float64 (n_bins + 1,)
    counts: np.ndarray  # int64 (n_bins,)


def label_histogram(labels: np.ndarray | Sequence[float], bin_width: float) -> LabelHistogram:
    """Histogram of ``labels`` in bins of width ``bin_width`` aligned to multiples of it.

    Bins run contiguously from the lowest to the highest occupied bin (empty bins in between are
    kept, with count 0); bin ``k`` is ``[k * bin_width, (k + 1) * bin_width)``. An empty
    ``labels`` gives empty arrays.

    Example:
        >>> import numpy as np
        >>> h = label_histogram(np.array([1.0, 1.5, 3.2]), 1.0)
        >>> h.edges.tolist(), h.counts.tolist()
        ([1.0, 2.0, 3.0, 4.0], [2, 0, 1])
    """
    lab = np.asarray(labels, dtype=np.float64).reshape(-1)
    if lab.size and not np.isfinite(lab).all():
        raise ValueError("`labels` must be finite, got NaN or inf values")
    bins = label_bins(lab, bin_width)
    if bins.size == 0:
        return LabelHistogram(np.zeros(0, dtype=np.float64), np.zeros(0, dtype=np.int64))
    lo, hi = int(bins.min()), int(bins.max())
    check_bin_span(lo, hi, what=f"`labels` with `bin_width`={bin_width!r}")
    counts = np.bincount(bins - lo, minlength=hi - lo + 1).astype(np.int64)
    edges = np.arange(lo, hi + 2, dtype=np.float64) * bin_width
    return LabelHistogram(edges, counts)


# --------------------------------------------------------------------------------------------- splits


def dir_split(
    labels: np.ndarray, *, per_label: int, seed: int, bin_width: float | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Balanced DIR-style split: ``(train_idx, val_idx, test_idx)``, each sorted.

    Labels are grouped by exact value (or by :func:`label_bins` when ``bin_width`` is given).
    For a group of ``c`` examples, ``n = min(per_label, c // 3)`` examples go to val and ``n``
    others to test, drawn uniformly at random (seeded); the rest is train. So val and test are
    balanced (at most ``per_label`` per label) and every label keeps at least as many training
    examples as it has in val or test; groups with fewer than 3 examples are train only. This
    is exactly the rule behind the AgeDB-DIR split file (``per_label=30``).
    """
    if isinstance(per_label, bool) or not isinstance(per_label, int) or per_label < 0:
        raise ValueError(f"`per_label` must be an int >= 0, got {per_label!r}")
    lab = np.asarray(labels, dtype=np.float64).reshape(-1)
    keys = label_bins(lab, bin_width) if bin_width is not None else lab
    rng = np.random.default_rng(seed)
    _, inverse = np.unique(keys, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    counts = np.bincount(inverse)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    val: list[np.ndarray] = []
    test: list[np.ndarray] = []
    for start, c in zip(starts, counts):
        n = min(per_label, int(c) // 3)
        if n == 0:
            continue
        members = rng.permutation(order[start : start + c])
        val.append(members[:n])
        test.append(members[n : 2 * n])
    val_idx = np.sort(np.concatenate(val)) if val else np.zeros(0, dtype=np.int64)
    test_idx = np.sort(np.concatenate(test)) if test else np.zeros(0, dtype=np.int64)
    mask = np.ones(lab.size, dtype=bool)
    mask[val_idx] = False
    mask[test_idx] = False
    return np.flatnonzero(mask), val_idx.astype(np.int64), test_idx.astype(np.int64)


def random_split_indices(
    n: int, *, val_fraction: float, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seeded random ``(train_idx, val_idx, test_idx)`` (each sorted) of ``range(n)``.

    Val and test get ``round(fraction * n)`` examples each; train keeps the rest.
    """
    for name, frac in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not 0.0 <= frac < 1.0:
            raise ValueError(f"`{name}` must be in [0, 1), got {frac!r}")
    n_val, n_test = round(val_fraction * n), round(test_fraction * n)
    if n_val + n_test >= n:
        raise ValueError(
            f"`val_fraction` + `test_fraction` leave no training rows: {n} rows, {n_val} val + {n_test} test"
        )
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[n_val + n_test :]), np.sort(perm[:n_val]), np.sort(perm[n_val : n_val + n_test])


def standardize(
    x: np.ndarray, train_idx: np.ndarray, columns: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Standardize ``columns`` of ``x`` with the mean/std of the TRAIN rows (std 0 -> 1).

    Returns ``(x_standardized, mean, std)``; ``mean``/``std`` cover all columns (0 and 1 for
    columns left untouched).
    """
    x = np.array(x, dtype=np.float64)  # a contiguous copy, standardised in place
    d = x.shape[1]
    cols = np.arange(d) if columns is None else np.asarray(columns)
    mean = np.zeros(d)
    std = np.ones(d)
    if len(train_idx) and cols.size:
        train = x[train_idx] if columns is None else x[train_idx][:, cols]
        mean[cols] = train.mean(axis=0)
        s = train.std(axis=0)
        std[cols] = np.where(s > 0, s, 1.0)
    x -= mean
    x /= std
    return x, mean, std
