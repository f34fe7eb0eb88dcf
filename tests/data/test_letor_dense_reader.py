"""The compiled LETOR reader (:func:`read_letor_dense`) gives scikit-learn's values exactly, on tricky files."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from rankwise.data import DataFormatError
from rankwise.data import letor as letor_mod
from rankwise.data.letor import read_letor, read_letor_dense

TRICKY = {
    "comments": (
        b"# a header comment\n2 qid:3 1:0.5 3:1.5 # doc A\n0 qid:3 2:-1#tight\n  # indented comment\n1 qid:1 1:2\n"
    ),
    "qid_order": b"1 qid:9 1:1\n0 qid:2 2:1\n2 qid:9 1:3 2:4\n0 qid:-5 1:0.25\n3 qid:2 3:7\n",
    "missing_features": b"1 qid:1\n0 qid:1 5:1e-3\n2 qid:2 2:.5 4:5.\n",
    "trailing_spaces": b"1 qid:1 1:1 2:2   \n0\tqid:1\t1:3\t\t\n",
    "empty_lines": b"\n\n1 qid:1 1:1\n\n   \n0 qid:1 2:2\n\n",
    "crlf": b"1 qid:1 1:1.5\r\n0 qid:1 2:2.25\r\n\r\n2 qid:2 1:-3\r\n",
    "no_final_newline": b"1 qid:1 1:1\n0 qid:1 2:2",
    "bom": b"\xef\xbb\xbf1 qid:1 1:1\n0 qid:1 2:2\n",
    "numbers": (
        b"4 qid:1 1:0.1 2:-0.0 3:1e22 4:1e23 5:123456789012345678901234 6:1.5e-38 "
        b"7:3.4028235e38 8:1e-45 9:4.9e-324 10:0.30000000000000004 11:+7 12:-.5e-2 13:00012.5000 "
        b"14:9007199254740993 15:2.5E+3 16:1e-400\n"
        b"0.5 qid:1 1:3.14159265358979323846264338327950288 2:12345678.9 3:0.000001 4:1E5\n"
        b"1e1 qid:9223372036854775807 1:1\n0 qid:-9223372036854775808 1:1\n"
    ),
}


def _sklearn(path, num_features=None):
    x, y, q = read_letor(path, num_features=num_features)
    return x.toarray(), y, q


@pytest.mark.parametrize("name", sorted(TRICKY))
def test_same_values_as_scikit_learn(tmp_path, name):
    p = tmp_path / "f.txt"
    p.write_bytes(TRICKY[name])
    x, y, q = read_letor_dense(p)
    rx, ry, rq = _sklearn(p)
    assert x.dtype == np.float32 and y.dtype == np.float32 and q.dtype == np.int64
    assert x.shape == rx.shape
    assert np.array_equal(x.view(np.uint32), rx.astype(np.float32).view(np.uint32))  # bit for bit (-0.0 too)
    assert np.array_equal(y, ry) and np.array_equal(q, rq)


def test_random_numbers_bit_for_bit(tmp_path):
    """Many digits, signs, exponents: the fast path and Python's ``float`` agree with scikit-learn everywhere."""
    rng = np.random.default_rng(0)
    lines = []
    for i in range(400):
        feats = []
        for k in sorted(rng.choice(40, size=rng.integers(0, 12), replace=False) + 1):
            mant = "".join(map(str, rng.integers(0, 10, size=rng.integers(1, 26))))
            e = int(rng.integers(-50, 12))
            form = rng.integers(0, 3)
            v = f"{mant}e{e}" if form == 0 else f"{rng.normal() * 10.0 ** rng.integers(-8, 8):.{rng.integers(0, 18)}f}"
            if form == 2:
                v = repr(float(rng.normal() * 10.0 ** rng.integers(-40, 38)))
            feats.append(f"{k}:{v}")
        lines.append(f"{rng.integers(0, 5)} qid:{i // 7} " + " ".join(feats))
    p = tmp_path / "r.txt"
    p.write_text("\n".join(lines) + "\n")
    x, y, q = read_letor_dense(p, num_features=40)
    rx, ry, rq = _sklearn(p, 40)
    assert np.array_equal(x.view(np.uint32), rx.astype(np.float32).view(np.uint32))
    assert np.array_equal(y, ry) and np.array_equal(q, rq)


def test_blocks_split_lines_and_slow_buffer(tmp_path, monkeypatch):
    """Lines cut across blocks, a line longer than a block, and a full buffer of slow numbers."""
    monkeypatch.setattr(letor_mod, "_BLOCK_BYTES", 37)
    monkeypatch.setattr(letor_mod, "_slow_buffer", lambda width: np.empty((width + 6, 4), np.int64))
    rows = [f"{i % 3} qid:{i // 4} " + " ".join(f"{k}:{k * 1.25e30 + i}" for k in range(1, 9)) for i in range(50)]
    p = tmp_path / "b.txt"
    p.write_text("\n".join(rows) + "\n")
    x, y, q = read_letor_dense(p)
    rx, ry, rq = _sklearn(p)
    assert np.array_equal(x, rx.astype(np.float32)) and np.array_equal(y, ry) and np.array_equal(q, rq)


def test_compressed_file(tmp_path):
    p = tmp_path / "f.txt.gz"
    p.write_bytes(gzip.compress(TRICKY["comments"]))
    x, y, q = read_letor_dense(p)
    rx, ry, rq = _sklearn(p)
    assert np.array_equal(x, rx) and np.array_equal(y, ry) and np.array_equal(q, rq)


def test_width_option(tmp_path):
    p = tmp_path / "f.txt"
    p.write_bytes(b"1 qid:1 2:1\n")
    assert read_letor_dense(p, num_features=5)[0].shape == (1, 5)
    with pytest.raises(DataFormatError, match="feature index 2 is above `num_features` = 1"):
        read_letor_dense(p, num_features=1)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b"1 qid:1 1:1\n1 qid:1 2:nan\n", "row 2: feature 2"),
        (b"1 qid:1 1:1\n-1 qid:1 1:1\n", "negative"),
        (b"1 qid:1 2:1 1:1\n", "increasing"),
        (b"1 1:1\n", "qid"),
        (b"1 qid:x 1:1\n", "not an integer"),
        (b"1 qid:1 0:1\n", "start at 1"),
        (b"1 qid:1 1:1e39\n", "float32"),
        (b"1 qid:1 1:1:2\n", "row 1"),
        (b"# only a comment\n\n", "no document"),
    ],
)
def test_errors_name_the_line(tmp_path, text, message):
    p = tmp_path / "bad.txt"
    p.write_bytes(text)
    with pytest.raises(DataFormatError, match=message) as dense:
        read_letor_dense(p)
    with pytest.raises(DataFormatError, match=message) as sparse:
        read_letor(p)
    assert str(dense.value) == str(sparse.value)
