"""The compiled CSV reading of :func:`load_csv` gives the values (and the errors) of the row-by-row reading."""

from __future__ import annotations

import numpy as np
import pytest

from rankwise.data import DataFormatError, load_csv
from rankwise.data import tabular as tabular_mod


def _rows(n: int = 60, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        a = repr(float(rng.normal() * 10.0 ** rng.integers(-30, 30)))
        b = "".join(map(str, rng.integers(0, 10, size=rng.integers(1, 24))))
        out.append(f"{a}, {b}e{rng.integers(-40, 10)} ,{i % 7},name{i},{i * 0.5}")
    return out


HEADER = "a,b,c,label,y"
TRICKY = {
    "plain": HEADER + "\n" + "\n".join(_rows()) + "\n",
    "crlf": HEADER + "\r\n" + "\r\n".join(_rows()) + "\r\n",
    "bom_no_final_newline": "\ufeff" + HEADER + "\n" + "\n".join(_rows()),
    "blank_lines": HEADER + "\n\n" + "\n\n".join(_rows()) + "\n\n\r\n",
    "spaces_signs": HEADER + "\n" + "\n".join(f" -0 ,+.5e1,\t{i}. , x ,{-i}" for i in range(40)) + "\n",
    "quoted": HEADER + "\n" + "\n".join(f'{i},2,3,"a, b",{i}' for i in range(40)) + "\n",
    "latin": HEADER + "\n" + "\n".join(f"{i},2,3,caf\u00e9,{i}" for i in range(40)) + "\n",
}


def _slow(monkeypatch):
    monkeypatch.setattr(tabular_mod._PlainTable, "read", classmethod(lambda cls, path, delimiter: None))


@pytest.mark.parametrize("name", sorted(TRICKY))
def test_same_values_as_row_by_row(tmp_path, monkeypatch, name):
    p = tmp_path / "t.csv"
    p.write_bytes(TRICKY[name].encode())
    fast = load_csv(p, target="y", features=["a", "b", "c"], standardize_features=False)
    plain = tabular_mod._PlainTable.read(p, ",")
    compiled = plain is not None and plain.numbers([4, 0, 1, 2]) is not None
    assert compiled == (name not in ("quoted", "latin"))  # those two are read row by row
    _slow(monkeypatch)
    slow = load_csv(p, target="y", features=["a", "b", "c"], standardize_features=False)
    for split in ("train", "val", "test"):
        fx, fy = getattr(fast, split).x, getattr(fast, split).y
        sx, sy = getattr(slow, split).x, getattr(slow, split).y
        assert np.array_equal(fx.numpy().view(np.uint32), sx.numpy().view(np.uint32))
        assert np.array_equal(fy.numpy(), sy.numpy())
    assert np.array_equal(fast.train_labels, slow.train_labels)


def test_float64_values_before_the_split(tmp_path):
    """The float64 table itself, compared with Python's ``float`` of every field."""
    rows = _rows(200, seed=3)
    p = tmp_path / "t.csv"
    p.write_text(HEADER + "\n" + "\n".join(rows) + "\n")
    plain = tabular_mod._PlainTable.read(p, ",")
    assert plain is not None
    got = plain.numbers([4, 0, 1])
    want = np.array([[float(r.split(",")[k]) for k in (4, 0, 1)] for r in rows])
    assert np.array_equal(got.view(np.uint64), want.view(np.uint64))


@pytest.mark.parametrize(
    "body",
    [
        "1,2,3,x,\n",  # missing target
        "1,,3,x,4\n",  # missing feature
        "1,2,3,x,nan\n",
        "1,2,1e39,x,4\n",
        "1,2,3_0,x,4\n",
        "1,2,3,x\n",  # too few fields
        "1,2,3,x,4,5\n",
        "1,2\r3,x,4\n",  # a lone carriage return
        "",
    ],
)
def test_same_errors(tmp_path, monkeypatch, body):
    p = tmp_path / "bad.csv"
    p.write_text(HEADER + "\n" + "1,2,3,x,4\n" * 5 + body)
    with pytest.raises(DataFormatError) as fast:
        load_csv(p, target="y", features=["a", "b", "c"])
    _slow(monkeypatch)
    with pytest.raises(DataFormatError) as slow:
        load_csv(p, target="y", features=["a", "b", "c"])
    assert str(fast.value) == str(slow.value)
