"""The test run names the parity tests it skips for want of torchsort / diffsort, and how to run them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_skipped_parity_tests_are_named_with_their_install_command(tmp_path):
    (tmp_path / "test_refs.py").write_text(
        "import pytest\n"
        "@pytest.mark.parametrize('i', range(3))\n"
        "def test_isotonic(i):\n"
        "    pytest.skip(\"could not import 'torchsort': No module named 'torchsort'\")\n"
        "def test_network():\n"
        "    pytest.skip(\"could not import 'diffsort': No module named 'diffsort'\")\n"
        "def test_other():\n"
        "    pytest.skip('not a parity test')\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "5 skipped" in r.stdout, r.stdout + r.stderr
    lines = [ln for ln in r.stdout.splitlines() if "parity test(s)" in ln]
    assert lines == [
        "3 parity test(s) against torchsort skipped (torchsort is not installed); to run them: "
        "pip install --no-build-isolation torchsort  (builds from source: a C++ compiler, a few minutes)",
        "1 parity test(s) against diffsort skipped (diffsort is not installed); to run them: "
        'pip install -e ".[parity]"',
    ], r.stdout
