"""The generated blocks of README.md and docs/*.md are what their commands print (``tools/docs_tables.py``).

The commands only read JSON under ``benchmarks/results/``: no GPU, no network, nothing measured.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def docs_tables():
    spec = importlib.util.spec_from_file_location("docs_tables", REPO / "tools" / "docs_tables.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["docs_tables"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_generated_blocks_are_current() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "docs_tables.py"), "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 stale, 0 failing" in proc.stdout


def test_benchmarks_page_is_generated(docs_tables) -> None:
    found = docs_tables.blocks(REPO / "docs" / "benchmarks.md")
    assert len(found) >= 4
    assert all("--markdown benchmarks/results/" in b.command for b in found)


def _toy_repo(tmp_path: Path, body: str) -> Path:
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "toy.py").write_text("print('| a |\\n|---|\\n| 1 |')\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(
        f"# Page\n\nprose\n\n<!-- generated: python benchmarks/toy.py --markdown x.json -->\n{body}"
        "<!-- end generated -->\n\nmore prose\n"
    )
    return tmp_path


def test_check_names_a_stale_block_and_write_fixes_it(docs_tables, tmp_path, capsys) -> None:
    repo = _toy_repo(tmp_path, "| a |\n|---|\n| 2 |\n")
    assert docs_tables.main(["--check", "--repo", str(repo)]) == 1
    out = capsys.readouterr().out
    assert "docs/page.md:5: stale: python benchmarks/toy.py --markdown x.json" in out
    assert "-| 2 |" in out and "+| 1 |" in out
    assert docs_tables.main(["--write", "--repo", str(repo)]) == 0
    text = (repo / "docs" / "page.md").read_text()
    assert "| a |\n|---|\n| 1 |\n<!-- end generated -->\n\nmore prose\n" in text
    assert text.startswith("# Page\n\nprose\n\n<!-- generated:")
    assert docs_tables.main(["--check", "--repo", str(repo)]) == 0


def test_current_block_passes(docs_tables, tmp_path) -> None:
    repo = _toy_repo(tmp_path, "| a |\n|---|\n| 1 |\n")
    assert docs_tables.main(["--check", "--repo", str(repo)]) == 0


def test_only_repository_scripts_are_run(docs_tables, tmp_path) -> None:
    with pytest.raises(ValueError, match=r"python benchmarks/SCRIPT\.py"):
        docs_tables.argv_of("rm -rf /", tmp_path)
    with pytest.raises(ValueError, match="under benchmarks/ or tools/"):
        docs_tables.argv_of("python -c 'print(1)'", tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        docs_tables.argv_of("python benchmarks/missing.py", tmp_path)
