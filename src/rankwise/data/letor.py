r"""Learning-to-rank data in the LETOR / svmlight format, grouped into padded query lists.

One document per line::

    <relevance> qid:<query id> <feature>:<value> <feature>:<value> ... # optional comment

the format of MSLR-WEB10K / MSLR-WEB30K (136 features, relevance 0-4, ``Fold1..5/{train,vali,test}.txt``),
the Yahoo! Learning to Rank Challenge (700 features, sparse: absent features are 0) and LETOR 3.0 / 4.0.
Feature indices are 1-based and increasing within a line; relevance is a non-negative number.

:func:`read_letor` parses one file with scikit-learn's compiled svmlight reader (the file is
streamed, no Python object per line or value) and checks the result; when the file is malformed,
a line-by-line scan finds the first bad line, and the :class:`~rankwise.data.DataFormatError`
names the file and that line (``row`` = line number): a malformed line, a missing or non-integer
``qid``, a feature index 0, above ``num_features`` or not increasing, a value that is not a finite
number (NaN, inf, beyond the float32 range) or a negative relevance.

Limits (:mod:`rankwise.data._files`), checked before the documents become dense arrays: a file of at
most ``MAX_LETOR_BYTES`` (4 GiB; a ``.gz`` / ``.bz2`` file: its decompressed content, counted
before it is parsed), a feature index of at most ``MAX_FEATURE_INDEX`` (100,000) and at most
``MAX_DENSE_ELEMENTS`` (2**30) documents x features over the files of a dataset
(:func:`check_dense_size`); beyond them the file is refused with an error naming it, the value and
the limit.

:func:`load_letor` (registered dataset ``letor``) reads the train / validation / test files,
groups the documents of each query (queries in order of first appearance, documents in file
order; a query split over several blocks of the file is one list), optionally drops the queries
without a relevant document, and standardises every feature with the mean and standard
deviation of the TRAINING documents (a constant feature is only centred). Each split is a
:class:`QueryLists`: the documents of all queries in one float32 array plus query offsets; its items
are whole queries, and :func:`pad_lists` batches them into ``(queries, list)`` tensors padded with
``y_true = -1`` (allRank's ``PADDED_Y_VALUE``) and zero features. Training lists longer than a
slate length are sampled by :class:`SlateSampler` (allRank's ``slate_length``).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from rankwise._progress import Steps
from rankwise.data._base import DataFileNotFoundError, DataFormatError, register_dataset
from rankwise.data._files import (
    FLOAT32_MAX,
    MAX_DENSE_ELEMENTS,
    MAX_FEATURE_INDEX,
    MAX_LETOR_BYTES,
    check_file,
    excerpt,
    read_limited_chunks,
)

__all__ = [
    "PADDED_Y_VALUE",
    "QueryLists",
    "RankingData",
    "SlateSampler",
    "build_ranking_data",
    "check_dense_size",
    "group_queries",
    "load_letor",
    "load_letor_preset",
    "pad_lists",
    "query_order",
    "read_letor",
    "read_letor_dense",
    "standardize_like",
]

#: ``y_true`` of padded list slots (allRank's convention, the losses' ``padded_value_indicator``)
PADDED_Y_VALUE = -1.0

_DECIMAL = re.compile(rb"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_INTEGER = re.compile(rb"[+-]?[0-9]+")


# --------------------------------------------------------------------------------------------- reading


def _number(token: bytes, path: Path, line: int, what: str) -> float:
    if not _DECIMAL.fullmatch(token):
        raise DataFormatError(path, line, f"{what}: cannot parse {excerpt(token.decode('latin-1'))} as a number")
    v = float(token)
    if not abs(v) <= FLOAT32_MAX:
        raise DataFormatError(path, line, f"{what}: value {excerpt(token.decode())} is outside the float32 range")
    return v


def _check_line(raw: bytes, path: Path, line: int, num_features: int | None, limit: str | None = None) -> bool:
    """Raise :class:`DataFormatError` for a malformed LETOR line; False for a blank / comment-only line.

    ``limit``: what ``num_features`` stands for, in the error of an index above it (None: the option)."""
    body = raw.split(b"#", 1)[0].strip()
    if not body:
        return False
    tokens = body.split()
    label = _number(tokens[0], path, line, "relevance")
    if label < 0:
        raise DataFormatError(path, line, f"relevance {tokens[0].decode()} is negative (expected a grade >= 0)")
    if len(tokens) < 2 or not tokens[1].startswith(b"qid:"):
        raise DataFormatError(path, line, "expected `qid:<integer>` after the relevance")
    qid = tokens[1][4:]
    if not _INTEGER.fullmatch(qid):
        raise DataFormatError(path, line, f"qid {excerpt(qid.decode('latin-1'))} is not an integer")
    if not -(2**63) <= int(qid) < 2**63:
        raise DataFormatError(path, line, f"qid {excerpt(qid.decode())} is beyond the 64-bit integer range")
    last = 0
    for tok in tokens[2:]:
        index, sep, value = tok.partition(b":")
        if not sep or not _INTEGER.fullmatch(index):
            raise DataFormatError(
                path, line, f"expected `<feature index>:<value>`, got {excerpt(tok.decode('latin-1'))}"
            )
        i = int(index)
        if i < 1:
            raise DataFormatError(path, line, f"feature index {i} (feature indices start at 1)")
        if num_features is not None and i > num_features:
            raise DataFormatError(
                path,
                line,
                f"feature index {i} is above {limit}"
                if limit
                else f"feature index {i} is above `num_features` = {num_features} (option `num_features`, in a "
                "config `data.options.num_features`: raise it to the files' largest index, or null to take that "
                "index)",
            )
        if i <= last:
            raise DataFormatError(path, line, f"feature index {i} after {last}: indices must be increasing")
        last = i
        _number(value, path, line, f"feature {i}")
    return True


#: the UTF-8 byte-order mark that some editors (Windows Notepad) write at the start of a text file
_BOM = b"\xef\xbb\xbf"


def _opener(path: Path) -> Any:
    import bz2
    import gzip

    return {".gz": gzip.open, ".bz2": bz2.open}.get(path.suffix, open)


def _locate_error(path: Path, num_features: int | None, limit: str | None = None) -> None:
    """Scan ``path`` line by line and raise the error of its first malformed line (if any)."""
    with _opener(path)(path, "rb") as fh:
        for line, raw in enumerate(fh, start=1):
            _check_line(raw.removeprefix(_BOM) if line == 1 else raw, path, line, num_features, limit)


def check_dense_size(path: str | Path, documents: int, features: int) -> None:
    """A :class:`DataFormatError` naming ``path`` unless ``documents`` x ``features`` float32 values fit
    the limit of dense feature values (``MAX_DENSE_ELEMENTS``, 2**30: 4 GiB); checked before the
    sparse documents are expanded."""
    values = int(documents) * int(features)
    if values > MAX_DENSE_ELEMENTS:
        raise DataFormatError(
            path,
            None,
            f"{documents:,} documents x {features:,} features = {values:,} dense feature values "
            f"({values * 4 / 2**30:.1f} GiB as float32), more than the limit of {MAX_DENSE_ELEMENTS:,} values",
        )


def _check_num_features(num_features: int | None) -> None:
    if num_features is not None and (isinstance(num_features, bool) or not isinstance(num_features, int)):
        raise TypeError(f"`num_features` must be a positive int or None, got {num_features!r}")
    if num_features is not None and not 1 <= num_features <= MAX_FEATURE_INDEX:
        raise ValueError(
            f"`num_features` must be a positive int of at most {MAX_FEATURE_INDEX:,} (the limit of feature "
            f"indices) or None, got {num_features!r}"
        )


def _check_content_size(p: Path) -> None:
    """The decompressed content of a ``.gz`` / ``.bz2`` file is at most ``MAX_LETOR_BYTES`` (counted, not kept;
    a corrupt or truncated file is left to the reader, whose error says so)."""
    if _opener(p) is open:
        return
    with contextlib.suppress(OSError, EOFError), _opener(p)(p, "rb") as fh:
        read_limited_chunks(fh, p, MAX_LETOR_BYTES)


def _load_svmlight(p: Path, num_features: int | None) -> tuple[Any, np.ndarray, np.ndarray]:
    """scikit-learn's reader on ``p``, past a leading UTF-8 byte-order mark if the file has one."""
    from sklearn.datasets import load_svmlight_file

    kw: dict[str, Any] = {"n_features": num_features, "dtype": np.float32, "zero_based": False, "query_id": True}
    with _opener(p)(p, "rb") as fh:
        if fh.read(len(_BOM)) == _BOM:  # read from the open file, after the mark
            return load_svmlight_file(fh, **kw)
    return load_svmlight_file(str(p), **kw)


def read_letor(
    path: str | Path, *, num_features: int | None = None, limit: str | None = None
) -> tuple[Any, np.ndarray, np.ndarray]:
    """Read one LETOR / svmlight file: ``(features, relevance, qid)``.

    ``features`` is a float32 ``scipy.sparse.csr_matrix`` of shape ``(documents, num_features)``
    (``num_features`` None: the largest index in the file), ``relevance`` float32 and ``qid``
    int64 arrays of length ``documents``, in file order. A ``.gz`` or ``.bz2`` file is decompressed. Every
    error is a :class:`~rankwise.data.DataFormatError` naming the file (and the line of a
    malformed line; see the module docstring). ``limit``: what ``num_features`` stands for, in the
    error of a feature index above it (default: the ``num_features`` option). A file larger than
    ``MAX_LETOR_BYTES`` or with a feature index above ``MAX_FEATURE_INDEX`` is refused (module doc).

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "train.txt"
        >>> _ = p.write_text("2 qid:7 1:0.5 3:1.5 # doc A\\n0 qid:7 2:-1\\n")
        >>> x, y, qid = read_letor(p, num_features=3)
        >>> x.toarray().tolist(), y.tolist(), qid.tolist()
        ([[0.5, 0.0, 1.5], [0.0, -1.0, 0.0]], [2.0, 0.0], [7, 7])
    """
    _check_num_features(num_features)
    p = check_file(path, "LETOR / svmlight file", max_bytes=MAX_LETOR_BYTES)
    _check_content_size(p)
    try:
        import sklearn.datasets  # noqa: F401
    except ImportError as e:  # pragma: no cover - the train extra is missing
        raise ImportError(f"reading LETOR files needs scikit-learn: pip install 'rankwise[train]' ({e})") from None
    try:
        x, y, qid = _load_svmlight(p, num_features)
    except (ValueError, UnicodeDecodeError, OverflowError) as err:  # OverflowError: a qid beyond int64
        _locate_error(p, num_features, limit)
        raise DataFormatError(p, None, f"cannot read the file as LETOR / svmlight: {err}") from None
    except (OSError, EOFError) as err:  # unreadable, or a corrupt / truncated .gz or .bz2
        why = getattr(err, "strerror", None) or str(err) or type(err).__name__
        raise DataFormatError(p, None, f"cannot read the file: {why}") from None
    n = x.shape[0]
    if (
        len(qid) != n
        or not np.isfinite(y).all()
        or (y < 0).any()
        or not np.isfinite(x.data).all()  # NaN, inf, or beyond the float32 range (parsed as inf)
    ):
        _locate_error(p, num_features, limit)
        raise DataFormatError(p, None, "cannot read the file as LETOR / svmlight")  # pragma: no cover
    if n == 0:
        raise DataFormatError(p, None, "no document in the file (expected `<relevance> qid:<id> <index>:<value> ...`)")
    if x.shape[1] > MAX_FEATURE_INDEX:  # the line holding the first index above the limit
        _locate_error(p, MAX_FEATURE_INDEX, f"the limit of {MAX_FEATURE_INDEX:,} features (each index is a column)")
    return x, y.astype(np.float32), np.asarray(qid, dtype=np.int64)


#: bytes of the buffer the compiled parser reads the file through (a block holds whole lines; the buffer grows
#: only for a line longer than it)
_BLOCK_BYTES = 1 << 22
#: bytes searched at a time, from a block's end, for its last newline
_TAIL_BYTES = 1 << 16


def _last_newline(buf: np.ndarray, start: int, stop: int) -> int:
    """The index of the last newline in ``buf[start:stop]``, -1 when there is none (searched from the end,
    ``_TAIL_BYTES`` at a time: a short copy per block, not a copy of the block)."""
    hi = stop
    while hi > start:
        lo = max(start, hi - _TAIL_BYTES)
        k = buf[lo:hi].tobytes().rfind(b"\n")
        if k >= 0:
            return lo + k
        hi = lo
    return -1


def _line_blocks(fh: Any, steps: Steps | None = None) -> Any:
    """Blocks of whole lines of an open binary file (the last may lack its newline), past a leading BOM: ``uint8``
    views of one buffer that the file is read into, each valid until the next block is asked for; ``steps``
    counts the bytes read."""
    buf = np.empty(_BLOCK_BYTES, np.uint8)
    head = fh.read(len(_BOM))
    if steps is not None:
        steps.advance(len(head))
    head = b"" if head == _BOM else head
    have = len(head)
    buf[:have] = np.frombuffer(head, np.uint8)
    searched = 0  # buf[:searched] of the carried bytes holds no newline
    while True:
        if have == len(buf):  # a line longer than the buffer: read on into a larger one
            bigger = np.empty(2 * len(buf), np.uint8)
            bigger[:have] = buf
            buf = bigger
        got = fh.readinto(buf[have:].data)
        if steps is not None and got:
            steps.advance(got)
        if not got:
            if have:
                yield buf[:have]
            return
        n = have + got
        cut = _last_newline(buf, searched, n) + 1
        if cut == 0:
            have = searched = n
            continue
        yield buf[:cut]
        have = searched = n - cut
        buf[:have] = buf[cut:n].copy()


def _letor_kernel() -> Any:
    try:
        from rankwise._kernels._numba_text import letor_block
    except ImportError:  # pragma: no cover - numba is a dependency; scikit-learn's reader then
        return None
    return letor_block


def _slow_buffer(width: int) -> np.ndarray:
    return np.empty((max(1 << 16, 4 * (width + 2)), 4), dtype=np.int64)


def _scan_letor(p: Path, steps: Steps | None = None) -> tuple[int, int] | None:
    """``(documents, largest feature index)`` of ``p`` from the compiled parser; None when it refuses a line
    (or is unavailable). ``steps`` counts the bytes read."""
    kernel = _letor_kernel()
    if kernel is None:  # pragma: no cover
        return None
    slow, none32 = _slow_buffer(0), np.zeros((0, 0), np.float32)
    none64, noneq = np.zeros(0), np.zeros(0, np.int64)
    rows = largest = 0
    with _opener(p)(p, "rb") as fh:
        for block in _line_blocks(fh, steps):
            _, rows, status, _, big = kernel(block, 0, none32, none64, noneq, rows, False, slow, 0)
            if status:
                return None
            largest = max(largest, int(big))
    return int(rows), largest


def _resolve_slow(block: np.ndarray, slow: np.ndarray, x: np.ndarray, y: np.ndarray) -> bool:
    """Convert the recorded numbers with ``float`` (row, column (-1: relevance), start, stop); False for a value
    out of range (a negative or non-finite relevance, a feature beyond float32)."""
    with np.errstate(over="ignore"):
        for r, col, a, b in slow.tolist():
            v = float(block[a:b].tobytes())
            if col < 0:
                if not (0 <= v < float("inf")):
                    return False
                y[r] = v
            else:
                f = np.float32(v)
                if not np.isfinite(f):
                    return False
                if f != 0:  # a zero stays +0.0
                    x[r, col] = f
    return True


def _fill_letor(
    p: Path, rows: int, width: int, steps: Steps | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The documents of ``p`` (``rows`` of them, from :func:`_scan_letor`) as dense float32 ``(rows, width)``
    features, float64 relevance and int64 qid; None when the compiled parser refuses a line. ``steps``
    counts the bytes read."""
    kernel = _letor_kernel()
    if kernel is None:  # pragma: no cover
        return None
    x = np.zeros((rows, width), np.float32)
    y = np.zeros(rows, np.float64)
    q = np.zeros(rows, np.int64)
    slow = _slow_buffer(width)
    row = 0
    with _opener(p)(p, "rb") as fh:
        for block in _line_blocks(fh, steps):
            pos = 0
            while True:  # more documents than scanned (the file grew) is status 1
                pos, row, status, nslow, _ = kernel(block, pos, x, y, q, row, True, slow, 0)
                if status == 1 or not _resolve_slow(block, slow[:nslow], x, y):
                    return None
                if status == 0:
                    break
    return (x, y, q) if row == rows else None


def _letor_scan(
    p: Path, num_features: int | None, limit: str | None, steps: Steps | None = None
) -> tuple[int, int] | None:
    """``(documents, largest index)`` of the LETOR file ``p`` (checked: size, compressed size) with the errors of
    :func:`read_letor`; None when only scikit-learn's reader can read it (the compiled one refuses a line
    that the line checker accepts)."""
    try:
        scanned = _scan_letor(p, steps)
    except (OSError, EOFError) as err:  # unreadable, or a corrupt / truncated .gz or .bz2
        why = getattr(err, "strerror", None) or str(err) or type(err).__name__
        raise DataFormatError(p, None, f"cannot read the file: {why}") from None
    if scanned is None:
        _locate_error(p, num_features, limit)  # the line and what is wrong with it
        return None
    rows, largest = scanned
    if rows == 0:
        raise DataFormatError(p, None, "no document in the file (expected `<relevance> qid:<id> <index>:<value> ...`)")
    if largest > MAX_FEATURE_INDEX:
        _locate_error(p, MAX_FEATURE_INDEX, f"the limit of {MAX_FEATURE_INDEX:,} features (each index is a column)")
    if num_features is not None and largest > num_features:
        _locate_error(p, num_features, limit)
    return rows, largest


def _letor_dense(
    p: Path,
    scanned: tuple[int, int] | None,
    width: int,
    num_features: int | None,
    limit: str | None,
    steps: Steps | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The documents of ``p`` as dense float32 features ``(documents, width)``, float32 relevance, int64 qid."""
    filled = None
    if scanned is not None:
        try:
            filled = _fill_letor(p, scanned[0], width, steps)
        except (OSError, EOFError) as err:  # pragma: no cover - read once already
            why = getattr(err, "strerror", None) or str(err) or type(err).__name__
            raise DataFormatError(p, None, f"cannot read the file: {why}") from None
    if filled is None:
        x, y, q = _dense(read_letor(p, num_features=num_features, limit=limit), width)
        return x, y, q
    x, y, q = filled
    return x, y.astype(np.float32), q


def read_letor_dense(
    path: str | Path, *, num_features: int | None = None, limit: str | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read one LETOR / svmlight file as dense arrays: ``(features, relevance, qid)``.

    The values of :func:`read_letor` (same rules, same errors) with ``features`` a float32
    ``(documents, num_features)`` array (``num_features`` None: the largest index in the file),
    parsed by a compiled reader straight from the file's bytes into that array: two passes over the
    file (count, then fill), memory = the array plus a block of the file. Each number is the float64
    that Python's ``float`` reads, rounded to float32 (scikit-learn's values exactly). A file the
    compiled reader refuses but the rules accept is read by :func:`read_letor`. Under the ``rankwise``
    commands, a read longer than 2 s prints progress lines on stderr (the bytes read of both passes;
    none with ``--no-progress``).

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "train.txt"
        >>> _ = p.write_text("2 qid:7 1:0.5 3:1.5 # doc A\\n0 qid:7 2:-1\\n")
        >>> x, y, qid = read_letor_dense(p, num_features=3)
        >>> x.tolist(), y.tolist(), qid.tolist()
        ([[0.5, 0.0, 1.5], [0.0, -1.0, 0.0]], [2.0, 0.0], [7, 7])
    """
    _check_num_features(num_features)
    p = check_file(path, "LETOR / svmlight file", max_bytes=MAX_LETOR_BYTES)
    _check_content_size(p)
    plain = _opener(p) is open  # a compressed file: its decompressed size is not known up front
    with Steps(f"reading {p.name} (2 passes)", 2 * p.stat().st_size if plain else None, "bytes") as steps:
        scanned = _letor_scan(p, num_features, limit, steps)
        if scanned is None:
            x, y, q = read_letor(p, num_features=num_features, limit=limit)
            width = x.shape[1]
            check_dense_size(p, x.shape[0], width)
            return _dense((x, y, q), width)
        width = scanned[1] if num_features is None else num_features
        check_dense_size(p, scanned[0], width)
        return _letor_dense(p, scanned, width, num_features, limit, steps)


# --------------------------------------------------------------------------------------------- lists


class QueryLists(Dataset):
    """The documents of a split grouped by query; item ``i`` = ``(features (n_i, D), relevance (n_i,))``.

    ``x`` (float32, ``(documents, D)``) and ``y`` (float32) hold the documents of query ``i`` in
    rows ``offsets[i]:offsets[i + 1]``; ``qids`` are the queries' ids.
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, offsets: np.ndarray, qids: np.ndarray) -> None:
        self.x = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        self.y = torch.from_numpy(np.ascontiguousarray(y, dtype=np.float32))
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.qids = np.asarray(qids, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.qids)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.x[a:b], self.y[a:b]

    @property
    def lengths(self) -> np.ndarray:
        """Number of documents of each query."""
        return np.diff(self.offsets)

    @property
    def num_documents(self) -> int:
        return int(self.offsets[-1]) if len(self.offsets) else 0


def pad_lists(items: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch query lists into ``(features (Q, L, D), relevance (Q, L))``, ``L`` = the longest list.

    Padded slots get zero features and relevance ``-1`` (:data:`PADDED_Y_VALUE`).

    Example:
        >>> import torch
        >>> x, y = pad_lists([(torch.ones(2, 3), torch.tensor([1.0, 0.0])), (torch.ones(1, 3), torch.tensor([2.0]))])
        >>> x.shape, y.tolist()
        (torch.Size([2, 2, 3]), [[1.0, 0.0], [2.0, -1.0]])
    """
    if not items:
        raise ValueError("`items` must hold at least one query list")
    d = items[0][0].shape[-1]
    longest = max(int(it[1].shape[0]) for it in items)
    x = torch.zeros(len(items), longest, d, dtype=items[0][0].dtype)
    y = torch.full((len(items), longest), PADDED_Y_VALUE, dtype=items[0][1].dtype)
    for i, (xi, yi) in enumerate(items):
        x[i, : len(yi)] = xi
        y[i, : len(yi)] = yi
    return x, y


class SlateSampler(Dataset):
    """Training lists of at most ``slate_length`` documents: item ``g`` is query ``g % len(lists)``.

    A query with more documents than ``slate_length`` is replaced by a uniform random subset of
    ``slate_length`` of them in random order (allRank's ``FixLength``), drawn from a generator
    seeded by ``(seed, g)`` (``numpy.random.SeedSequence``): with
    :class:`~rankwise.recipes.common.EpochIndexSampler` every epoch draws anew and a resumed run
    replays the same draws. When the subset holds no relevant document (relevance > 0) and the
    query has some, one chosen slot is replaced by a relevant document drawn uniformly (allRank's
    ``FixLength`` also keeps a relevant document, by redrawing). Shorter queries are returned whole
    (:func:`pad_lists` pads the batch). ``slate_length`` None: every list whole.
    """

    def __init__(self, lists: QueryLists, slate_length: int | None, seed: int, length: int | None = None) -> None:
        if slate_length is not None and (isinstance(slate_length, bool) or int(slate_length) < 1):
            raise ValueError(f"`slate_length` must be a positive int or None, got {slate_length!r}")
        self.lists, self.seed = lists, int(seed)
        self.slate_length = None if slate_length is None else int(slate_length)
        self.length = len(lists) if length is None else int(length)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, g: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.lists[int(g) % len(self.lists)]
        n, m = int(y.shape[0]), self.slate_length
        if m is None or n <= m:
            return x, y
        state = np.random.SeedSequence([self.seed, int(g)]).generate_state(1, np.uint64)[0]
        gen = torch.Generator().manual_seed(int(state >> np.uint64(1)))
        idx = torch.randperm(n, generator=gen)[:m]
        if not bool((y[idx] > 0).any()):
            relevant = torch.nonzero(y > 0).flatten()
            if len(relevant):
                pick = relevant[torch.randint(len(relevant), (1,), generator=gen)]
                idx[torch.randint(m, (1,), generator=gen)] = pick
        return x[idx], y[idx]


# --------------------------------------------------------------------------------------------- dataset


@dataclass
class RankingData:
    """A learning-to-rank dataset: train / val / test :class:`QueryLists` of ``num_features`` features.

    ``meta``: ``"source"`` (files read), ``"mean"`` / ``"std"`` (the training standardisation, None
    without it), ``"dropped_queries"`` (per split, queries without a relevant document dropped).
    """

    name: str
    train: QueryLists
    val: QueryLists
    test: QueryLists
    num_features: int
    meta: dict[str, Any] = field(default_factory=dict)
    #: the dataset's modality (:data:`rankwise.data.MODALITIES`)
    modality: ClassVar[str] = "query_lists"

    def sizes(self) -> tuple[int, int, int]:
        """Queries in ``(train, val, test)``."""
        return len(self.train), len(self.val), len(self.test)


def query_order(qid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """How :func:`group_queries` groups documents: ``(order, offsets, qids)``.

    ``order`` is the permutation of the documents (queries in order of first appearance, documents
    in input order within a query): grouped document ``j`` is input document ``order[j]``; query
    ``i`` holds grouped documents ``offsets[i]:offsets[i + 1]`` and has id ``qids[i]``.

    Example:
        >>> import numpy as np
        >>> order, offsets, qids = query_order(np.array([7, 3, 7, 3, 9]))
        >>> order.tolist(), offsets.tolist(), qids.tolist()
        ([0, 2, 1, 3, 4], [0, 2, 4, 5], [7, 3, 9])
    """
    qid = np.asarray(qid, dtype=np.int64)
    if len(qid) == 0:
        return np.zeros(0, np.int64), np.zeros(1, np.int64), qid
    uniq, first, inverse, counts = np.unique(qid, return_index=True, return_inverse=True, return_counts=True)
    rank = np.empty(len(uniq), dtype=np.int64)
    by_first = np.argsort(first, kind="stable")
    rank[by_first] = np.arange(len(uniq))
    order = np.argsort(rank[inverse], kind="stable")
    offsets = np.concatenate([[0], np.cumsum(counts[by_first])])
    return order, offsets, uniq[by_first]


def group_queries(x: np.ndarray, y: np.ndarray, qid: np.ndarray) -> QueryLists:
    """Group documents by query id: queries in order of first appearance, documents in input order
    (the permutation is :func:`query_order`'s)."""
    if len(qid) == 0:
        qid = np.asarray(qid, dtype=np.int64)
        return QueryLists(np.zeros((0, x.shape[1]), np.float32), np.zeros(0, np.float32), np.zeros(1, np.int64), qid)
    order, offsets, qids = query_order(qid)
    if np.array_equal(order, np.arange(len(order))):  # queries already contiguous: no copy
        return QueryLists(x, y, offsets, qids)
    return QueryLists(x[order], y[order], offsets, qids)


#: rows per block when standardising (float64 temporaries of this many rows, not of the whole split)
_BLOCK_ROWS = 1 << 16


def _train_moments(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature mean and population standard deviation (0 -> 1) of ``x``, in float64, two passes by blocks."""
    n = x.shape[0]
    blocks = range(0, n, _BLOCK_ROWS)
    mean = sum(x[i : i + _BLOCK_ROWS].sum(axis=0, dtype=np.float64) for i in blocks) / n
    var = sum(_squared_deviations(x[i : i + _BLOCK_ROWS], mean) for i in blocks) / n
    std = np.sqrt(var)
    return mean, np.where(std > 0, std, 1.0)


def _squared_deviations(block: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """``((block - mean) ** 2).sum(axis=0)`` in float64 with one temporary of the block's size."""
    t = block.astype(np.float64)
    t -= mean
    np.square(t, out=t)
    return t.sum(axis=0)


#: rows per block of the standardisation itself (elementwise: the block size does not change the values)
_STANDARDIZE_ROWS = 1 << 12


def _standardized(x: np.ndarray, mean: np.ndarray, std: np.ndarray, *, copy: bool = True) -> np.ndarray:
    """``(x - mean) / std`` as float32 (computed in float64 by blocks of rows): a new array, or written over
    ``x`` (float32) when not ``copy``."""
    out = np.empty(x.shape, dtype=np.float32) if copy else x
    for i in range(0, x.shape[0], _STANDARDIZE_ROWS):
        t = x[i : i + _STANDARDIZE_ROWS].astype(np.float64)
        t -= mean
        t /= std
        out[i : i + _STANDARDIZE_ROWS] = t
    return out


def standardize_like(x: np.ndarray, meta: dict[str, Any]) -> np.ndarray:
    """``x`` (float32, ``(documents, D)``) standardised as a :class:`RankingData`'s training split was:
    with its ``meta["mean"]`` / ``meta["std"]``; unchanged when the data were not standardised
    (``mean`` None). The features of new documents scored by a model trained on that data.

    Example:
        >>> import numpy as np
        >>> meta = {"mean": np.array([0.0, 2.0]), "std": np.array([1.0, 2.0])}
        >>> standardize_like(np.array([[1.0, 4.0]], np.float32), meta)
        array([[1., 1.]], dtype=float32)
    """
    mean, std = meta.get("mean"), meta.get("std")
    if mean is None or std is None:
        return np.asarray(x, dtype=np.float32)
    return _standardized(np.asarray(x, dtype=np.float32), np.asarray(mean), np.asarray(std))


def _drop_without_relevant(lists: QueryLists) -> tuple[QueryLists, int]:
    y = lists.y.numpy()
    query_of = np.repeat(np.arange(len(lists)), lists.lengths)
    keep = np.bincount(query_of, weights=(y > 0).astype(np.float64), minlength=len(lists)) > 0
    if keep.all():
        return lists, 0
    rows = keep[query_of]
    offsets = np.concatenate([[0], np.cumsum(lists.lengths[keep])])
    return QueryLists(lists.x.numpy()[rows], y[rows], offsets, lists.qids[keep]), int((~keep).sum())


def build_ranking_data(
    name: str,
    splits: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
    *,
    standardize: bool = True,
    drop_no_relevant: Literal["none", "train", "all"] = "none",
    meta: dict[str, Any] | None = None,
    copy: bool = True,
) -> RankingData:
    """:class:`RankingData` from dense ``(x, y, qid)`` arrays of ``train``, ``val`` and ``test``.

    Features are standardised with the training documents' mean and (population) standard
    deviation (std 0 -> 1) when ``standardize``; ``drop_no_relevant`` drops the queries without a
    document of relevance > 0 from no split, the training split, or every split. ``copy`` False:
    the float32 feature arrays given are standardised in place (no second copy of the features;
    the caller gives them up).
    """
    if drop_no_relevant not in ("none", "train", "all"):
        raise ValueError(f"`drop_no_relevant` must be 'none', 'train' or 'all', got {drop_no_relevant!r}")
    lists = {s: group_queries(*splits[s]) for s in ("train", "val", "test")}
    dropped = {}
    for s in ("train", "val", "test"):
        if drop_no_relevant == "all" or (drop_no_relevant == "train" and s == "train"):
            lists[s], dropped[s] = _drop_without_relevant(lists[s])
        else:
            dropped[s] = 0
    info = dict(meta or {})
    d = lists["train"].x.shape[1]
    mean = std = None
    if standardize and lists["train"].num_documents:
        mean, std = _train_moments(lists["train"].x.numpy())
        for part in lists.values():
            part.x = torch.from_numpy(_standardized(part.x.numpy(), mean, std, copy=copy))
    info |= {"mean": mean, "std": std, "dropped_queries": dropped, "standardize": bool(standardize)}
    return RankingData(name, lists["train"], lists["val"], lists["test"], d, info)


def _dense(parts: tuple[Any, np.ndarray, np.ndarray], d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x, y, qid = parts
    x = x.tocsr()
    if x.shape[1] < d:
        import scipy.sparse as sp

        x = sp.csr_matrix((x.data, x.indices, x.indptr), shape=(x.shape[0], d))
    return np.asarray(x.toarray(), dtype=np.float32), y, qid


@register_dataset(
    "letor",
    modality="query_lists",
    description="learning-to-rank files in the LETOR / svmlight format (MSLR-WEB, Yahoo LTR)",
)
def load_letor(
    path: str,
    *,
    fold: int | None = None,
    train: str = "train.txt",
    val: str = "vali.txt",
    test: str = "test.txt",
    num_features: int | None = None,
    standardize: bool = True,
    drop_no_relevant: Literal["none", "train", "all"] = "none",
) -> RankingData:
    """Learning-to-rank data in LETOR / svmlight files (``<relevance> qid:<id> <index>:<value> ... # comment``).

    Reads ``path/[Fold<fold>/]{train,val,test}``: MSLR-WEB10K / 30K with ``fold=1..5`` (files
    ``train.txt``, ``vali.txt``, ``test.txt``, 136 features, relevance 0-4); Yahoo! LTR with
    ``train=set1.train.txt``, ``val=set1.valid.txt``, ``test=set1.test.txt`` (700 features).
    Documents are grouped by ``qid`` into query lists; features are standardised with the
    training documents' mean and standard deviation (``standardize``); ``drop_no_relevant``
    (none / train / all) drops the queries without a document of relevance > 0 from no split,
    the training split or every split. ``num_features`` (None: the largest index in the three
    files) bounds the feature indices: a larger index is an error naming the file and line; a
    value more than twice the largest index is kept with a note in ``meta["notes"]`` (the CLI
    prints it as a warning). ``meta["max_feature_index"]``: the largest index in the three files.

    Options: ``path`` (folder), ``fold``, ``train``, ``val``, ``test`` (file names, ``.gz`` allowed),
    ``num_features``, ``standardize``, ``drop_no_relevant``.
    """
    return _load_letor(
        path,
        fold=fold,
        train=train,
        val=val,
        test=test,
        num_features=num_features,
        standardize=standardize,
        drop_no_relevant=drop_no_relevant,
        from_preset=False,
    )


def load_letor_preset(preset_num_features: int, /, **options: Any) -> RankingData:
    """:func:`load_letor` with a ``num_features`` that only a preset gave (a fact about the preset's dataset).

    The preset's count is kept when it fits the files: their largest feature index is at most
    ``preset_num_features`` and at least half of it (MSLR-WEB10K's 136 dense features; Yahoo! LTR's
    700, of which the files use a sparse subset). Otherwise the files are the user's own, and their
    largest index is the feature count, with a note in ``meta["notes"]``. ``options``: those of
    :func:`load_letor` except ``num_features``; ``meta["resolved_options"]`` holds the count used.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> for f in ("train.txt", "vali.txt", "test.txt"):
        ...     _ = (d / f).write_text("1 qid:1 1:0.5 46:2\\n0 qid:1 2:1\\n")
        >>> data = load_letor_preset(136, path=str(d))
        >>> data.num_features, data.meta["resolved_options"]
        (46, {'num_features': 46})
        >>> load_letor_preset(60, path=str(d)).num_features
        60
    """
    if "num_features" in options:
        raise TypeError("load_letor_preset() takes the count as `preset_num_features`, not `num_features`")
    return _load_letor(**options, num_features=preset_num_features, from_preset=True)


def _load_letor(
    path: str,
    *,
    fold: int | None = None,
    train: str = "train.txt",
    val: str = "vali.txt",
    test: str = "test.txt",
    num_features: int | None = None,
    standardize: bool = True,
    drop_no_relevant: Literal["none", "train", "all"] = "none",
    from_preset: bool,
) -> RankingData:
    try:
        _check_num_features(num_features)
    except TypeError as e:
        raise ValueError(str(e)) from None
    if fold is not None and (isinstance(fold, bool) or not isinstance(fold, int) or fold < 1):
        raise ValueError(f"`fold` must be a positive int or None, got {fold!r}")
    if not Path(path).is_dir():
        raise DataFileNotFoundError(
            path,
            None,
            "LETOR folder not found (option `path`, in a config `data.options.path`: the folder holding "
            "Fold1..Fold5 of MSLR-WEB10K / 30K, or the Yahoo LTR set1.*.txt files, or train.txt / vali.txt / test.txt)",
        )
    root = Path(path)
    folder = root if fold is None else root / f"Fold{fold}"
    if not folder.is_dir():
        raise DataFileNotFoundError(folder, None, f"fold folder not found (`fold` = {fold}) under `path` {root}")
    files = {"train": folder / train, "val": folder / val, "test": folder / test}
    for s, f in files.items():
        if not f.is_file():
            raise DataFileNotFoundError(
                f,
                None,
                f"the {s} file is missing (option `path` = {root}; expected {train}, {val}, {test}: the file names "
                "are options `train`, `val`, `test`, in a config `data.options.train` ...)",
            )
    for f in files.values():
        check_file(f, "LETOR / svmlight file", max_bytes=MAX_LETOR_BYTES)
        _check_content_size(f)
    scans = {s: _letor_scan(f, None, None) for s, f in files.items()}  # (documents, largest index) or None
    parts: dict[str, Any] = {s: read_letor(f) for s, f in files.items() if scans[s] is None}  # CSR
    shape = {s: scans[s] or (parts[s][0].shape[0], parts[s][0].shape[1]) for s in files}
    largest = max(v[1] for v in shape.values())
    notes: list[str] = []
    if num_features is None:
        d = largest
    elif from_preset:
        d, note = _fit_preset_count(num_features, largest, root)
        notes += [note] if note else []
    else:
        for s, f in files.items():
            if shape[s][1] > num_features:  # the line holding the first index above it
                _locate_error(f, num_features)
        d = num_features
        if d > 2 * largest:
            notes.append(
                f"`data.options.num_features` = {d} is far above the largest feature index in the files of "
                f"{root} ({largest}): the model keeps {d} inputs, {d - largest} of them always 0 "
                "(null: the files' largest index)"
            )
    check_dense_size(folder, sum(v[0] for v in shape.values()), d)
    dense = {
        s: _dense(parts[s], d) if s in parts else _letor_dense(f, scans[s], d, None, None) for s, f in files.items()
    }
    parts.clear()
    data = build_ranking_data(
        "letor",
        dense,
        standardize=standardize,
        drop_no_relevant=drop_no_relevant,
        copy=False,
        meta={
            "source": {s: str(f) for s, f in files.items()},
            "max_feature_index": largest,
            "resolved_options": {"num_features": d},
        },
    )
    if len(data.train) and not _ranked_queries(data.train):
        notes.append(
            f"no training query of {files['train']} has two documents of different relevance (one document "
            "per query, or equal grades): every ranking loss is constant and the model learns nothing"
        )
    data.meta["notes"] = notes
    return data


def _ranked_queries(lists: QueryLists) -> int:
    """The queries of ``lists`` with at least two different relevance grades (the ones a ranking loss learns from)."""
    y = lists.y.numpy()
    starts = lists.offsets[:-1]  # every query has a document: strictly increasing
    return int((np.maximum.reduceat(y, starts) > np.minimum.reduceat(y, starts)).sum())


def _fit_preset_count(preset: int, largest: int, root: Path) -> tuple[int, str | None]:
    """The feature count of files whose ``num_features`` only a preset gave: the preset's when it fits them.

    It fits when the files' largest index is at most ``preset`` and at least half of it (a sparse index
    space such as Yahoo! LTR's leaves some top indices unused); otherwise the files are not the
    preset's dataset and their largest index is used, with a note saying so.
    """
    if largest <= preset <= 2 * largest:
        return preset, None
    return largest, (
        f"`data.options.num_features` = {preset} of the preset (its own dataset's) does not fit the files of "
        f"{root}, whose largest feature index is {largest}: using {largest} "
        "(set data.options.num_features to choose another)"
    )
