"""Image classification datasets from the user's disk: an image folder or a CIFAR-format pickle dir.

Both load every image into memory as float32 tensors in [0, 1] (fine for the small datasets the
contrastive recipe is meant for) and return a :class:`~rankwise.data.ClassificationData`.
"""

from __future__ import annotations

import functools
import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rankwise.data._base import ClassificationData, DataFormatError, TensorPairDataset, register_dataset
from rankwise.data._files import check_dir, read_bytes
from rankwise.data.images import open_rgb_image
from rankwise.data.mnist import stratified_split

__all__ = ["class_image_transform", "load_cifar_dir", "load_image_folder"]


def _split(
    name: str,
    x: torch.Tensor,
    y: np.ndarray,
    classes: list[str],
    test_fraction: float,
    seed: int,
    meta: dict[str, Any],
    paths: list[str] | None = None,
) -> ClassificationData:
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"`test_fraction` must be in (0, 1), got {test_fraction!r}")
    test_idx = stratified_split(y, test_fraction, np.random.default_rng(seed))
    train_idx = np.setdiff1d(np.arange(len(y)), test_idx)
    if len(train_idx) == 0 or len(test_idx) == 0:
        raise DataFormatError(
            meta["source"],
            None,
            f"{len(y)} image(s) are too few: test_fraction={test_fraction} gives {len(train_idx)} train and "
            f"{len(test_idx)} test images, and both splits need at least one",
        )
    train_paths = None if paths is None else [paths[i] for i in train_idx]
    return _make(name, x[train_idx], y[train_idx], x[test_idx], y[test_idx], classes, meta, train_paths)


def _make(
    name: str,
    xtr: torch.Tensor,
    ytr: np.ndarray,
    xte: torch.Tensor,
    yte: np.ndarray,
    classes: list[str],
    meta: dict[str, Any],
    train_paths: list[str] | None = None,
) -> ClassificationData:
    c, h, w = (int(s) for s in xtr.shape[1:])
    if train_paths is not None:  # the file of each training item, relative to the dataset's root
        meta = {**meta, "train_paths": train_paths}
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


def class_image_transform(image_size: int | tuple[int, int], *, grayscale: bool) -> Any:
    """How :func:`load_image_folder` turns an image opened by :func:`~rankwise.data.images.open_rgb_image`
    (RGB PIL) into its items: one grey channel (``grayscale``; ITU-R 601-2 luma, so a grey image keeps its
    values) or RGB, resized (bilinear) to ``image_size`` (``S`` or ``(H, W)``), float32 ``(C, H, W)`` =
    8-bit values / 255 (torchvision v2, imported lazily)."""
    from torchvision.transforms import v2 as T

    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    tf = [T.Grayscale()] if grayscale else [T.RGB()]
    tf += [T.Resize(size), T.ToImage(), T.ToDtype(torch.float32, scale=True)]
    return T.Compose(tf)


def _read_folder(
    root: Path, image_size: int, grayscale: bool
) -> tuple[torch.Tensor, np.ndarray, list[str], list[Path]]:
    from torchvision.datasets import ImageFolder

    try:
        ds = ImageFolder(
            str(root), transform=class_image_transform(image_size, grayscale=grayscale), loader=open_rgb_image
        )
    except FileNotFoundError as err:  # no class folder, or class folders without images
        raise DataFormatError(root, None, f"no images found: {err}") from None
    if len(ds) == 0:
        raise DataFormatError(root, None, "no images found")
    xs, ys = zip(*(ds[i] for i in range(len(ds))), strict=True)
    paths = [Path(p) for p, _ in ds.samples]
    return torch.stack(xs), np.asarray(ys, dtype=np.int64), list(ds.classes), paths


@register_dataset("image_folder", modality="classes")
def load_image_folder(
    *, root: str | Path, image_size: int = 28, grayscale: bool = False, test_fraction: float = 0.2, seed: int = 0
) -> ClassificationData:
    """Images in ``root/<class>/*.png|jpg`` (torchvision ``ImageFolder``), resized to ``image_size``.

    If ``root`` has ``train/`` and ``test/`` subfolders they are the splits (same class folders);
    otherwise a stratified, seeded ``test_fraction`` is held out. Items: float32 ``(C, S, S)`` in
    [0, 1] (``C`` = 1 with ``grayscale=True``, else 3; :func:`class_image_transform`) and the int64
    class index; ``meta["classes"]``: the class folders' names, ``meta["train_paths"]``: the file of
    each training item, relative to ``root`` (``/``-separated).
    """
    root = check_dir(root)
    if (root / "train").is_dir() and (root / "test").is_dir():
        xtr, ytr, classes, ptr = _read_folder(root / "train", image_size, grayscale)
        xte, yte, cte, _ = _read_folder(root / "test", image_size, grayscale)
        if cte != classes:
            raise DataFormatError(
                root, None, f"train/ and test/ must have the same class folders, got {classes} and {cte}"
            )
        meta = {"source": str(root), "split": "train/ test/"}
        return _make("image_folder", xtr, ytr, xte, yte, classes, meta, _relative(ptr, root))
    x, y, classes, paths = _read_folder(root, image_size, grayscale)
    meta = {"source": str(root), "split": f"stratified test_fraction={test_fraction}, seed={seed}"}
    return _split("image_folder", x, y, classes, test_fraction, seed, meta, _relative(paths, root))


def _relative(paths: list[Path], root: Path) -> list[str]:
    return [p.relative_to(root).as_posix() for p in paths]


# --------------------------------------------------------------------------------------------- CIFAR pickles
#
# The CIFAR "python version" batches are pickles: a dict of bytes keys, a uint8 numpy array and
# lists of ints/bytes. ``pickle.load`` would run any callable a crafted file names, so they are
# read with an unpickler that resolves only the globals such a batch needs: numpy's ndarray/dtype
# reconstruction (numpy 1 and 2 module names, pickle protocols 2 to 5), numpy scalars, and
# ``_codecs.encode`` restricted to Latin-1 (how protocol 2 stores bytes). Dtypes are limited to
# plain numbers. Anything else is refused before it is called.

_NUMERIC_DTYPES = frozenset(
    f"{kind}{size}" for kind, sizes in (("u", (1, 2, 4, 8)), ("i", (1, 2, 4, 8)), ("f", (2, 4, 8))) for size in sizes
) | {"b1"}


def _numeric_dtype(name: Any, align: Any = False, copy: Any = True) -> np.dtype:
    text = name.decode("latin-1") if isinstance(name, bytes) else name
    if not isinstance(text, str) or text.lstrip("<>|=") not in _NUMERIC_DTYPES:
        raise pickle.UnpicklingError(f"numpy dtype {name!r} is not allowed (only plain numeric dtypes)")
    return np.dtype(text)


def _latin1_encode(text: Any, encoding: Any = "latin1") -> bytes:
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"_codecs.encode({type(text).__name__}, {encoding!r}) is not allowed")
    return text.encode("latin-1")


@functools.lru_cache(maxsize=1)
def _allowed_globals() -> dict[tuple[str, str], Any]:
    array = np.zeros(1, dtype=np.uint8)
    reconstruct = array.__reduce__()[0]  # numpy.(_)core.multiarray._reconstruct
    frombuffer = array.__reduce_ex__(5)[0]  # numpy.(_)core.numeric._frombuffer
    scalar = np.uint8(0).__reduce__()[0]  # numpy.(_)core.multiarray.scalar
    out: dict[tuple[str, str], Any] = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): _numeric_dtype}
    for core in ("numpy.core", "numpy._core"):
        out[(f"{core}.multiarray", "_reconstruct")] = reconstruct
        out[(f"{core}.multiarray", "scalar")] = scalar
        out[(f"{core}.numeric", "_frombuffer")] = frombuffer
    for codecs in ("_codecs", "codecs"):
        out[(codecs, "encode")] = _latin1_encode
    return out


class _CifarUnpickler(pickle.Unpickler):
    """Unpickler resolving only the globals of a CIFAR batch (see above); nothing else is callable."""

    def find_class(self, module: str, name: str) -> Any:
        found = _allowed_globals().get((module, name))
        if found is None:
            raise pickle.UnpicklingError(
                f"refusing to load '{module}.{name}': a CIFAR batch holds only numpy arrays, numbers and strings"
            )
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refusing a persistent id: a CIFAR batch holds only numpy arrays and lists")


def _read_pickle(path: Path) -> dict[str, Any]:
    """A CIFAR pickle as a dict with str keys; anything else (or a refused global) is a DataFormatError."""
    data = read_bytes(path, "CIFAR pickle")
    if not data:
        raise DataFormatError(path, None, "the file is empty")
    try:
        obj = _CifarUnpickler(io.BytesIO(data), encoding="bytes").load()
    except pickle.UnpicklingError as err:
        raise DataFormatError(path, None, f"not a CIFAR pickle: {err}") from None
    except (EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, MemoryError) as err:
        raise DataFormatError(path, None, f"not a valid CIFAR pickle ({type(err).__name__}: {err})") from None
    if not isinstance(obj, dict):
        raise DataFormatError(path, None, f"expected a CIFAR pickle holding a dict, got {type(obj).__name__}")
    return {k.decode("latin-1") if isinstance(k, bytes) else str(k): v for k, v in obj.items()}


def _int_array(value: Any, path: Path, key: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype.kind not in "iub":
        raise DataFormatError(path, None, f"{key!r} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64)


def _load_pickle(path: Path) -> tuple[np.ndarray, np.ndarray]:
    d = _read_pickle(path)
    key = "labels" if "labels" in d else "fine_labels" if "fine_labels" in d else None
    if key is None or "data" not in d:
        raise DataFormatError(
            path, None, f"expected a CIFAR pickle with 'data' and 'labels' (or 'fine_labels'), got {list(d)}"
        )
    data = _int_array(d["data"], path, "data")
    if data.ndim != 2 or data.shape[1] % 3 or data.shape[0] == 0:
        raise DataFormatError(path, None, f"'data' must have shape (N, 3*H*W) with N >= 1, got {data.shape}")
    side = round((data.shape[1] // 3) ** 0.5)
    if 3 * side * side != data.shape[1]:
        raise DataFormatError(path, None, f"'data' rows of {data.shape[1]} values are not 3 square channels (3*H*H)")
    if data.min() < 0 or data.max() > 255:
        raise DataFormatError(path, None, f"'data' values must be in 0..255, got {data.min()}..{data.max()}")
    labels = _int_array(d[key], path, key).reshape(-1)
    if labels.shape[0] != data.shape[0]:
        raise DataFormatError(path, None, f"{labels.shape[0]} {key} for {data.shape[0]} images")
    if labels.min() < 0:
        raise DataFormatError(path, None, f"{key!r} must be >= 0, got {labels.min()}")
    return data.astype(np.uint8), labels


def _class_names(root: Path, k: int) -> list[str]:
    """Names from ``batches.meta`` (CIFAR-10 ``label_names``) or ``meta`` (CIFAR-100 ``fine_label_names``)."""
    for fname, key in (("batches.meta", "label_names"), ("meta", "fine_label_names")):
        meta_file = root / fname
        if meta_file.is_file():
            names = _read_pickle(meta_file).get(key)
            if isinstance(names, (list, tuple)) and len(names) >= k:
                return [n.decode("utf-8", "replace") if isinstance(n, bytes) else str(n) for n in names]
    return [str(i) for i in range(k)]


@register_dataset("cifar_dir", modality="classes")
def load_cifar_dir(*, root: str | Path) -> ClassificationData:
    """A CIFAR-10/100 "python version" directory: ``data_batch_*`` (or ``train``) and ``test_batch`` (or ``test``).

    Items: float32 ``(3, H, W)`` in [0, 1] (``H = W = sqrt(row length / 3)``, 32 for CIFAR) and the
    int64 label (``fine_labels`` for CIFAR-100). Class names come from ``batches.meta``
    (``meta`` for CIFAR-100) when present. Nothing is downloaded.

    The pickles are read with a restricted unpickler: only numpy array reconstruction, numbers,
    strings and lists are admitted, so a crafted file cannot run code; it raises
    :class:`~rankwise.data.DataFormatError` naming the file, as does a truncated, empty or
    malformed batch (labels count, 0..255 pixel values, square 3-channel images). A missing
    ``root`` raises :class:`~rankwise.data.DataFileNotFoundError`.
    """
    root = check_dir(root)
    train_files = sorted(p for p in root.glob("data_batch_*") if p.is_file())
    train_files = train_files or ([root / "train"] if (root / "train").is_file() else [])
    test_file = root / "test_batch" if (root / "test_batch").is_file() else root / "test"
    if not train_files or not test_file.is_file():
        raise DataFormatError(
            root, None, "no CIFAR pickle files: expected data_batch_* (or train) and test_batch (or test)"
        )
    parts = [_load_pickle(p) for p in train_files]
    widths = {p.name: part[0].shape[1] for p, part in zip(train_files, parts)}
    xte, yte = _load_pickle(test_file)
    widths[test_file.name] = xte.shape[1]
    if len(set(widths.values())) > 1:
        raise DataFormatError(root, None, f"the CIFAR files have different image sizes (values per row: {widths})")
    xtr, ytr = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    side = round((xtr.shape[1] // 3) ** 0.5)

    def img(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a.reshape(-1, 3, side, side).astype(np.float32) / 255.0)

    k = int(max(ytr.max(initial=0), yte.max(initial=0))) + 1
    classes = _class_names(root, k)
    return _make("cifar_dir", img(xtr), ytr, img(xte), yte, classes, {"source": str(root), "split": "CIFAR files"})
