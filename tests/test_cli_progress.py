"""Progress lines of the long steps outside training: reading a LETOR file, checking and caching a NIfTI
cohort, predicting the blocks of a file; shown after a delay (small here), never for a fast step, never
outside the commands or with ``--no-progress``; and what the small commands import."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rankwise import _progress
from rankwise._progress import Steps, progress_lines
from tests.cli_helpers import TINY, cli_in_fresh_interpreter


def _letor(path: Path, documents: int = 3000) -> Path:
    path.write_text("".join(f"{i % 3} qid:{i // 10} 1:{i % 7}.5 3:1.25 # d{i}\n" for i in range(documents)))
    return path


def test_lines_only_inside_progress_lines_after_the_delay(capsys, monkeypatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(_progress.time, "perf_counter", lambda: clock[0])

    def run() -> str:
        with Steps("reading f.txt", 4e6, "bytes") as steps:
            for _ in range(4):
                clock[0] += 1.5
                steps.advance(1e6)
        return capsys.readouterr().err

    assert run() == ""  # a library call: no lines
    with progress_lines():  # after 2 s: at most a line per 2 s, and the last line
        assert run().splitlines() == [
            "reading f.txt: 2.0/4.0 MB (50%), 3 s, ETA 3 s",
            "reading f.txt: 4.0/4.0 MB (100%), 6 s, ETA 0 s",
            "reading f.txt: 4.0/4.0 MB, done in 6 s",
        ]
    with progress_lines(False):
        assert run() == ""
    with progress_lines(delay=10):  # done before the delay: no line at all
        assert run() == ""
    with progress_lines(delay=0, every=0):
        with Steps("predicting x.csv", unit="rows") as steps:
            steps.advance(100_000)
        assert capsys.readouterr().err.splitlines() == [
            "predicting x.csv: 100000 rows, 0 s",
            "predicting x.csv: 100000 rows, done in 0 s",
        ]


def test_letor_reading_shows_the_bytes_of_both_passes(tmp_path, capsys, monkeypatch) -> None:
    import rankwise.data.letor as letor

    p = _letor(tmp_path / "train.txt")
    x, _, _ = letor.read_letor_dense(p)
    assert capsys.readouterr().err == ""  # outside a command
    with progress_lines():  # a fast read: before the 2 s delay
        letor.read_letor_dense(p)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(letor, "_BLOCK_BYTES", 10_000)
    with progress_lines(delay=0, every=0):
        again, _, _ = letor.read_letor_dense(p)
    np.testing.assert_array_equal(again, x)
    lines = capsys.readouterr().err.splitlines()
    size = 2 * p.stat().st_size / 1e6
    assert len(lines) > 2 * (p.stat().st_size // 10_000), lines  # a line per block of each pass
    assert all(ln.startswith("reading train.txt (2 passes): ") for ln in lines)
    assert lines[-1] == f"reading train.txt (2 passes): {size:.1f}/{size:.1f} MB, done in 0 s"


def test_nifti_caching_counts_the_volumes(tmp_path, capsys) -> None:
    pytest.importorskip("nibabel")
    pytest.importorskip("torchio")
    from rankwise.data import load_nifti_csv
    from tests.data.test_nifti_data import _cohort

    csv = _cohort(tmp_path, n=6)
    with progress_lines(delay=0, every=0):
        load_nifti_csv(str(csv), cache_dir=str(tmp_path / "cache"), val_fraction=0.2, test_fraction=0.2)
    lines = capsys.readouterr().err.splitlines()
    what = "checking and caching the volumes of cohort.csv"
    assert lines[0].startswith(f"{what}: 1/6 volumes (17%), ") and "ETA" in lines[0], lines
    assert lines[-1].startswith(f"{what}: 6/6 volumes, done in ")
    with progress_lines():  # the cached cohort again: fast, no line
        load_nifti_csv(str(csv), cache_dir=str(tmp_path / "cache"), val_fraction=0.2, test_fraction=0.2)
    assert capsys.readouterr().err == ""


@pytest.fixture(scope="module")
def table_run(tmp_path_factory) -> Path:
    pytest.importorskip("lightning")
    pytest.importorskip("sklego")
    from rankwise.recipes import load_config
    from rankwise.recipes.runner import train

    root = tmp_path_factory.mktemp("progress_run")
    cfg = load_config("abalone_vanilla", [*TINY, "report.plots=true", "report.tsne=false"])
    return train(cfg, out=root / "run", progress=False, verbose=False).run_dir


def test_predict_prints_progress_lines_and_none_with_no_progress(table_run, tmp_path, monkeypatch) -> None:
    import zipfile

    from typer.testing import CliRunner

    from rankwise.cli import app
    from rankwise.data.tabular import abalone_path

    with zipfile.ZipFile(abalone_path()) as z:
        rows = z.read(z.namelist()[0]).decode().splitlines()
    data = tmp_path / "new.csv"
    data.write_text("\n".join(rows[:1201]) + "\n")
    monkeypatch.setattr(_progress, "DELAY_S", 0.0)
    monkeypatch.setattr(_progress, "EVERY_S", 0.0)
    run = tmp_path / "run"
    shutil.copytree(table_run, run, ignore=shutil.ignore_patterns(".lock"))
    runner = CliRunner()
    args = ["predict", str(run), "--data", str(data), "--out", str(tmp_path / "p.csv"), "--overwrite"]
    r = runner.invoke(app, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith("predicting new.csv: ")]
    # an abalone run predicts the file as one block (a `csv` table run reads it in blocks of 100,000 rows)
    assert lines[0].startswith("predicting new.csv: 1200 rows, ") and "done" not in lines[0], r.output
    assert len(lines) == 2 and lines[1].startswith("predicting new.csv: 1200 rows, done in "), r.output
    quiet = runner.invoke(app, [*args, "--no-progress"], catch_exceptions=False)
    assert quiet.exit_code == 0 and "predicting new.csv" not in quiet.output, quiet.output
    assert "1200 row(s) predicted" in quiet.output


def test_small_commands_import_what_they_need_only(table_run, tmp_path) -> None:
    """`evaluate` of a table run whose plots were drawn after training imports no Lightning, matplotlib,
    pandas, scikit-learn;
    `config RECIPE` imports no torch (its rows are stored: tests/recipes check they are current)."""
    run = tmp_path / "run"
    shutil.copytree(table_run, run, ignore=shutil.ignore_patterns(".lock"))
    probe, output = cli_in_fresh_interpreter(["evaluate", str(run)])
    assert probe == {"code": 0, "heavy": []}, output
    code = (
        "import sys, contextlib, io\nfrom rankwise.cli import main\n"
        "for argv in (['config', 'dir'], ['config', 'brain_age'], ['--help']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "        main(argv)\n"
        "print(sorted(m for m in ('torch', 'numpy', 'lightning') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
