"""Every table of docs/results.md says which rankwise commit and torch version made its numbers."""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results.md"
PROVENANCE = re.compile(
    r"^\*Numbers recorded in rankwise commit `[0-9a-f]{7,40}` \(\d{4}-\d{2}-\d{2}[^)]*\); torch .+\*$"
)


def tables(lines: list[str]) -> list[tuple[int, int]]:
    out, i = [], 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            j = i
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            out.append((i, j))
            i = j
        else:
            i += 1
    return out


def test_every_results_table_names_its_commit_and_torch_version():
    lines = RESULTS.read_text(encoding="utf-8").splitlines()
    found = tables(lines)
    assert len(found) >= 17
    for start, end in found:
        after = next((ln for ln in lines[end : end + 3] if ln.strip()), "")
        assert PROVENANCE.match(after), f"docs/results.md line {start + 1}: the table is followed by {after!r}"
