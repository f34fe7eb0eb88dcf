"""Predictions of a table run read and written block by block: the file equals the one-block result, the
reader's blocks are the whole-file reader's rows, and a bad row is the same one error line."""

from __future__ import annotations

import csv
import gzip
import zipfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("typer")
pytest.importorskip("lightning")

from typer.testing import CliRunner

from rankwise.cli import app
from rankwise.data import DataFormatError
from rankwise.data.tabular import iter_feature_rows, read_feature_rows
from rankwise.recipes import predict, write_predictions
from rankwise.recipes.own_data import own_data_config
from rankwise.recipes.runner import predict_blocks, train, write_prediction_blocks
from tests.cli_helpers import TINY, one_error_line


def _write(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return path


@pytest.fixture(scope="module")
def table_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    rng = np.random.default_rng(1)
    rows = []
    for _ in range(200):
        a, b = rng.normal(size=2) * [1.0, 30.0]
        rows.append([f"{a:.4f}", f"{b:.3f}", f"{10 + 2 * a + 0.1 * b + rng.normal():.3f}"])
    root = tmp_path_factory.mktemp("blocks")
    path = _write(root / "t.csv", ["a", "b", "y"], rows)
    cfg, _ = own_data_config(path, "y", "vanilla", overrides=TINY)
    run = train(cfg, out=root / "run", progress=False, verbose=False).run_dir
    # new rows: the columns in another order, a text column and a quoted field with a comma and a newline
    new = [[f"id {i}", r[1], r[0], r[2]] for i, r in enumerate(rows[:53])]
    new[5][0] = 'a "quoted", multi\nline id'
    return run, _write(root / "new.csv", ["id", "b", "a", "y"], new)


@pytest.mark.parametrize("block_rows", [1, 7, 53, 1000])
def test_block_predictions_are_the_whole_file_s(table_run: tuple[Path, Path], tmp_path: Path, block_rows: int) -> None:
    run, new = table_run
    whole = write_predictions(predict(run, new), tmp_path / "whole.csv")
    blocks = list(predict_blocks(run, new, block_rows=block_rows))
    assert len(blocks) == -(-53 // block_rows)  # the file was read block by block
    written, rows = write_prediction_blocks(blocks, tmp_path / "blocks.csv")
    assert rows == 53 and written.read_bytes() == whole.read_bytes()


def test_cli_predict_streams_and_reports_the_mae(table_run: tuple[Path, Path], tmp_path: Path) -> None:
    run, new = table_run
    whole = write_predictions(predict(run, new), tmp_path / "whole.csv")
    r = CliRunner().invoke(app, ["predict", str(run), "--data", str(new), "--out", str(tmp_path / "p.csv")])
    assert r.exit_code == 0, r.output
    assert "53 row(s) predicted" in r.output and "MAE" in r.output
    assert (tmp_path / "p.csv").read_bytes() == whole.read_bytes()


def test_a_bad_row_in_a_later_block_is_one_error_line_and_no_file(table_run: tuple[Path, Path], tmp_path: Path) -> None:
    run, new = table_run
    lines = new.read_text().splitlines(keepends=True)
    bad = tmp_path / "bad.csv"
    bad.write_text("".join([*lines[:40], "id x,1_000,2,3\n", *lines[40:]]))
    with pytest.raises(DataFormatError) as whole:
        predict(run, bad)
    with pytest.raises(DataFormatError) as streamed:
        list(predict_blocks(run, bad, block_rows=4))
    assert str(streamed.value) == str(whole.value)
    out = tmp_path / "p.csv"
    line = one_error_line(CliRunner().invoke(app, ["predict", str(run), "--data", str(bad), "--out", str(out)]))
    assert "row 40" in line and "'b'" in line and not out.exists()


def _table(tmp_path: Path) -> tuple[Path, list[str]]:
    text = 'x,b,a\n"1,5",2,1\n\ny, 4 ,3.5\nz,6,-.5\nw,\t8,1e3\n'
    path = tmp_path / "t.csv"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    return path, ["a", "b"]


@pytest.mark.parametrize("kind", ["plain", "gz", "zip"])
def test_blocks_concatenate_to_the_whole_reader_s_rows(tmp_path: Path, kind: str) -> None:
    path, names = _table(tmp_path)
    if kind == "gz":
        path = tmp_path / "t.csv.gz"
        path.write_bytes(gzip.compress(_table(tmp_path)[0].read_bytes()))
    elif kind == "zip":
        with zipfile.ZipFile(tmp_path / "t.zip", "w") as zf:
            zf.write(_table(tmp_path)[0], "t.csv")
        path = tmp_path / "t.zip"
    whole = read_feature_rows(path, names)
    for block_rows in (1, 3, 100):
        blocks = list(iter_feature_rows(path, names, block_rows=block_rows))
        assert all(len(b.rows) <= block_rows for b in blocks) and len(blocks) == -(-4 // block_rows)
        assert [r for b in blocks for r in b.rows] == whole.rows and blocks[0].header == whole.header
        np.testing.assert_array_equal(np.concatenate([b.features for b in blocks]), whole.features)


def test_block_reader_edge_cases_and_errors(tmp_path: Path) -> None:
    head = tmp_path / "head.csv"
    head.write_text("a,b\n")
    (only,) = iter_feature_rows(head, ["a", "b"])
    assert only.rows == [] and only.features.shape == (0, 2)
    for text in ("", "a,b\n1,2\n3\n", "b\n1\n", "a,b\n1,2\n3,inf\n", "a,b\n1,2\n3,4e39\n", "a,b\n1,2\n,4\n1_0,x\n"):
        path = tmp_path / "e.csv"
        path.write_text(text)
        with pytest.raises(DataFormatError) as whole:
            read_feature_rows(path, ["a", "b"])
        with pytest.raises(DataFormatError) as streamed:
            list(iter_feature_rows(path, ["a", "b"], block_rows=1))
        assert str(streamed.value) == str(whole.value)
    latin = tmp_path / "latin.csv"
    latin.write_bytes(b"a,b\n1,2\n3,\xe94\n")
    with pytest.raises(DataFormatError) as whole:
        read_feature_rows(latin, ["a", "b"])
    with pytest.raises(DataFormatError) as streamed:
        list(iter_feature_rows(latin, ["a", "b"]))
    assert str(streamed.value) == str(whole.value) and "byte 0xe9 on line 3" in str(whole.value)
    with pytest.raises(ValueError, match="`block_rows` must be a positive int, got 0"):
        next(iter_feature_rows(head, ["a"], block_rows=0))
