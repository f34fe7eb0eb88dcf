"""Tabular regression data: abalone (scikit-lego's copy of the UCI file) and generic CSV files."""

from __future__ import annotations

import importlib.util
import re
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from rankwise.data._base import (
    DataFormatError,
    RegressionData,
    TensorPairDataset,
    dir_split,
    random_split_indices,
    register_dataset,
    standardize,
    suggest_bin_width,
    suggest_shot_thresholds,
)
from rankwise.data._files import (
    FLOAT32_MAX,
    MAX_COLUMNS,
    MAX_DATA_BYTES,
    check_file,
    check_header,
    csv_records,
    decode_text,
    excerpt,
    parse_number,
    read_bytes,
    read_limited,
)

__all__ = [
    "ABALONE_COLUMNS",
    "BLOCK_ROWS",
    "FeatureRows",
    "abalone_path",
    "iter_feature_rows",
    "load_abalone",
    "load_csv",
    "read_abalone_rows",
    "read_feature_rows",
    "table_records",
]

ABALONE_COLUMNS = (
    "sex",
    "length",
    "diameter",
    "height",
    "whole_weight",
    "shucked_weight",
    "viscera_weight",
    "shell_weight",
    "rings",
)
_SEXES = ("F", "I", "M")


def _read_text(path: Path) -> tuple[str, str]:
    """Text of a CSV file, or of the single CSV member of a zip archive; and a display name.

    UTF-8 only (a byte-order mark is dropped); every error is a DataFormatError naming the file.
    """
    data, display = _read_raw(path)
    return decode_text(data, display), str(display)


def _read_raw(path: Path) -> tuple[bytes, str | Path]:
    """The bytes of a CSV file or of the single member of a zip archive, and the name errors give it."""
    check_file(path)
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as zf:
                members = [m for m in zf.infolist() if not m.is_dir()]
                if len(members) != 1:
                    names = [excerpt(m.filename) for m in members[:5]]
                    raise DataFormatError(
                        path, None, f"expected one file in the archive, found {len(members)}: {names}"
                    )
                display = f"{path}::{members[0].filename}"
                if members[0].file_size > MAX_DATA_BYTES:
                    raise DataFormatError(
                        display, None, f"{members[0].file_size:,} bytes: larger than the limit of {MAX_DATA_BYTES:,}"
                    )
                with zf.open(members[0]) as fh:  # the declared size may lie: read at most the limit
                    data = read_limited(fh, Path(display), "the decompressed member")
        except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, zlib.error) as err:
            raise DataFormatError(path, None, f"cannot read the zip archive: {err}") from err
        return data, display
    data = read_bytes(path)
    if data[:4] == b"PK\x03\x04":
        raise DataFormatError(path, None, "is a truncated or corrupt zip archive (no central directory)")
    return data, path


@dataclass
class _PlainTable:
    """A CSV table that the compiled parser reads: ASCII, no quote, no NUL, ``\\n`` or ``\\r\\n`` line ends."""

    display: str
    header: list[str]
    data: bytes
    #: where the first data row starts
    body: int
    delimiter: int

    @classmethod
    def read(cls, path: Path, delimiter: str) -> _PlainTable | None:
        """The table of ``path`` (checked header), or None when it needs the ``csv`` module's reading."""
        if len(delimiter) != 1 or not delimiter.isascii() or delimiter in '\r\n"':
            return None
        raw, display = _read_raw(path)
        data = raw.removeprefix(b"\xef\xbb\xbf")
        if (
            not data.isascii()
            or b'"' in data
            or b"\0" in data
            or (b"\r" in data and data.count(b"\r") != data.count(b"\r\n"))
        ):
            return None
        end = data.find(b"\n")
        end = len(data) if end < 0 else end
        first = data[:end].decode().removesuffix("\r")
        fields = first.split(delimiter)
        if not first.strip() or len(fields) > MAX_COLUMNS:
            return None
        return cls(str(display), check_header(fields, display), data, min(end + 1, len(data)), ord(delimiter))

    def numbers(self, columns: Sequence[int]) -> np.ndarray | None:
        """``(rows, len(columns))`` float64 values of the columns at positions ``columns`` (the numbers of
        :func:`~rankwise.data._files.parse_number`); None at the first problem (the ``csv`` reading names it)."""
        try:
            from rankwise._kernels._numba_text import csv_block
        except ImportError:  # pragma: no cover - numba is a dependency
            return None
        if len(set(columns)) != len(columns):
            return None
        want = np.full(len(self.header), -1, dtype=np.int64)
        want[list(columns)] = np.arange(len(columns))
        out = np.empty((self.data.count(b"\n", self.body) + 1, len(columns)), dtype=np.float64)
        slow = np.empty((max(1 << 16, 2 * len(columns) + 2), 4), dtype=np.int64)
        buf, pos, row = np.frombuffer(self.data, np.uint8), self.body, 0
        while True:
            pos, row, status, nslow = csv_block(buf, pos, self.delimiter, len(self.header), want, out, row, slow, 0)
            if status == 1:
                return None
            for r, c, a, b in slow[:nslow].tolist():
                v = float(self.data[a:b])
                if not abs(v) <= FLOAT32_MAX:
                    return None
                out[r, c] = v
            if status == 0:
                return out[:row]


def _columns_text(header: list[str]) -> str:
    """The header for an error message: short, and nothing of a file that is not a table (one column)."""
    if len(header) == 1:
        return "the file has a single column (is `delimiter` right? is it a CSV table?)"
    shown = ", ".join(excerpt(h) for h in header[:20])
    more = f", ... ({len(header):,} in all)" if len(header) > 20 else ""
    return f"columns are [{shown}{more}]"


def table_records(path: str | Path, *, delimiter: str = ",") -> tuple[str, list[str], Iterator[tuple[int, list[str]]]]:
    """A CSV table (or the single CSV of a zip archive) as ``(display name, header, records)``.

    ``header``: the checked column names (:func:`~rankwise.data._files.check_header`); ``records``
    yields ``(row number, fields)`` of each data row (the header is row 1) and raises a
    :class:`~rankwise.data.DataFormatError` naming the file and the row when a row has another
    number of fields than the header. An empty file is a ``DataFormatError`` naming it.
    """
    text, display = _read_text(Path(path))
    records = csv_records(text, display, delimiter=delimiter)
    first = next(records, None)
    if first is None:
        raise DataFormatError(display, None, "the file is empty")
    header = check_header(first[1], display)

    def rows() -> Iterator[tuple[int, list[str]]]:
        for row_no, row in records:
            if len(row) != len(header):
                raise DataFormatError(display, row_no, f"expected {len(header)} fields, got {len(row)}")
            yield row_no, row

    return display, header, rows()


def _parse_fields(row: list[str], idx: Sequence[int], names: Sequence[str], display: str, row_no: int) -> list[float]:
    """The numbers of the columns ``names`` (at positions ``idx``) of one row (errors name file, row and column)."""
    return [parse_number(row[i], display, row_no, c) for i, c in zip(idx, names)]


def _check_splits(display: str, sizes: tuple[int, int, int], rule: str) -> None:
    """Regression recipes need a non-empty train, val and test split."""
    if min(sizes) == 0:
        raise DataFormatError(
            display,
            None,
            f"{sum(sizes)} data row(s) are too few: the {rule} split gives train/val/test sizes "
            f"{sizes[0]}/{sizes[1]}/{sizes[2]}, and every split needs at least one row",
        )


def _to_tensors(x: np.ndarray, y: np.ndarray) -> TensorPairDataset:
    return TensorPairDataset(torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.float32)))


def abalone_path() -> Path:
    """Path of ``sklego/data/abalone.zip`` inside the installed scikit-lego (no import of sklego)."""
    spec = importlib.util.find_spec("sklego")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the abalone data ships with scikit-lego; install it with `pip install scikit-lego` "
            "(or `pip install rankwise[train]`), or pass `path=` to a copy of abalone.csv",
            name="sklego",
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "abalone.zip"
    if not path.is_file():
        raise FileNotFoundError(f"scikit-lego is installed but {path} is missing")
    return path


def _abalone_table(path: str | Path, *, rings: bool) -> tuple[str, list[str], list[list[str]], np.ndarray]:
    """``(display name, header, rows as text, table)`` of an abalone CSV: ``table`` holds the one-hot sex
    (``sex_F, sex_I, sex_M``), the 7 measurements and, with ``rings``, the rings (float64). The columns
    are found by name (``rings`` required only with ``rings``); a bad value is a DataFormatError
    naming the file, the row and the column."""
    wanted = ABALONE_COLUMNS if rings else ABALONE_COLUMNS[:-1]
    display, header, records = table_records(path)
    position = {c: i for i, c in enumerate(header)}
    missing = [c for c in wanted if c not in position]
    if missing:
        raise DataFormatError(display, 1, f"missing column(s) {missing}; expected {list(wanted)}")
    isex = position["sex"]
    numeric_columns = wanted[1:]
    numeric_idx = [position[c] for c in numeric_columns]
    rows: list[list[str]] = []
    sexes: list[int] = []
    numeric: list[list[float]] = []
    for row_no, row in records:
        sex = row[isex].strip()
        if sex not in _SEXES:
            raise DataFormatError(display, row_no, f"column 'sex': expected one of {list(_SEXES)}, got {sex!r}")
        sexes.append(_SEXES.index(sex))
        numeric.append(_parse_fields(row, numeric_idx, numeric_columns, display, row_no))
        rows.append(row)
    onehot = np.eye(len(_SEXES))[np.asarray(sexes, dtype=np.int64)].reshape(len(rows), len(_SEXES))
    num = np.asarray(numeric, dtype=np.float64).reshape(len(rows), len(numeric_columns))
    return display, header, rows, np.concatenate([onehot, num], axis=1)


def read_abalone_rows(path: str | Path) -> FeatureRows:
    """The rows of an abalone CSV (the columns of :data:`ABALONE_COLUMNS` by name, ``rings`` optional)
    and their features as :func:`load_abalone` builds them before standardizing: one-hot sex and the
    7 measurements (``meta["feature_names"]``). Errors as there; a header only gives zero rows."""
    display, header, rows, table = _abalone_table(path, rings=False)
    return FeatureRows(display, header, rows, table)


@register_dataset("abalone", modality="table")
def load_abalone(
    *, per_label: int = 10, seed: int = 0, standardize_features: bool = True, path: str | Path | None = None
) -> RegressionData:
    """Abalone age regression (UCI, 4,177 real shells): age = rings + 1.5 years.

    Read directly from the CSV inside scikit-lego's ``sklego/data/abalone.zip`` (or ``path``, a
    CSV or a zip holding one CSV with the same columns); no download. Features (10): one-hot sex
    ``sex_F, sex_I, sex_M`` (kept 0/1) and the 7 numeric measurements, standardized with the mean
    and std of the TRAIN rows. Target: ``age`` in years (2.5 .. 30.5, right-skewed).

    Split (DIR style, :func:`rankwise.data.dir_split`, seeded by ``seed``): for each age with
    ``c`` shells, ``n = min(per_label, c // 3)`` go to val and ``n`` others to test; the rest is
    train. With the default ``per_label=10``: 3,813 / 182 / 182 rows; val and test hold 10
    shells for each age 5.5 .. 20.5 and fewer for the rare ages (4.5: 5, 21.5: 8, 22.5: 4,
    23.5: 2, 24.5: 3); ages with < 3 shells (2.5, 3.5, 25.5 .. 30.5) are train only.
    Test shot groups by TRAIN count per age (many > 100, few < 20): 9 many-shot ages
    (7.5 .. 15.5, 90 rows), 6 medium (5.5, 6.5, 16.5 .. 19.5, 60 rows), 6 few (4.5, 20.5 .. 24.5,
    32 rows). Other seeds give the same sizes and groups (only which shells are drawn changes).

    Options: ``per_label`` (int, default 10), ``seed`` (default 0), ``standardize_features``
    (default True), ``path`` (default: the scikit-lego copy). Bad rows raise
    :class:`~rankwise.data.DataFormatError` naming the file and the row (nothing is dropped).
    """
    src = Path(path) if path is not None else abalone_path()
    display, _, _, table = _abalone_table(src, rings=True)
    if not len(table):
        raise DataFormatError(display, None, "no data rows")
    age = table[:, -1] + 1.5
    x = table[:, :-1]
    train_idx, val_idx, test_idx = dir_split(age, per_label=per_label, seed=seed)
    _check_splits(display, (len(train_idx), len(val_idx), len(test_idx)), f"DIR (per_label={per_label})")
    mean = np.zeros(x.shape[1])
    std = np.ones(x.shape[1])
    if standardize_features:
        x, mean, std = standardize(x, train_idx, columns=np.arange(len(_SEXES), x.shape[1]))
    feature_names = [f"sex_{s}" for s in _SEXES] + list(ABALONE_COLUMNS[1:-1])  # the columns of x
    return RegressionData(
        name="abalone",
        train=_to_tensors(x[train_idx], age[train_idx]),
        val=_to_tensors(x[val_idx], age[val_idx]),
        test=_to_tensors(x[test_idx], age[test_idx]),
        train_labels=age[train_idx].copy(),
        val_labels=age[val_idx].copy(),
        test_labels=age[test_idx].copy(),
        modality="table",
        input_dim=x.shape[1],
        bin_width=1.0,
        label_name="age",
        label_unit="years",
        meta={
            "source": display,
            "feature_names": feature_names,
            "feature_mean": mean,
            "feature_std": std,
            "split": f"dir (per_label={per_label}: min(per_label, count // 3) per age in val and in test)",
            "seed": seed,
            "indices": {"train": train_idx, "val": val_idx, "test": test_idx},
        },
        shot_thresholds=(100, 20),  # the DIR benchmarks' many-shot > 100, few-shot < 20
    )


@register_dataset("csv", modality="table")
def load_csv(
    path: str | Path,
    target: str,
    features: Sequence[str] | None = None,
    *,
    split: Literal["random", "dir"] = "random",
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
    per_label: int = 10,
    seed: int = 0,
    standardize_features: bool = True,
    bin_width: float | None = None,
    delimiter: str = ",",
    name: str | None = None,
) -> RegressionData:
    r"""A regression dataset from any CSV file with a header: numeric feature columns + a target.

    ``features`` defaults to every column except ``target``; all of them must be numeric (a
    non-numeric, empty or non-finite value raises :class:`~rankwise.data.DataFormatError`
    naming the file, the row and the column; nothing is dropped). Features are standardized with
    TRAIN statistics unless ``standardize_features=False``.

    File rules: UTF-8 text (a byte-order mark is dropped; Latin-1 or UTF-16 files are refused
    with the line of the first bad byte, re-save them as UTF-8); column names non-empty and
    distinct; numbers are plain decimals (``12``, ``-0.5``, ``.5``, ``3e-2``): ``1_000``,
    ``nan``, ``inf`` and values beyond the float32 range (``|v| > 3.4e38``, e.g. ``1e39``)
    are refused; every split must get at least one row. Each problem raises
    :class:`~rankwise.data.DataFormatError` naming the file (and row and column); a missing
    file raises :class:`~rankwise.data.DataFileNotFoundError` (also a ``FileNotFoundError``).

    Split: ``"random"`` (default; ``val_fraction`` 0.1 and ``test_fraction`` 0.2 of the rows,
    seeded) or ``"dir"`` (balanced val/test with ``min(per_label, count // 3)`` rows per label
    bin of width ``bin_width``, as for abalone).

    Bins: ``bin_width`` is the label bin width of the split, LDS/FDS and the shot groups; by
    default :func:`~rankwise.data.suggest_bin_width` of all the labels (about :math:`\sqrt{N}`
    bins; 1 for integer labels spanning fewer than about :math:`\sqrt{N}` values). The shot groups
    (``shot_thresholds``) follow the data as well: a bin is many-shot above the mean training
    count of an occupied bin and few-shot below a fifth of it
    (:func:`~rankwise.data.suggest_shot_thresholds`).

    Example:
        >>> import tempfile, pathlib, numpy as np
        >>> rng = np.random.default_rng(0)
        >>> rows = ["x1,x2,y"] + [f"{a:.3f},{b:.3f},{int(50 + 100 * a * a)}" for a, b in rng.random((400, 2))]
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "mine.csv"
        >>> _ = path.write_text("\n".join(rows) + "\n")
        >>> data = load_csv(path, target="y")
        >>> data.sizes(), data.bin_width, data.label_name
        ((280, 40, 80), 5.0, 'y')
    """
    src = Path(path)
    plain = _PlainTable.read(src, delimiter)
    if plain is None:
        display, header, records = table_records(src, delimiter=delimiter)
    else:
        display, header = plain.display, plain.header
    position = {c: i for i, c in enumerate(header)}  # names are distinct (check_header): linear look-ups
    if target not in position:
        raise ValueError(f"`target` must be a column of {display}; got {target!r}, {_columns_text(header)}")
    feats = [c for c in header if c != target] if features is None else list(features)
    unknown = [c for c in feats if c not in position]
    if unknown:
        raise ValueError(f"`features` must be columns of {display}; unknown {unknown[:5]}, {_columns_text(header)}")
    if target in feats:
        raise ValueError(f"`features` must not contain the target column {target!r}")
    if not feats:
        raise ValueError(f"`features` is empty: {display} has no column besides the target {target!r}")
    fidx = [position[c] for c in feats]
    tidx = position[target]
    table = None if plain is None else plain.numbers([tidx, *fidx])  # compiled; None: read row by row
    if table is not None:
        y, x = table[:, 0].copy(), table[:, 1:]
    else:
        if plain is not None:
            display, header, records = table_records(src, delimiter=delimiter)
        xs: list[list[float]] = []
        ys: list[float] = []
        for row_no, row in records:
            if row[tidx].strip() == "":
                raise DataFormatError(display, row_no, f"missing target value in column {target!r}")
            ys.append(parse_number(row[tidx], display, row_no, target))
            xs.append(_parse_fields(row, fidx, feats, display, row_no))
        x = np.asarray(xs, dtype=np.float64)
        y = np.asarray(ys, dtype=np.float64)
    if not len(y):
        raise DataFormatError(display, None, "no data rows")
    if bin_width is None:
        bin_width = suggest_bin_width(y)
    if split == "random":
        train_idx, val_idx, test_idx = random_split_indices(
            len(y), val_fraction=val_fraction, test_fraction=test_fraction, seed=seed
        )
        rule = f"random (val_fraction={val_fraction}, test_fraction={test_fraction})"
    elif split == "dir":
        train_idx, val_idx, test_idx = dir_split(y, per_label=per_label, seed=seed, bin_width=bin_width)
        rule = f"dir (per_label={per_label}, bin_width={bin_width})"
    else:
        raise ValueError(f"`split` must be one of 'random', 'dir'; got {split!r}")
    _check_splits(display, (len(train_idx), len(val_idx), len(test_idx)), rule)
    mean = np.zeros(x.shape[1])
    std = np.ones(x.shape[1])
    if standardize_features:
        x, mean, std = standardize(x, train_idx)
    return RegressionData(
        name=name or src.stem,
        train=_to_tensors(x[train_idx], y[train_idx]),
        val=_to_tensors(x[val_idx], y[val_idx]),
        test=_to_tensors(x[test_idx], y[test_idx]),
        train_labels=y[train_idx].copy(),
        val_labels=y[val_idx].copy(),
        test_labels=y[test_idx].copy(),
        modality="table",
        input_dim=len(feats),
        bin_width=float(bin_width),
        label_name=target,
        meta={
            "source": display,
            "feature_names": feats,
            "feature_mean": mean,
            "feature_std": std,
            "split": rule,
            "seed": seed,
            "indices": {"train": train_idx, "val": val_idx, "test": test_idx},
        },
        shot_thresholds=suggest_shot_thresholds(y[train_idx], float(bin_width)),
    )


@dataclass
class FeatureRows:
    """A table read for prediction by :func:`read_feature_rows`."""

    #: the file's display name (``archive.zip::member.csv`` for a zip archive)
    source: str
    #: the file's column names, in its order
    header: list[str]
    #: every data row's fields as read (text)
    rows: list[list[str]]
    #: ``(rows, len(features))`` float64: the requested feature columns, in the requested order
    features: np.ndarray


def read_feature_rows(path: str | Path, features: Sequence[str], *, delimiter: str = ",") -> FeatureRows:
    """The rows of a CSV file and the values of its columns ``features`` (by name, in that order),
    read with the rules of :func:`load_csv` (other columns, e.g. the target, are kept as text only).

    A missing feature column, a row with a wrong number of fields or a value that is not a plain
    finite decimal raises :class:`~rankwise.data.DataFormatError` naming the file (and the row and
    the column), exactly as :func:`load_csv` does; a file of a header only gives zero rows.

    Example:
        >>> import tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "new.csv"
        >>> _ = path.write_text("id,b,a\\nx,2,1\\ny,4,3.5\\n")
        >>> t = read_feature_rows(path, ["a", "b"])
        >>> t.header, t.rows, t.features.tolist()
        (['id', 'b', 'a'], [['x', '2', '1'], ['y', '4', '3.5']], [[1.0, 2.0], [3.5, 4.0]])
    """
    display, header, records = table_records(path, delimiter=delimiter)
    position = {c: i for i, c in enumerate(header)}
    missing = [c for c in features if c not in position]
    if missing:
        shown = ", ".join(repr(c) for c in missing[:5]) + (f", ... ({len(missing)} in all)" if len(missing) > 5 else "")
        raise DataFormatError(
            display, 1, f"missing feature column(s) {shown} that the model was trained on; {_columns_text(header)}"
        )
    idx = [position[c] for c in features]
    rows: list[list[str]] = []
    xs: list[list[float]] = []
    for row_no, row in records:
        xs.append(_parse_fields(row, idx, features, display, row_no))
        rows.append(row)
    return FeatureRows(display, header, rows, np.asarray(xs, dtype=np.float64).reshape(len(xs), len(idx)))


#: rows of a block of :func:`iter_feature_rows` by default
BLOCK_ROWS = 100_000


def iter_feature_rows(
    path: str | Path, features: Sequence[str], *, delimiter: str = ",", block_rows: int = BLOCK_ROWS
) -> Iterator[FeatureRows]:
    """:func:`read_feature_rows` in blocks of at most ``block_rows`` rows, the file read as they are asked
    for (a plain or ``.gz`` file: memory bounded by a block, whatever the file's size; a zip archive is
    read whole, as :func:`read_feature_rows` reads it, then cut into blocks).

    The blocks' rows, in order, are those of :func:`read_feature_rows` and the errors are its errors
    (a value that is not UTF-8 names the row after which it comes); a file of a header only gives one
    block of zero rows.

    Example:
        >>> import tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "new.csv"
        >>> _ = path.write_text("id,b,a\\nx,2,1\\ny,4,3.5\\nz,6,5\\n")
        >>> [(t.rows, t.features.tolist()) for t in iter_feature_rows(path, ["a", "b"], block_rows=2)]
        [([['x', '2', '1'], ['y', '4', '3.5']], [[1.0, 2.0], [3.5, 4.0]]), ([['z', '6', '5']], [[5.0, 6.0]])]
    """
    if isinstance(block_rows, bool) or not isinstance(block_rows, int) or block_rows < 1:
        raise ValueError(f"`block_rows` must be a positive int, got {block_rows!r}")
    src = check_file(Path(path))
    with open(src, "rb") as fh:
        magic = fh.read(4)
    if zipfile.is_zipfile(src) or magic[:4] == b"PK\x03\x04":
        whole = read_feature_rows(src, features, delimiter=delimiter)
        n = len(whole.rows)
        for start in range(0, max(n, 1), block_rows):
            stop = min(start + block_rows, n)
            yield FeatureRows(whole.source, whole.header, whole.rows[start:stop], whole.features[start:stop])
        return
    yield from _stream_feature_rows(src, features, delimiter, block_rows)


#: the characters of plain decimals (and the spaces around them), one a line: the fast path of :func:`_block_values`
_DECIMAL_CHARS = re.compile(r"[0-9.eE+\- \n]*")


def _block_values(
    rows: list[list[str]], numbers: list[int], idx: Sequence[int], names: Sequence[str], display: str
) -> np.ndarray:
    """``(len(rows), len(idx))`` float64: the values :func:`_parse_fields` gives, row by row (its errors).

    A column whose fields hold only the characters of plain decimals and spaces (one pass over the
    column) is converted at once by ``float``'s grammar, which on those characters accepts exactly the
    decimals of :func:`~rankwise.data._files.parse_number` (``inf``, ``nan`` and ``1_000`` have other
    characters); a field ``float`` refuses, a value beyond the float32 range or any other character sends
    the block field by field through :func:`_parse_fields`, which raises the error of the first bad field
    in the block's row order.
    """
    out = np.empty((len(rows), len(idx)), dtype=np.float64)
    for j, i in enumerate(idx):
        column = [r[i] for r in rows]
        if column and _DECIMAL_CHARS.fullmatch("\n".join(column)) is not None:
            try:
                values = np.array(column, dtype=np.float64)
            except ValueError:  # e.g. '1.2.3', '-', a field of spaces: the field's own error below
                break
            if np.all(np.abs(values) <= FLOAT32_MAX):
                out[:, j] = values
                continue
        break
    else:
        return out
    for k, (row, row_no) in enumerate(zip(rows, numbers)):  # the first bad field, in row order, raises
        out[k] = _parse_fields(row, idx, names, display, row_no)
    return out


def _utf8_lines(raw: Any, display: str, chunk_bytes: int = 1 << 22) -> Iterator[str]:
    """The lines (``\\n``-terminated, as a text file opened with ``newline=""`` gives them) of a binary
    stream as UTF-8 text, a leading byte-order mark dropped, decoded ``chunk_bytes`` at a time; text
    that is not UTF-8: the error of :func:`~rankwise.data._files.decode_text` (the line and the first bad byte)."""
    import io

    lines_before = 0
    rest = b""
    first = True
    while True:
        chunk = raw.read(chunk_bytes)
        data = rest + chunk
        if chunk:
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                rest = data
                continue
            data, rest = data[:cut], data[cut:]
        if first:
            utf16 = data[:2] in (b"\xff\xfe", b"\xfe\xff")
            data = data.removeprefix(b"\xef\xbb\xbf")
            first = False
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            line = lines_before + data.count(b"\n", 0, err.start) + 1
            hint = (
                "it looks like UTF-16; save it as UTF-8"
                if utf16
                else "save it as UTF-8 (it may be Latin-1/Windows-1252)"
            )
            bad = data[err.start : err.start + 1].hex()
            raise DataFormatError(
                display, None, f"not valid UTF-8 text (byte 0x{bad} on line {line}): {hint}"
            ) from None
        lines_before += data.count(b"\n")
        yield from io.StringIO(text)
        if not chunk:
            return


def _stream_feature_rows(src: Path, features: Sequence[str], delimiter: str, block_rows: int) -> Iterator[FeatureRows]:
    import gzip

    display = str(src)
    try:
        raw = gzip.open(src, "rb") if src.suffix == ".gz" else open(src, "rb")
        with raw:
            records = csv_records(_utf8_lines(raw, display), display, delimiter=delimiter)
            first = next(records, None)
            if first is None:
                raise DataFormatError(display, None, "the file is empty")
            header = check_header(first[1], display)
            position = {c: i for i, c in enumerate(header)}
            missing = [c for c in features if c not in position]
            if missing:
                shown = ", ".join(repr(c) for c in missing[:5])
                shown += f", ... ({len(missing)} in all)" if len(missing) > 5 else ""
                raise DataFormatError(
                    display,
                    1,
                    f"missing feature column(s) {shown} that the model was trained on; {_columns_text(header)}",
                )
            idx = [position[c] for c in features]
            rows: list[list[str]] = []
            numbers: list[int] = []
            sent = False
            for row_no, row in records:
                if len(row) != len(header):
                    raise DataFormatError(display, row_no, f"expected {len(header)} fields, got {len(row)}")
                rows.append(row)
                numbers.append(row_no)
                if len(rows) == block_rows:
                    yield FeatureRows(display, header, rows, _block_values(rows, numbers, idx, features, display))
                    rows, numbers, sent = [], [], True
            if rows or not sent:
                yield FeatureRows(display, header, rows, _block_values(rows, numbers, idx, features, display))
    except (OSError, EOFError, zlib.error) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else err
        raise DataFormatError(display, None, f"cannot read the file: {why}") from err
