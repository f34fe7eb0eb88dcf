"""Image classification datasets from the user's disk: an image folder or a CIFAR-format pickle dir.

Both load every image into memory as float32 tensors in [0, 1] (fine for the small datasets the
contrastive recipe is meant for) and return a :class:`~rankwise.data.ClassificationData`.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rankwise.data._base import ClassificationData, TensorPairDataset, register_dataset
from rankwise.data.mnist import _stratified_split

__all__ = ["load_cifar_dir", "load_image_folder"]


def _split(
    name: str, x: torch.Tensor, y: np.ndarray, classes: list[str], test_fraction: float, seed: int, meta: dict[str, Any]
) -> ClassificationData:
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"`test_fraction` must be in (0, 1), got {test_fraction!r}")
    test_idx = _stratified_split(y, test_fraction, np.random.default_rng(seed))
    train_idx = np.setdiff1d(np.arange(len(y)), test_idx)
    return _make(name, x[train_idx], y[train_idx], x[test_idx], y[test_idx], classes, meta)


def _make(
    name: str,
    xtr: torch.Tensor,
    ytr: np.ndarray,
    xte: torch.Tensor,
    yte: np.ndarray,
    classes: list[str],
    meta: dict[str, Any],
) -> ClassificationData:
    c, h, w = (int(s) for s in xtr.shape[1:])
    return ClassificationData(
        name=name,
        train=TensorPairDataset(xtr, torch.from_numpy(ytr)),
        test=TensorPairDataset(xte, torch.from_numpy(yte)),
        val=None,
        num_classes=len(classes),
        image_shape=(c, h, w),
        train_targets=ytr.copy(),
        test_targets=yte.copy(),
        meta={**meta, "classes": classes, "backbone_options": {"in_channels": c}},
    )


def _read_folder(root: Path, image_size: int, grayscale: bool) -> tuple[torch.Tensor, np.ndarray, list[str]]:
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import v2 as T

    tf = [T.Grayscale()] if grayscale else [T.RGB()]
    tf += [T.Resize((image_size, image_size)), T.ToImage(), T.ToDtype(torch.float32, scale=True)]
    ds = ImageFolder(str(root), transform=T.Compose(tf))
    if len(ds) == 0:
        raise ValueError(f"`root`: no images found under {root}")
    xs, ys = zip(*(ds[i] for i in range(len(ds))), strict=True)
    return torch.stack(xs), np.asarray(ys, dtype=np.int64), list(ds.classes)


@register_dataset("image_folder")
def load_image_folder(
    *, root: str | Path, image_size: int = 28, grayscale: bool = False, test_fraction: float = 0.2, seed: int = 0
) -> ClassificationData:
    """Images in ``root/<class>/*.png|jpg`` (torchvision ``ImageFolder``), resized to ``image_size``.

    If ``root`` has ``train/`` and ``test/`` subfolders they are the splits (same class folders);
    otherwise a stratified, seeded ``test_fraction`` is held out. Items: float32 ``(C, S, S)`` in
    [0, 1] (``C`` = 1 with ``grayscale=True``, else 3) and the int64 class index.
    """
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"`root` must be an existing directory, got {str(root)!r}")
    if (root / "train").is_dir() and (root / "test").is_dir():
        xtr, ytr, classes = _read_folder(root / "train", image_size, grayscale)
        xte, yte, cte = _read_folder(root / "test", image_size, grayscale)
        if cte != classes:
            raise ValueError(f"`root`: train/ and test/ must have the same class folders, got {classes} and {cte}")
        return _make("image_folder", xtr, ytr, xte, yte, classes, {"source": str(root), "split": "train/ test/"})
    x, y, classes = _read_folder(root, image_size, grayscale)
    meta = {"source": str(root), "split": f"stratified test_fraction={test_fraction}, seed={seed}"}
    return _split("image_folder", x, y, classes, test_fraction, seed, meta)


def _load_pickle(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as fh:
        d = pickle.load(fh, encoding="bytes")
    d = {k.decode() if isinstance(k, bytes) else k: v for k, v in d.items()}
    key = "labels" if "labels" in d else "fine_labels" if "fine_labels" in d else None
    if key is None or "data" not in d:
        raise ValueError(f"{path}: expected a CIFAR pickle with 'data' and 'labels' (or 'fine_labels'), got {list(d)}")
    data = np.asarray(d["data"], dtype=np.uint8)
    if data.ndim != 2 or data.shape[1] % 3:
        raise ValueError(f"{path}: 'data' must have shape (N, 3*H*W), got {data.shape}")
    return data, np.asarray(d[key], dtype=np.int64)


@register_dataset("cifar_dir")
def load_cifar_dir(*, root: str | Path) -> ClassificationData:
    """A CIFAR-10/100 "python version" directory: ``data_batch_*`` (or ``train``) and ``test_batch`` (or ``test``).

    Items: float32 ``(3, H, W)`` in [0, 1] (``H = W = sqrt(row length / 3)``, 32 for CIFAR) and the
    int64 label (``fine_labels`` for CIFAR-100). Class names come from ``batches.meta`` when present.
    Nothing is downloaded.
    """
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"`root` must be an existing directory, got {str(root)!r}")
    train_files = sorted(root.glob("data_batch_*")) or ([root / "train"] if (root / "train").is_file() else [])
    test_file = root / "test_batch" if (root / "test_batch").is_file() else root / "test"
    if not train_files or not test_file.is_file():
        raise ValueError(f"`root`: {root} has no data_batch_*/train and test_batch/test CIFAR pickle files")
    parts = [_load_pickle(p) for p in train_files]
    xtr, ytr = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    xte, yte = _load_pickle(test_file)
    side = round((xtr.shape[1] // 3) ** 0.5)

    def img(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a.reshape(-1, 3, side, side).astype(np.float32) / 255.0)

    k = int(max(ytr.max(initial=0), yte.max(initial=0))) + 1
    classes = [str(i) for i in range(k)]
    meta_file = root / "batches.meta"
    if meta_file.is_file():
        with open(meta_file, "rb") as fh:
            m = pickle.load(fh, encoding="bytes")
        names = m.get(b"label_names") or m.get("label_names")
        if names and len(names) >= k:
            classes = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    return _make("cifar_dir", img(xtr), ytr, img(xte), yte, classes, {"source": str(root), "split": "CIFAR files"})
