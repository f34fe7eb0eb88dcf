"""Reading the user's data files with one-line errors that name the file (and the row and column).

Rules shared by every text loader in :mod:`rankwise.data`:

* text is UTF-8; a leading byte-order mark is dropped; any other encoding (Latin-1, UTF-16, ...)
  raises :class:`~rankwise.data.DataFormatError` naming the file, the line and the first bad
  byte (no guessing of a fallback encoding: a mis-decoded label would be silently wrong);
* numbers are plain ASCII decimals (``12``, ``-0.5``, ``.5``, ``3e-2``, surrounding spaces
  allowed); Python-only spellings such as ``1_000``, non-ASCII digits, ``nan`` and ``inf`` are
  rejected, and so is any value outside the float32 range (``|v| > 3.4e38``), since the values
  become float32 tensors for training;
* header names are stripped of surrounding spaces and must be non-empty and distinct.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import numpy as np

from rankwise.data._base import DataFileNotFoundError, DataFormatError

#: the largest finite float32 (labels and features become float32 tensors)
FLOAT32_MAX = float(np.finfo(np.float32).max)

_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_NON_FINITE = re.compile(r"[+-]?(?:nan|inf|infinity)", re.IGNORECASE)
_INTEGER = re.compile(r"[+-]?[0-9]+")


def parse_number(value: str, path: str | Path, row: int, column: str) -> float:
    """``value`` as a float, or a :class:`DataFormatError` naming ``path``, ``row`` and ``column``."""
    text = value.strip()
    if text == "":
        raise DataFormatError(path, row, f"missing value in column {column!r}")
    if _NON_FINITE.fullmatch(text):
        raise DataFormatError(path, row, f"column {column!r}: value {value!r} is not finite")
    if not _DECIMAL.fullmatch(text):
        hint = " (digit separators such as '_' are not accepted)" if "_" in text else ""
        raise DataFormatError(path, row, f"column {column!r}: cannot parse {value!r} as a number{hint}")
    v = float(text)
    if not abs(v) <= FLOAT32_MAX:
        raise DataFormatError(
            path, row, f"column {column!r}: value {value!r} is outside the float32 range (|value| <= 3.4e38)"
        )
    return v


def is_integer_text(value: str) -> bool:
    """True for a plain ASCII integer (``12``, ``-3``, surrounding spaces allowed)."""
    return _INTEGER.fullmatch(value.strip()) is not None


def check_file(path: str | Path, what: str = "data file") -> Path:
    """``path`` as a Path if it is an existing file; else :class:`DataFileNotFoundError` naming it."""
    p = Path(path)
    if p.is_dir():
        raise DataFormatError(p, None, f"is a directory, expected a {what}")
    if not p.is_file():
        raise DataFileNotFoundError(p, None, f"{what} not found")
    return p


def check_dir(path: str | Path, option: str = "root") -> Path:
    """``path`` as a Path if it is an existing directory; else :class:`DataFileNotFoundError`."""
    p = Path(path)
    if p.is_file():
        raise DataFormatError(p, None, f"is a file: `{option}` must be an existing directory")
    if not p.is_dir():
        raise DataFileNotFoundError(p, None, f"directory not found (`{option}` must be an existing directory)")
    return p


def read_bytes(path: str | Path, what: str = "data file") -> bytes:
    """The bytes of an existing file (a ``.gz`` file is decompressed); errors name the file."""
    p = check_file(path, what)
    try:
        data = p.read_bytes()
    except OSError as err:
        raise DataFormatError(p, None, f"cannot read the file: {err.strerror or err}") from err
    if p.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as err:
            raise DataFormatError(p, None, f"not a valid gzip file: {err}") from err
    return data


def decode_text(data: bytes, display: str | Path) -> str:
    """UTF-8 text of ``data`` without a leading byte-order mark; errors name ``display`` and the line."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        bad = data[err.start : err.start + 1].hex()
        if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
            hint = "it looks like UTF-16; save it as UTF-8"
        else:
            hint = "save it as UTF-8 (it may be Latin-1/Windows-1252)"
        raise DataFormatError(display, None, f"not valid UTF-8 text (byte 0x{bad} on line {line}): {hint}") from None


def read_text(path: str | Path, what: str = "data file") -> str:
    """UTF-8 text of a file (``.gz`` decompressed, BOM dropped); every error names the file."""
    return decode_text(read_bytes(path, what), path)


def check_header(header: list[str], display: str | Path) -> list[str]:
    """Stripped column names; an empty or repeated name raises :class:`DataFormatError` (row 1)."""
    names = [h.strip() for h in header]
    for i, name in enumerate(names):
        if name == "":
            raise DataFormatError(
                display, 1, f"column {i + 1} has no name (header {names}); name every column (a saved index? drop it)"
            )
    first: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in first:
            j = first[name]
            raise DataFormatError(
                display, 1, f"duplicated column name {name!r}: columns {j + 1} and {i + 1} are both named {name!r}"
            )
        first[name] = i
    return names


def csv_records(
    text: str, display: str | Path, *, delimiter: str = ",", quoting: Literal[0, 1, 2, 3] = csv.QUOTE_MINIMAL
) -> Iterator[tuple[int, list[str]]]:
    """``(row_number, fields)`` of each non-blank CSV record (the header is row 1).

    A malformed record (e.g. a NUL byte, an unterminated quote at the end of the file) raises
    :class:`DataFormatError` naming ``display`` and the row.
    """
    reader = csv.reader(io.StringIO(text), delimiter=delimiter, quoting=quoting)
    row_no = 0
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            kind = "TSV" if delimiter == "\t" else "CSV"
            raise DataFormatError(display, row_no + 1, f"malformed {kind} record: {err}") from None
        row_no += 1
        if row:
            yield row_no, row
