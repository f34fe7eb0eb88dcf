"""DIR image datasets from the user's disk (AgeDB-DIR, IMDB-WIKI-DIR split files + images)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from rankwise._validation import check_positive_int
from rankwise.data._base import DataFileNotFoundError, DataFormatError, RegressionData, register_dataset
from rankwise.data._files import check_dir, check_header, csv_records, note_read, parse_number, read_text

__all__ = [
    "DIRImageDataset",
    "ImageRows",
    "dir_image_transforms",
    "dir_images",
    "load_agedb_dir",
    "load_image_csv",
    "load_imdb_wiki_dir",
    "read_image_rows",
]

_SPLITS = ("train", "val", "test")


def dir_image_transforms(image_size: int = 224) -> tuple[Callable[[Any], torch.Tensor], Callable[[Any], torch.Tensor]]:
    """The DIR papers' ``(train_transform, eval_transform)`` (torchvision, imported lazily).

    Train: ``Resize((s, s))``, ``RandomCrop(s, padding=16)``, ``RandomHorizontalFlip()``,
    ``ToTensor()``, ``Normalize(0.5, 0.5)`` per channel; eval: ``Resize((s, s))``, ``ToTensor()``,
    ``Normalize(0.5, 0.5)``. Output: float32 ``(3, s, s)`` in [-1, 1].
    """
    try:
        from torchvision import transforms as T
    except ImportError:
        raise ImportError("DIR image datasets need torchvision: `pip install torchvision`") from None
    size = (image_size, image_size)
    norm = T.Normalize(mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5])
    train = T.Compose(
        [T.Resize(size), T.RandomCrop(image_size, padding=16), T.RandomHorizontalFlip(), T.ToTensor(), norm]
    )
    evaluation = T.Compose([T.Resize(size), T.ToTensor(), norm])
    return train, evaluation


class DIRImageDataset(Dataset):
    """Images listed in a DIR split file: item ``(transform(PIL RGB image), float32 age)``.

    With ``transform=None`` (``labels_only=True`` loaders) the labels are available but reading
    an item raises a ``RuntimeError``.
    """

    def __init__(
        self,
        paths: list[Path],
        labels: np.ndarray,
        rows: list[int],
        csv_path: Path,
        transform: Callable[[Any], torch.Tensor] | None,
    ) -> None:
        self.paths = paths
        self.labels = torch.as_tensor(labels, dtype=torch.float32)
        self.rows = rows
        self.csv_path = csv_path
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.transform is None:
            raise RuntimeError("this dataset was loaded with labels_only=True: images are not available")
        image = open_rgb_image(self.paths[index], self.csv_path, self.rows[index])
        return self.transform(image), self.labels[index]


def open_rgb_image(path: str | Path, listed_in: Path | None = None, row: int | None = None) -> Any:
    """The image at ``path`` as an RGB PIL image; an unreadable, truncated or empty file raises
    :class:`~rankwise.data.DataFormatError` naming it (and the split file row that lists it)."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            return img.convert("RGB")
    except FileNotFoundError as err:
        if listed_in is None:
            raise DataFileNotFoundError(path, None, "image file not found") from err
        raise DataFileNotFoundError(listed_in, row, f"image file not found: {path}") from err
    except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError) as err:
        if listed_in is None:
            raise DataFormatError(path, None, f"cannot read the image: {err}") from err
        raise DataFormatError(listed_in, row, f"cannot read image {path}: {err}") from err


def dir_images(
    csv_path: str | Path,
    root: str | Path | None = None,
    *,
    image_size: int = 224,
    train_transform: Callable[[Any], torch.Tensor] | None = None,
    eval_transform: Callable[[Any], torch.Tensor] | None = None,
    labels_only: bool = False,
    check_files: bool = True,
    name: str | None = None,
) -> RegressionData:
    """A DIR image regression dataset from a split file ``age,path,split`` and an images root.

    ``csv_path`` is exactly the AgeDB-DIR / IMDB-WIKI-DIR split file (columns ``age``, ``path``,
    ``split`` in any order; ``split`` is ``train``/``val``/``test``); image ``path`` is relative
    to ``root`` (default: the CSV's folder). Images are read with PIL (RGB) and transformed by
    ``train_transform`` (train split) / ``eval_transform`` (val, test), by default the papers'
    transforms from :func:`dir_image_transforms` at ``image_size`` (224). ``labels_only=True``
    reads the labels only (no torchvision, no image files needed; items cannot be read).
    ``check_files=True`` checks up front that every image exists (error naming the CSV row).
    Every row is kept: a bad age (not a plain decimal number, not finite, beyond float32), split
    or empty path, a repeated column name, a non-UTF-8 or empty file raises
    :class:`~rankwise.data.DataFormatError` naming the file and the row; a missing split file,
    ``root`` or image raises :class:`~rankwise.data.DataFileNotFoundError`. An image that cannot
    be decoded raises :class:`~rankwise.data.DataFormatError` naming the split file, the row and
    the image when the item is read (also from a ``DataLoader`` worker). ``bin_width`` is 1 year.
    """
    csv_path = Path(csv_path)
    text = read_text(csv_path, "DIR split file")
    root_dir = Path(root) if root is not None else csv_path.parent
    check_positive_int(image_size, "image_size")
    if root is not None and not labels_only:
        check_dir(root_dir)
    per: dict[str, tuple[list[Path], list[float], list[int]]] = {s: ([], [], []) for s in _SPLITS}
    records = csv_records(text, csv_path)
    first = next(records, None)
    if first is None:
        raise DataFormatError(csv_path, None, "the file is empty")
    header = check_header(first[1], csv_path)
    missing = [c for c in ("age", "path", "split") if c not in header]
    if missing:
        raise DataFormatError(csv_path, first[0], f"missing column(s) {missing}; expected a header 'age,path,split'")
    ia, ip, isp = header.index("age"), header.index("path"), header.index("split")
    for row_no, row in records:
        if len(row) != len(header):
            raise DataFormatError(csv_path, row_no, f"expected {len(header)} fields, got {len(row)}")
        age = parse_number(row[ia], csv_path, row_no, "age")
        split = row[isp].strip()
        if split not in per:
            raise DataFormatError(csv_path, row_no, f"column 'split': expected one of {list(_SPLITS)}, got {split!r}")
        rel = row[ip].strip()
        if not rel:
            raise DataFormatError(csv_path, row_no, "column 'path' is empty")
        paths, ages, rows = per[split]
        paths.append(root_dir / rel)
        ages.append(age)
        rows.append(row_no)
    empty = [s for s in _SPLITS if not per[s][0]]
    if empty:
        raise DataFormatError(csv_path, None, f"no rows for split(s) {empty}")
    if not labels_only and check_files:
        for s in _SPLITS:
            check_image_files(csv_path, per[s][0], per[s][2])
    if labels_only:
        t_train: Callable[[Any], torch.Tensor] | None = None
        t_eval: Callable[[Any], torch.Tensor] | None = None
    else:
        default_train, default_eval = (None, None)
        if train_transform is None or eval_transform is None:
            default_train, default_eval = dir_image_transforms(image_size)
        t_train = train_transform or default_train
        t_eval = eval_transform or default_eval
    labels = {s: np.asarray(per[s][1], dtype=np.float64) for s in _SPLITS}
    datasets = {
        s: DIRImageDataset(per[s][0], labels[s], per[s][2], csv_path, t_train if s == "train" else t_eval)
        for s in _SPLITS
    }
    return RegressionData(
        name=name or csv_path.stem,
        train=datasets["train"],
        val=datasets["val"],
        test=datasets["test"],
        train_labels=labels["train"],
        val_labels=labels["val"],
        test_labels=labels["test"],
        modality="images",
        input_dim=None,
        bin_width=1.0,
        label_name="age",
        label_unit="years",
        meta={
            "csv": str(csv_path),
            "root": str(root_dir),
            "image_size": image_size,
            "image_shape": (3, image_size, image_size),
            "labels_only": labels_only,
            "split": "given by the split file",
        },
        shot_thresholds=(100, 20),  # the DIR benchmarks' many-shot > 100, few-shot < 20
    )


def check_image_files(csv_path: Path, paths: Sequence[Path], rows: Sequence[int]) -> None:
    """Every image of a list exists, else :class:`~rankwise.data.DataFileNotFoundError` naming the
    list, the row and the image."""
    for p, r in zip(paths, rows):
        if not p.is_file():
            raise DataFileNotFoundError(csv_path, r, f"image file not found: {p}")
        note_read(p)  # a run records the images it read (their fingerprints, in its data.json)


def image_list_records(
    csv_path: Path,
    image_column: str,
    root: str | Path | None,
    *,
    required: Sequence[str] = (),
    check_root: bool = True,
) -> tuple[Path, list[str], Iterator[tuple[int, list[str], Path]]]:
    """The images root, the header of a CSV list of images and its records ``(row number, fields,
    image path)``.

    Image paths are relative to ``root`` (default: the CSV's folder; checked to be a directory
    when given and ``check_root``). A missing column (``image_column`` or ``required``), a row with
    another number of fields than the header or an empty image path raises
    :class:`~rankwise.data.DataFormatError` naming the file (and the row).
    """
    text = read_text(csv_path, "image list")
    root_dir = Path(root) if root is not None else csv_path.parent
    if root is not None and check_root:
        check_dir(root_dir)
    records = csv_records(text, csv_path)
    first = next(records, None)
    if first is None:
        raise DataFormatError(csv_path, None, "the file is empty")
    header = check_header(first[1], csv_path)
    missing = [c for c in (image_column, *required) if c not in header]
    if missing:
        raise DataFormatError(csv_path, first[0], f"missing column(s) {missing}; the columns are {header}")
    ip = header.index(image_column)

    def rows() -> Iterator[tuple[int, list[str], Path]]:
        for row_no, row in records:
            if len(row) != len(header):
                raise DataFormatError(csv_path, row_no, f"expected {len(header)} fields, got {len(row)}")
            rel = row[ip].strip()
            if not rel:
                raise DataFormatError(csv_path, row_no, f"column {image_column!r} is empty")
            yield row_no, row, root_dir / rel

    return root_dir, header, rows()


@dataclass
class ImageRows:
    """A list of images read for prediction by :func:`read_image_rows`."""

    #: the file's column names, in its order
    header: list[str]
    #: every data row's fields as read (text)
    rows: list[list[str]]
    #: item ``(transform(image), nan)`` of each row, in the file's order
    dataset: DIRImageDataset


def read_image_rows(
    path: str | Path,
    transform: Callable[[Any], torch.Tensor],
    *,
    image_column: str = "path",
    root: str | Path | None = None,
) -> ImageRows:
    """The rows of a CSV list of images, read with the rules of :func:`load_image_csv` (image paths
    in ``image_column``, relative to ``root``, default the CSV's folder; every image must exist),
    and a dataset of their images through ``transform`` (labels NaN: the target column is not read).

    A missing column, a row with a wrong number of fields, an empty image path or a missing image
    raises :class:`~rankwise.data.DataFormatError` naming the file and the row (and the image);
    a file of a header only gives zero rows.
    """
    csv_path = Path(path)
    _, header, records = image_list_records(csv_path, image_column, root)
    rows: list[list[str]] = []
    paths: list[Path] = []
    numbers: list[int] = []
    for row_no, row, image in records:
        rows.append(row)
        paths.append(image)
        numbers.append(row_no)
    check_image_files(csv_path, paths, numbers)
    labels = np.full(len(rows), np.nan)
    return ImageRows(header, rows, DIRImageDataset(paths, labels, numbers, csv_path, transform))


def _resolve(csv: str | Path | None, root: str | Path | None, default_name: str) -> tuple[Path, Path | None]:
    if csv is not None:
        return Path(csv), Path(root) if root is not None else None
    if root is None:
        raise ValueError(f"pass `csv` (the split file, e.g. {default_name}) and `root` (the images folder)")
    return Path(root) / default_name, Path(root)


@register_dataset("agedb_dir", modality="images")
def load_agedb_dir(
    csv: str | Path | None = None,
    root: str | Path | None = None,
    *,
    image_size: int = 224,
    labels_only: bool = False,
    check_files: bool = True,
) -> RegressionData:
    """AgeDB-DIR (Yang et al. 2021) from the user's disk: split file ``agedb.csv`` + AgeDB images.

    Options: ``csv`` (default ``root/agedb.csv``), ``root`` (images root; paths in the CSV are
    relative to it, default the CSV's folder), ``image_size`` (224), ``labels_only``,
    ``check_files``. The official split: 12,208 / 2,140 / 2,140 images, ages 1..101 in train,
    val/test up to 30 per age; test shots: 51 many-shot ages (1,530 images), 16 medium (448),
    25 few (162). See :func:`rankwise.data.dir_images`.
    """
    c, r = _resolve(csv, root, "agedb.csv")
    return dir_images(c, r, image_size=image_size, labels_only=labels_only, check_files=check_files, name="agedb_dir")


@register_dataset("imdb_wiki_dir", modality="images")
def load_imdb_wiki_dir(
    csv: str | Path | None = None,
    root: str | Path | None = None,
    *,
    image_size: int = 224,
    labels_only: bool = False,
    check_files: bool = True,
) -> RegressionData:
    """IMDB-WIKI-DIR (Yang et al. 2021) from the user's disk: split file ``imdb_wiki.csv`` + images.

    Options as for ``agedb_dir`` (``csv`` defaults to ``root/imdb_wiki.csv``). The official
    split: 191,509 / 11,022 / 11,022 images, val/test up to 150 per age.
    See :func:`rankwise.data.dir_images`.
    """
    c, r = _resolve(csv, root, "imdb_wiki.csv")
    return dir_images(
        c, r, image_size=image_size, labels_only=labels_only, check_files=check_files, name="imdb_wiki_dir"
    )


@register_dataset("image_csv", modality="images")
def load_image_csv(
    path: str | Path,
    target: str,
    *,
    image_column: str = "path",
    root: str | Path | None = None,
    split_column: str | None = None,
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
    seed: int = 0,
    bin_width: float | None = None,
    image_size: int = 224,
    labels_only: bool = False,
    check_files: bool = True,
) -> RegressionData:
    """Images in folders listed by a CSV file: a column of image paths and a numeric target column.

    ``image_column`` (default ``path``) holds each image's path, relative to ``root`` (default: the
    CSV's folder); ``target`` is the label column; other columns are ignored. Split: the column
    ``split_column`` (values ``train``/``val``/``test``) when given, else a seeded random split
    (``val_fraction`` 0.1, ``test_fraction`` 0.2). The label bin width (``bin_width``, default
    :func:`~rankwise.data.suggest_bin_width` of the labels) and the shot thresholds
    (:func:`~rankwise.data.suggest_shot_thresholds` of the training labels) follow the data.
    Images are read with PIL (RGB) and transformed as in :func:`dir_images` (``image_size``);
    ``labels_only`` and ``check_files`` as there. Every problem raises
    :class:`~rankwise.data.DataFormatError` naming the file and the row.
    """
    from rankwise.data._base import random_split_indices, suggest_bin_width, suggest_shot_thresholds

    csv_path = Path(path)
    check_positive_int(image_size, "image_size")
    root_dir, header, records = image_list_records(
        csv_path,
        image_column,
        root,
        required=[target, *([split_column] if split_column else [])],
        check_root=not labels_only,
    )
    it = header.index(target)
    isp = header.index(split_column) if split_column else None
    paths: list[Path] = []
    labels: list[float] = []
    rows: list[int] = []
    splits: list[str] = []
    for row_no, row, image in records:
        labels.append(parse_number(row[it], csv_path, row_no, target))
        paths.append(image)
        rows.append(row_no)
        if isp is not None:
            split = row[isp].strip()
            if split not in _SPLITS:
                raise DataFormatError(
                    csv_path, row_no, f"column {split_column!r}: expected one of {list(_SPLITS)}, got {split!r}"
                )
            splits.append(split)
    if not labels:
        raise DataFormatError(csv_path, None, "no data rows")
    y = np.asarray(labels, dtype=np.float64)
    if isp is not None:
        idx = {s: np.flatnonzero(np.asarray(splits) == s) for s in _SPLITS}
        rule = f"given by the column {split_column!r}"
    else:
        tr, va, te = random_split_indices(len(y), val_fraction=val_fraction, test_fraction=test_fraction, seed=seed)
        idx = {"train": tr, "val": va, "test": te}
        rule = f"random (val_fraction={val_fraction}, test_fraction={test_fraction}, seed={seed})"
    empty = [s for s in _SPLITS if idx[s].size == 0]
    if empty:
        raise DataFormatError(csv_path, None, f"no rows for split(s) {empty} ({rule}); every split needs one")
    if not labels_only and check_files:
        check_image_files(csv_path, paths, rows)
    t_train: Callable[[Any], torch.Tensor] | None = None
    t_eval: Callable[[Any], torch.Tensor] | None = None
    if not labels_only:
        t_train, t_eval = dir_image_transforms(image_size)
    width = float(bin_width) if bin_width is not None else suggest_bin_width(y)
    datasets = {
        s: DIRImageDataset(
            [paths[i] for i in idx[s]],
            y[idx[s]],
            [rows[i] for i in idx[s]],
            csv_path,
            t_train if s == "train" else t_eval,
        )
        for s in _SPLITS
    }
    return RegressionData(
        name=csv_path.stem,
        train=datasets["train"],
        val=datasets["val"],
        test=datasets["test"],
        train_labels=y[idx["train"]].copy(),
        val_labels=y[idx["val"]].copy(),
        test_labels=y[idx["test"]].copy(),
        modality="images",
        input_dim=None,
        bin_width=width,
        label_name=target,
        meta={
            "csv": str(csv_path),
            "root": str(root_dir),
            "image_size": image_size,
            "image_shape": (3, image_size, image_size),
            "labels_only": labels_only,
            "split": rule,
            "seed": seed,
            "indices": idx,
        },
        shot_thresholds=suggest_shot_thresholds(y[idx["train"]], width),
    )
