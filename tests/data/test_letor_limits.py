"""The size limits of LETOR files: checked from ``stat``, the decompressed size and the parsed largest
feature index before any dense array is allocated; each refusal names the file, the value and the limit."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

pytest.importorskip("sklearn")

from rankwise.data import DataFormatError, load_letor, read_letor
from rankwise.data import letor as letor_module
from rankwise.data._files import MAX_FEATURE_INDEX, MAX_LETOR_BYTES, check_file

GOOD = "2 qid:1 1:0.5 2:1.5\n0 qid:1 1:-1 3:0.25\n1 qid:2 2:1\n0 qid:2 1:2\n"


def _folder(root: Path, train: str = GOOD) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.txt").write_text(train)
    (root / "vali.txt").write_text(GOOD)
    (root / "test.txt").write_text(GOOD)
    return root


def test_a_huge_feature_index_is_refused_at_its_line(tmp_path):
    d = _folder(tmp_path / "d", "1 qid:1 1:0.5\n1 qid:1 1000000000:0.5\n")
    with pytest.raises(DataFormatError) as err:
        load_letor(str(d))  # num_features None: the largest index would be the feature count
    msg = str(err.value)
    assert err.value.row == 2 and "train.txt" in msg
    assert "1000000000" in msg and f"{MAX_FEATURE_INDEX:,}" in msg


def test_many_documents_with_a_large_index_are_refused(tmp_path):
    lines = "".join(f"{i % 3} qid:{1 + i // 20} 1:0.5 2000000:0.25\n" for i in range(400))
    with pytest.raises(DataFormatError, match="2000000 is above the limit"):
        load_letor(str(_folder(tmp_path / "d", lines)))


@pytest.mark.parametrize("reader", ["read_letor", "load_letor"])
def test_num_features_above_the_limit_is_refused(tmp_path, reader):
    d = _folder(tmp_path / "d")
    with pytest.raises(ValueError, match=r"num_features.*at most 100,000.*got 1000000000"):
        if reader == "read_letor":
            read_letor(d / "train.txt", num_features=10**9)
        else:
            load_letor(str(d), num_features=10**9)


def test_dense_features_beyond_the_limit_are_refused_before_they_are_allocated(tmp_path, monkeypatch):
    d = _folder(tmp_path / "d")
    monkeypatch.setattr(letor_module, "MAX_DENSE_ELEMENTS", 20)  # 12 documents x 3 features = 36
    allocated = []
    monkeypatch.setattr(letor_module, "_dense", lambda *a: allocated.append(a))
    with pytest.raises(DataFormatError) as err:
        load_letor(str(d))
    msg = str(err.value)
    assert str(d) in msg and "12 documents x 3 features = 36" in msg and "limit of 20" in msg
    assert not allocated


def test_a_big_sparse_file_is_refused_from_its_size(tmp_path):
    d = _folder(tmp_path / "d")
    with open(d / "train.txt", "ab") as f:
        f.truncate(6 * 2**30)  # sparse: no disk used; the check reads only `stat`
    with pytest.raises(DataFormatError) as err:
        load_letor(str(d))
    msg = str(err.value)
    assert "train.txt" in msg and "6,442,450,944 bytes" in msg and f"{MAX_LETOR_BYTES:,}" in msg


def test_the_decompressed_content_of_a_gz_file_is_limited(tmp_path, monkeypatch):
    d = _folder(tmp_path / "d")
    (d / "train.txt").unlink()
    with gzip.open(d / "train.txt.gz", "wb") as f:
        f.write(b"\0" * 50_000)  # compresses to a few hundred bytes: one huge line
    monkeypatch.setattr(letor_module, "MAX_LETOR_BYTES", 10_000)
    with pytest.raises(DataFormatError, match=r"decompressed content of [\d,]+ bytes or more .* limit of 10,000"):
        load_letor(str(d), train="train.txt.gz")


def test_check_file_refuses_a_file_above_max_bytes_from_stat(tmp_path):
    p = tmp_path / "big.csv"
    with open(p, "wb") as f:
        f.truncate(5000)
    assert check_file(p, max_bytes=5000) == p
    with pytest.raises(DataFormatError, match=r"big\.csv: the file of 5,000 bytes .* limit of 4,999 bytes"):
        check_file(p, max_bytes=4999)
