"""A user's own LETOR files as a new user writes them: editors' byte-order marks, Windows line endings,
comments, broken compressed files, degenerate queries, and malformed lines through `rankwise train`."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("sklearn")

from typer.testing import CliRunner

from rankwise.cli import app
from rankwise.data import DataFormatError, load_letor, read_letor
from tests.cli_helpers import one_error_line

runner = CliRunner()

TRAIN = "2 qid:1 1:0.5 3:1.5\n0 qid:1 2:-1 3:2\n1 qid:2 1:3\n0 qid:2 2:4 3:0.25\n"
VAL = "1 qid:3 1:1 2:1\n0 qid:3 3:1\n"
TEST = "0 qid:4 1:2\n2 qid:4 2:1 3:1\n"


def _fold(root: Path, train: str = TRAIN, val: str = VAL, test: str = TEST) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in (("train.txt", train), ("vali.txt", val), ("test.txt", test)):
        (root / name).write_bytes(text.encode() if isinstance(text, str) else text)
    return root


def _same(a, b) -> None:
    for s in ("train", "val", "test"):
        assert torch.equal(getattr(a, s).x, getattr(b, s).x) and torch.equal(getattr(a, s).y, getattr(b, s).y)


def test_a_byte_order_mark_is_skipped(tmp_path: Path) -> None:
    bom = b"\xef\xbb\xbf"
    plain = tmp_path / "plain.txt"
    plain.write_text(TRAIN)
    marked = tmp_path / "marked.txt"
    marked.write_bytes(bom + TRAIN.encode())
    zipped = tmp_path / "marked.txt.gz"
    zipped.write_bytes(gzip.compress(bom + TRAIN.encode()))
    want = read_letor(plain)
    for p in (marked, zipped):
        x, y, qid = read_letor(p)
        np.testing.assert_array_equal(x.toarray(), want[0].toarray())
        np.testing.assert_array_equal(y, want[1])
        np.testing.assert_array_equal(qid, want[2])
    # a bad line after the mark still names line 1 and the value, without the mark's bytes
    bad = tmp_path / "bad.txt"
    bad.write_bytes(bom + b"1 qid:1 1:x\n")
    with pytest.raises(DataFormatError, match=r"bad\.txt, row 1: feature 1: cannot parse 'x' as a number"):
        read_letor(bad)


def test_windows_line_endings_tabs_and_comments_read_the_same(tmp_path: Path) -> None:
    clean = load_letor(str(_fold(tmp_path / "clean")))
    crlf = _fold(tmp_path / "crlf", *(t.replace("\n", "\r\n") for t in (TRAIN, VAL, TEST)))
    tabs = _fold(tmp_path / "tabs", TRAIN.replace(" ", "\t"), VAL, TEST)
    noted = _fold(
        tmp_path / "noted",
        "# header comment\n" + TRAIN.replace("\n", " # docid = GX0-1 inc = 0.5\n") + "\n\n",
        VAL,
        TEST.rstrip("\n"),  # no newline at the end of the file
    )
    for root in (crlf, tabs, noted):
        _same(load_letor(str(root)), clean)


@pytest.mark.parametrize("suffix", [".gz", ".bz2"])
def test_a_truncated_compressed_file_is_one_error(tmp_path: Path, suffix: str) -> None:
    import bz2

    compress = gzip.compress if suffix == ".gz" else bz2.compress
    data = compress((TRAIN * 200).encode())
    p = tmp_path / f"train.txt{suffix}"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataFormatError, match=rf"train\.txt\{suffix}: cannot read the file"):
        read_letor(p)
    root = _fold(tmp_path / "d")
    (root / f"train.txt{suffix}").write_bytes(data[: len(data) // 2])
    r = runner.invoke(app, ["data", "show", "letor", "-O", f"path={root}", "-O", f"train=train.txt{suffix}"])
    assert "cannot read the file" in one_error_line(r)


@pytest.mark.parametrize(
    "train",
    [
        "1 qid:1 1:0.5\n1 qid:1 2:1\n1 qid:2 1:3\n",  # every grade equal
        "2 qid:1 1:0.5\n0 qid:2 2:1\n1 qid:3 1:3\n",  # one document per query
    ],
)
def test_training_queries_with_nothing_to_rank_are_noted(tmp_path: Path, train: str) -> None:
    data = load_letor(str(_fold(tmp_path / "d", train=train)))
    (note,) = data.meta["notes"]
    assert "no training query" in note and "train.txt" in note
    assert load_letor(str(_fold(tmp_path / "ok"))).meta["notes"] == []


#: --set overrides of a tiny run of the MSLR preset on a user's folder
ROUTE = ["data.options.fold=null", "trainer.max_epochs=1", "trainer.num_threads=1", "report.plots=false"]


def _train(root: Path, out: Path, *extra: str):
    sets = [a for item in [f"data.options.path={root}", *ROUTE] for a in ("--set", item)]
    return runner.invoke(app, ["train", "mslr_web10k_listnet", "--no-progress", "-o", str(out), *sets, *extra])


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("1 1:0.5 2:1", "row 2: expected `qid:<integer>` after the relevance"),
        ("high qid:1 1:0.5", "row 2: relevance: cannot parse 'high' as a number"),
        ("1 qid:1 1:0.5 2:1.2.3", "row 2: feature 2: cannot parse '1.2.3' as a number"),
        ("1 qid:1 1:nan", "row 2: feature 1: cannot parse 'nan' as a number"),
        ("1 qid:one 1:0.5", "row 2: qid 'one' is not an integer"),
        ("-1 qid:1 1:0.5", "row 2: relevance -1 is negative"),
        ("1 qid:1 2:0.5 1:1", "row 2: feature index 1 after 2: indices must be increasing"),
    ],
)
def test_a_malformed_line_through_the_training_route_is_one_error_line(tmp_path: Path, line: str, message: str):
    root = _fold(tmp_path / "mine", train="2 qid:1 1:0.5 3:1.5\n" + line + "\n")
    r = _train(root, tmp_path / "run")
    assert one_error_line(r).startswith(f"error: {root / 'train.txt'}, {message}")
    assert not (tmp_path / "run").exists()


def test_an_empty_file_or_a_missing_folder_through_the_training_route(tmp_path: Path) -> None:
    root = _fold(tmp_path / "mine", val="")
    line = one_error_line(_train(root, tmp_path / "run"))
    assert line.startswith(f"error: {root / 'vali.txt'}: no document in the file")
    line = one_error_line(_train(tmp_path / "nowhere", tmp_path / "run"))
    assert line.startswith(f"error: {tmp_path / 'nowhere'}: LETOR folder not found") and "data.options.path" in line
    sets = [a for item in [f"data.options.path={root}", *ROUTE] for a in ("--set", item)]
    r = runner.invoke(app, ["train", "yahoo_ltr_listnet", "--no-progress", "-o", str(tmp_path / "run"), *sets])
    line = one_error_line(r)  # the Yahoo preset's file names on a folder of train.txt / vali.txt / test.txt
    assert line.startswith(f"error: {root / 'set1.train.txt'}: the train file is missing")
    assert "data.options.train" in line


def test_an_existing_run_directory_is_refused_before_the_data_are_read(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    root = _fold(tmp_path / "mine", train="1 qid:1 1:x\n")  # a bad file: it would be the error if it were read
    r = _train(root, out)
    assert one_error_line(r).startswith(f"error: run directory {out} already exists") and "warning" not in r.output
    assert (out / "notes.txt").read_text() == "mine"  # nothing of the user's deleted
    line = one_error_line(_train(root, out, "--overwrite"))
    assert "refuses to delete" in line and (out / "notes.txt").is_file()
