"""Reading the user's data files with one-line errors that name the file (and the row and column).

Rules shared by every text loader in :mod:`rankwise.data`:

* text is UTF-8; a leading byte-order mark is dropped; any other encoding (Latin-1, UTF-16, ...)
  raises :class:`~rankwise.data.DataFormatError` naming the file, the line and the first bad
  byte (no guessing of a fallback encoding: a mis-decoded label would be silently wrong);
* numbers are plain ASCII decimals (``12``, ``-0.5``, ``.5``, ``3e-2``, surrounding spaces
  allowed); Python-only spellings such as ``1_000``, non-ASCII digits, ``nan`` and ``inf`` are
  rejected, and so is any value outside the float32 range (``|v| > 3.4e38``), since the values
  become float32 tensors for training;
* header names are stripped of surrounding spaces and must be non-empty and distinct;
* limits, checked before the file is read in full (its size from ``stat``, so that a sparse file
  is refused without reading it) and before any dense array is allocated: a file (or the
  decompressed content of a ``.gz`` file or a zip member) of at most :data:`MAX_DATA_BYTES`
  (1 GiB) for a table or list read whole into memory, :data:`MAX_LETOR_BYTES` (4 GiB) for a LETOR
  / svmlight file (streamed by a compiled reader; MSLR-WEB30K's largest file is 2.3 GB); a table of
  at most :data:`MAX_COLUMNS` (100,000) columns; a LETOR feature index of at most
  :data:`MAX_FEATURE_INDEX` (100,000) and dense features of at most :data:`MAX_DENSE_ELEMENTS`
  (2**30 values, 4 GiB of float32) over a dataset's documents x features. Beyond them the file is
  refused with one error naming it, the value found and the limit; every reader checks its file
  with :func:`check_file` (``max_bytes``);
* a quoted field must be closed (an unterminated quote is a malformed record, not a field that
  swallows the rest of the file);
* an error never repeats more than a short excerpt (:data:`ECHO_CHARS` characters) of a value.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import os
import re
import time
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rankwise.data._base import DataFileNotFoundError, DataFormatError

#: the largest finite float32 (labels and features become float32 tensors)
FLOAT32_MAX = float(np.finfo(np.float32).max)
#: the largest data file read (bytes; for a ``.gz`` file or a zip member: its decompressed content)
MAX_DATA_BYTES = 2**30
#: the largest LETOR / svmlight file read (bytes; a ``.gz`` / ``.bz2`` file: its decompressed content)
MAX_LETOR_BYTES = 4 * 2**30
#: the most columns of a CSV/TSV table
MAX_COLUMNS = 100_000
#: the largest feature index of a LETOR / svmlight file (each index up to the largest is a dense column)
MAX_FEATURE_INDEX = 100_000
#: the most float32 values (documents x features) of a dataset's dense feature arrays (4 GiB)
MAX_DENSE_ELEMENTS = 2**30
#: the most characters of a value from a data file that an error message repeats
ECHO_CHARS = 40


def excerpt(value: str) -> str:
    """``repr`` of at most :data:`ECHO_CHARS` characters of ``value`` (for error messages)."""
    return repr(value) if len(value) <= ECHO_CHARS else repr(value[:ECHO_CHARS]) + "..."


_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_NON_FINITE = re.compile(r"[+-]?(?:nan|inf|infinity)", re.IGNORECASE)
_INTEGER = re.compile(r"[+-]?[0-9]+")


def parse_number(value: str, path: str | Path, row: int, column: str) -> float:
    """``value`` as a float, or a :class:`DataFormatError` naming ``path``, ``row`` and ``column``."""
    text = value.strip()
    if text == "":
        raise DataFormatError(path, row, f"missing value in column {column!r}")
    if _NON_FINITE.fullmatch(text):
        raise DataFormatError(path, row, f"column {column!r}: value {excerpt(value)} is not finite")
    if not _DECIMAL.fullmatch(text):
        hint = " (digit separators such as '_' are not accepted)" if "_" in text else ""
        raise DataFormatError(path, row, f"column {column!r}: cannot parse {excerpt(value)} as a number{hint}")
    v = float(text)
    if not abs(v) <= FLOAT32_MAX:
        raise DataFormatError(
            path, row, f"column {column!r}: value {excerpt(value)} is outside the float32 range (|value| <= 3.4e38)"
        )
    return v


def is_integer_text(value: str) -> bool:
    """True for a plain ASCII integer (``12``, ``-3``, surrounding spaces allowed)."""
    return _INTEGER.fullmatch(value.strip()) is not None


#: the lists of :func:`recording_reads` in effect (innermost last)
_RECORDERS: list[list[Path]] = []


@contextlib.contextmanager
def recording_reads() -> Iterator[list[Path]]:
    """Within the block, every file that :func:`check_file` admits (every loader of this package opens
    its files through it) is appended to the list this yields, in order (repeats kept)."""
    files: list[Path] = []
    _RECORDERS.append(files)
    try:
        yield files
    finally:
        _RECORDERS.remove(files)


def check_file(path: str | Path, what: str = "data file", *, max_bytes: int | None = None) -> Path:
    """``path`` as a Path if it is an existing file; else :class:`DataFileNotFoundError` naming it.

    ``max_bytes``: the largest size accepted (from ``stat``, before anything is read: a sparse file
    of many GiB is refused at once); a larger file raises :class:`DataFormatError` naming the file,
    its size and the limit. Inside :func:`recording_reads` the file is recorded as read.
    """
    p = Path(path)
    if p.is_dir():
        raise DataFormatError(p, None, f"is a directory, expected a {what}")
    if not p.is_file():
        if p.exists():  # a FIFO, a device, a socket: never opened (a FIFO would block)
            raise DataFormatError(p, None, f"is not a regular file (a device, FIFO or socket), expected a {what}")
        raise DataFileNotFoundError(p, None, f"{what} not found")
    if max_bytes is not None:
        try:
            size = p.stat().st_size
        except OSError as err:
            raise DataFormatError(p, None, f"cannot read the file: {err.strerror or err}") from err
        if size > max_bytes:
            raise _too_big(p, size, "the file", max_bytes)
    note_read(p)
    return p


def note_read(path: str | Path) -> None:
    """Inside :func:`recording_reads`, record ``path`` as read: for the files a loader opens without
    :func:`check_file` (each image or volume a list names)."""
    for files in _RECORDERS:
        files.append(Path(path))


def check_dir(path: str | Path, option: str = "root") -> Path:
    """``path`` as a Path if it is an existing directory; else :class:`DataFileNotFoundError`."""
    p = Path(path)
    if p.is_file():
        raise DataFormatError(p, None, f"is a file: `{option}` must be an existing directory")
    if not p.is_dir():
        raise DataFileNotFoundError(p, None, f"directory not found (`{option}` must be an existing directory)")
    return p


def _too_big(p: Path, size: int, what: str, limit: int = MAX_DATA_BYTES) -> DataFormatError:
    return DataFormatError(p, None, f"{what} of {size:,} bytes or more is larger than the limit of {limit:,} bytes")


def read_limited_chunks(fh: Any, p: Path, limit: int, what: str = "the decompressed content") -> int:
    """The number of bytes of the binary stream ``fh``, read in chunks of 1 MiB (nothing kept) up to
    ``limit``; beyond it a :class:`DataFormatError` naming ``p`` (a compressed file whose content is
    too large to read, e.g. a gzip bomb)."""
    total = 0
    while chunk := fh.read(1 << 20):
        total += len(chunk)
        if total > limit:
            raise _too_big(p, total, what, limit)
    return total


def read_limited(fh: Any, p: Path, what: str = "the file") -> bytes:
    """At most :data:`MAX_DATA_BYTES` bytes of the binary stream ``fh``, else a :class:`DataFormatError`."""
    data = fh.read(MAX_DATA_BYTES + 1)
    if len(data) > MAX_DATA_BYTES:
        raise _too_big(p, len(data), what)
    return data


def read_bytes(path: str | Path, what: str = "data file") -> bytes:
    """The bytes of an existing file (a ``.gz`` file is decompressed); errors name the file.

    The size on disk is checked before the file is read and a ``.gz`` file is decompressed in
    chunks: beyond :data:`MAX_DATA_BYTES` either way, the file is refused (a sparse file, a gzip bomb).
    """
    p = check_file(path, what)
    try:
        with open(p, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > MAX_DATA_BYTES:
                raise _too_big(p, size, "the file")
            data = read_limited(fh, p)
    except OSError as err:
        raise DataFormatError(p, None, f"cannot read the file: {err.strerror or err}") from err
    if p.suffix == ".gz":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as gz:
                data = read_limited(gz, p, "the decompressed content")
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


def check_header(header: list[str], display: str | Path, *, allow_unnamed: bool = False) -> list[str]:
    """Stripped column names; an empty (unless ``allow_unnamed``) or repeated name raises
    :class:`DataFormatError` (row 1)."""
    names = [h.strip() for h in header]
    for i, name in enumerate(names):
        if name == "" and not allow_unnamed:
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
    text: str | Iterable[str],
    display: str | Path,
    *,
    delimiter: str = ",",
    quoting: Literal[0, 1, 2, 3] = csv.QUOTE_MINIMAL,
) -> Iterator[tuple[int, list[str]]]:
    """``(row_number, fields)`` of each non-blank CSV record (the header is row 1).

    ``text``: the whole text, or its lines (a text file opened with ``newline=""``: read as the
    records are asked for).

    A malformed record (e.g. a NUL byte, an unterminated quote at the end of the file) raises
    :class:`DataFormatError` naming ``display`` and the row.
    """
    lines = io.StringIO(text) if isinstance(text, str) else text
    reader = csv.reader(lines, delimiter=delimiter, quoting=quoting, strict=True)
    kind = "TSV" if delimiter == "\t" else "CSV"
    row_no = 0
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            hint = " (a quote that is never closed?)" if "end of data" in str(err) else ""
            raise DataFormatError(display, row_no + 1, f"malformed {kind} record: {err}{hint}") from None
        row_no += 1
        if len(row) > MAX_COLUMNS:
            raise DataFormatError(
                display,
                row_no,
                f"{len(row):,} fields: more than the limit of {MAX_COLUMNS:,} columns of a {kind} table",
            )
        if row:
            yield row_no, row


#: digests already computed in this process, by (path, algorithm) -> (size, mtime_ns, inode, digest)
_DIGESTS: dict[tuple[str, str], tuple[int, int, int, str]] = {}


def file_digest(path: str | os.PathLike[str], algorithm: str = "sha256") -> str:
    """The hex digest of a file's bytes (read in 1 MiB chunks, never whole into memory).

    A file is read once per process while its size, modification time and inode stay the same (the
    cache key of a volume and the run's record of the files it read both need its digest)."""
    import hashlib

    key = (os.path.abspath(path), algorithm)
    st = os.stat(path)
    stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
    known = _DIGESTS.get(key)
    if known is not None and known[:3] == stamp:
        return known[3]
    h = hashlib.new(algorithm)
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    digest = h.hexdigest()
    after = os.stat(path)
    # kept only for a file not changed while it was read, and not modified in the last 2 s (a rewrite
    # within the file system's clock tick would keep its time stamp: git's "racy" case)
    if (after.st_size, after.st_mtime_ns, after.st_ino) == stamp and time.time_ns() - st.st_mtime_ns > 2_000_000_000:
        _DIGESTS[key] = (*stamp, digest)
    return digest
