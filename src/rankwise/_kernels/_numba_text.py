"""Numba parsers of numeric text: blocks of LETOR / svmlight lines and of plain CSV rows, from bytes.

Both read a block of whole lines (a ``uint8`` array) and write the values straight into
preallocated arrays (no Python object per line or value). A number is the decimal grammar
``[+-]?(digits[.digits] | .digits)([eE][+-]?digits)?``; its value is the correctly rounded float64
(what Python's ``float`` gives) whenever the exact fast path applies (at most 17 significant digits
forming an integer ``m <= 2**53`` and a decimal exponent in ``[-22, 22]``: one exact product or
quotient of two exactly representable doubles, so one rounding). Any other number is recorded in
``slow`` (row, column, start, stop) for the caller to convert with ``float`` (rare in real files).

Each kernel returns ``(pos, row, status, nslow, ...)``: ``status`` 0 = the block is done, 1 = the
line starting at ``pos`` is malformed (the caller finds and names it), 2 = ``slow`` is full (convert
the recorded numbers and call again from ``pos``).

Importing this module raises ``ImportError`` when numba is unavailable.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["csv_block", "letor_block"]

#: 10**0 .. 10**22: every one exactly representable as a float64
_POW10 = np.array([float(10**k) for k in range(23)])
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_MANTISSA_MAX = 2**53
#: digits are accumulated while the integer is below this (at most 18 digits: no int64 overflow)
_ACCUMULATE_BELOW = 10**17


@numba.njit(cache=True, nogil=True, inline="always")
def _is_space(b):  # type: ignore[no-untyped-def]
    """ASCII whitespace of ``bytes.split()`` other than the newline: space, \\t, \\v, \\f, \\r."""
    return b == 32 or b == 9 or b == 11 or b == 12 or b == 13


@numba.njit(cache=True, nogil=True, inline="always")
def _decimal(buf, i, end):  # type: ignore[no-untyped-def]
    """The number at ``buf[i:end]``: ``(value, j, code)`` with ``j`` the index after it; ``code`` 0: exact
    value, 1: valid but needs Python's ``float``, 2: no number here."""
    neg = False
    if i < end and (buf[i] == 43 or buf[i] == 45):
        neg = buf[i] == 45
        i += 1
    m = np.int64(0)
    exp = 0
    lost = False
    first = i
    while i < end and 48 <= buf[i] <= 57:
        if m < _ACCUMULATE_BELOW:
            m = m * 10 + (buf[i] - 48)
        else:  # beyond 17 significant digits: the value needs Python's float
            exp += 1
            lost = True
        i += 1
    digits = i - first
    if i < end and buf[i] == 46:
        i += 1
        first = i
        while i < end and 48 <= buf[i] <= 57:
            if m < _ACCUMULATE_BELOW:
                m = m * 10 + (buf[i] - 48)
                exp -= 1
            elif buf[i] != 48:
                lost = True
            i += 1
        digits += i - first
    if digits == 0:
        return 0.0, i, 2
    if i < end and (buf[i] == 101 or buf[i] == 69):
        i += 1
        eneg = False
        if i < end and (buf[i] == 43 or buf[i] == 45):
            eneg = buf[i] == 45
            i += 1
        e = 0
        ne = 0
        while i < end and 48 <= buf[i] <= 57:
            if e < 1000000:
                e = e * 10 + (buf[i] - 48)
            ne += 1
            i += 1
        if ne == 0:
            return 0.0, i, 2
        exp += -e if eneg else e
    if m == 0:
        return (-0.0 if neg else 0.0), i, 0
    if lost or m > _MANTISSA_MAX or exp < -22 or exp > 22:
        return 0.0, i, 1
    v = float(m)
    v = v * _POW10[exp] if exp >= 0 else v / _POW10[-exp]
    return (-v if neg else v), i, 0


@numba.njit(cache=True, nogil=True, inline="always")
def _integer(buf, i, end):  # type: ignore[no-untyped-def]
    """The integer ``[+-]?digits`` at ``buf[i:end]``: ``(value, j, ok)``; not ok when there is none or it is
    beyond the int64 range."""
    neg = False
    if i < end and (buf[i] == 43 or buf[i] == 45):
        neg = buf[i] == 45
        i += 1
    v = np.uint64(0)
    n = 0
    big = False
    while i < end and 48 <= buf[i] <= 57:
        if v > np.uint64(922337203685477580):
            big = True
        v = v * np.uint64(10) + np.uint64(buf[i] - 48)
        n += 1
        i += 1
    limit = np.uint64(9223372036854775808) if neg else np.uint64(9223372036854775807)
    if n == 0 or big or v > limit:
        return np.int64(0), i, False
    if neg:
        return np.int64(0) - np.int64(v - np.uint64(1)) - np.int64(1), i, True
    return np.int64(v), i, True


@numba.njit(cache=True, nogil=True, inline="always")
def _ends_token(b):  # type: ignore[no-untyped-def]
    """A LETOR token ends at whitespace, a newline or a comment."""
    return b == 32 or 9 <= b <= 13 or b == 35


@numba.njit(cache=True, nogil=True, inline="always")
def _skip_space(buf, i, n):  # type: ignore[no-untyped-def]
    while i < n and _is_space(buf[i]):
        i += 1
    return i


@numba.njit(cache=True, nogil=True, inline="always")
def _line_end(buf, i, n):  # type: ignore[no-untyped-def]
    """The index after the newline that ends the line holding ``i`` (``n`` at the end of the block)."""
    while i < n and buf[i] != 10:
        i += 1
    return i + 1


@numba.njit(cache=True, nogil=True)
def letor_block(buf, pos, x, y, q, row, write, slow, nslow):  # type: ignore[no-untyped-def]
    """Parse the LETOR lines of ``buf[pos:]`` (``<relevance> qid:<int> <index>:<value> ... # comment``).

    ``write``: store relevance in ``y`` (float64), qid in ``q`` and feature ``k`` (1-based) of
    document ``row`` in ``x[row, k - 1]`` (float32, zero elsewhere; an index above ``x.shape[1]``
    is an error); otherwise only count the documents and find the largest index. Returns
    ``(pos, row, status, nslow, largest index)``; the rules of the line are those of
    :func:`rankwise.data.letor._check_line` (blank and comment-only lines skipped, indices
    increasing from 1, finite float32 values, non-negative relevance, an int64 qid). One pass
    over the bytes.
    """
    n = buf.shape[0]
    width = x.shape[1]
    cap = slow.shape[0]
    largest = 0
    while pos < n:
        if write and nslow + width + 2 > cap:
            return pos, row, 2, nslow, largest
        i = _skip_space(buf, pos, n)
        if i >= n or buf[i] == 10 or buf[i] == 35:  # blank or comment-only line
            pos = _line_end(buf, i, n)
            continue
        if write and row >= x.shape[0]:
            return pos, row, 1, nslow, largest
        v, j, code = _decimal(buf, i, n)
        if code == 2 or (j < n and not _ends_token(buf[j])):
            return pos, row, 1, nslow, largest
        if code == 1:
            if write:
                slow[nslow, 0] = row
                slow[nslow, 1] = -1
                slow[nslow, 2] = i
                slow[nslow, 3] = j
                nslow += 1
        elif v < 0:
            return pos, row, 1, nslow, largest
        elif write:
            y[row] = v
        i = _skip_space(buf, j, n)
        if i + 4 > n or buf[i] != 113 or buf[i + 1] != 105 or buf[i + 2] != 100 or buf[i + 3] != 58:
            return pos, row, 1, nslow, largest
        qv, j, ok = _integer(buf, i + 4, n)
        if not ok or (j < n and not _ends_token(buf[j])):
            return pos, row, 1, nslow, largest
        if write:
            q[row] = qv
        last = 0
        while True:
            i = _skip_space(buf, j, n)
            if i >= n or buf[i] == 10:
                pos = i + 1
                break
            if buf[i] == 35:
                pos = _line_end(buf, i, n)
                break
            idx = 0
            k = i
            if buf[k] == 43:
                k += 1
            start = k
            while k < n and 48 <= buf[k] <= 57:
                if idx < 1 << 40:
                    idx = idx * 10 + (buf[k] - 48)
                k += 1
            if k == start or k >= n or buf[k] != 58 or idx < 1 or idx <= last or (write and idx > width):
                return pos, row, 1, nslow, largest
            last = idx
            if idx > largest:
                largest = idx
            v, j, code = _decimal(buf, k + 1, n)
            if code == 2 or (j < n and not _ends_token(buf[j])):
                return pos, row, 1, nslow, largest
            if code == 1:
                if write:
                    slow[nslow, 0] = row
                    slow[nslow, 1] = idx - 1
                    slow[nslow, 2] = k + 1
                    slow[nslow, 3] = j
                    nslow += 1
            elif abs(v) > _FLOAT32_MAX and not np.isfinite(np.float32(v)):
                return pos, row, 1, nslow, largest
            elif write and v != 0:  # a zero stays +0.0 (a sparse matrix's dense form)
                x[row, idx - 1] = np.float32(v)
        row += 1
    return pos, row, 0, nslow, largest


@numba.njit(cache=True, nogil=True, inline="always")
def _is_pad(b):  # type: ignore[no-untyped-def]
    """What ``str.strip()`` removes, other than the newline."""
    return b == 32 or b == 9 or 11 <= b <= 13 or 28 <= b <= 31


@numba.njit(cache=True, nogil=True)
def csv_block(buf, pos, delim, ncols, want, out, row, slow, nslow):  # type: ignore[no-untyped-def]
    """Parse the plain CSV rows of ``buf[pos:]`` (no quotes; ``\\n`` or ``\\r\\n`` line ends; empty lines
    skipped): every row has ``ncols`` fields split by the byte ``delim``; field ``k`` with
    ``want[k] >= 0`` is a number (surrounding whitespace allowed, finite, ``|v| <= 3.4e38``) stored
    in ``out[row, want[k]]`` (float64). Returns ``(pos, row, status, nslow)``. One pass over the bytes;
    a carriage return is only allowed right before a newline (the caller checks)."""
    n = buf.shape[0]
    nout = out.shape[1]
    cap = slow.shape[0]
    while pos < n:
        if nslow + nout > cap:
            return pos, row, 2, nslow
        if buf[pos] == 10 or (buf[pos] == 13 and pos + 1 < n and buf[pos + 1] == 10):  # an empty line
            pos += 1 if buf[pos] == 10 else 2
            continue
        if row >= out.shape[0]:
            return pos, row, 1, nslow
        i = pos
        k = 0
        while True:  # field k starts at i
            if k >= ncols:
                return pos, row, 1, nslow
            col = want[k]
            if col >= 0:
                a = i
                while a < n and _is_pad(buf[a]):
                    a += 1
                v, j, code = _decimal(buf, a, n)
                if code == 2:
                    return pos, row, 1, nslow
                b = j
                while j < n and _is_pad(buf[j]):
                    j += 1
                if j < n and buf[j] != delim and buf[j] != 10:
                    return pos, row, 1, nslow
                if code == 1:
                    slow[nslow, 0] = row
                    slow[nslow, 1] = col
                    slow[nslow, 2] = a
                    slow[nslow, 3] = b
                    nslow += 1
                elif abs(v) > _FLOAT32_MAX:
                    return pos, row, 1, nslow
                else:
                    out[row, col] = v
            else:
                j = i
                while j < n and buf[j] != delim and buf[j] != 10:
                    j += 1
            k += 1
            if j >= n or buf[j] == 10:
                pos = j + 1
                break
            i = j + 1
        if k != ncols:
            return pos, row, 1, nslow
        row += 1
    return pos, row, 0, nslow
