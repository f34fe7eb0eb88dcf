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


BRAIN_AGE_JSON = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "ordinal_brain_age.json"


def _cell(mean: float, std: float, digits: int) -> str:
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def _diff(vs: dict) -> str:
    p = vs["p_paired_t"]
    shown = "–" if p is None else "< 0.001" if p < 0.001 else f"{p:.3f}"
    return f"{vs['diff_mean']:+.2f} ± {vs['diff_sd']:.2f} (p {shown})"


def test_brain_age_ordinal_table_is_its_json():
    """docs/results.md 9b: every number of the table is the JSON's (benchmarks/ordinal_brain_age.py), with
    its commit on the provenance line."""
    import json

    report = json.loads(BRAIN_AGE_JSON.read_text(encoding="utf-8"))
    lines = RESULTS.read_text(encoding="utf-8").splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("### 9b."))
    (first, end) = next((s, e) for s, e in tables(lines) if s > start)
    rows = {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[2:-1]] for ln in lines[first + 2 : end]}
    assert len(rows) == len(report["methods"]) == 12
    for preset, m in report["methods"].items():
        cells = rows[f"{m['label']} (`{preset}`)"]
        mean, std = m["mean"], m["std"]
        want = [_cell(mean[k], std[k], 2) for k in ("mae", "mae_many", "mae_medium", "mae_few")]
        want += [_cell(mean[k], std[k], 3) for k in ("qwk", "pearson")]
        want += ["–", "–"] if "vs_l1" not in m else [_diff(m["vs_l1"]["mae"]), _diff(m["vs_l1"]["mae_few"])]
        assert [c.replace("**", "") for c in cells] == want, preset
    after = next(ln for ln in lines[end : end + 3] if ln.strip())
    assert f"`{report['commit'][:7]}`" in after and report["date"][:10] in after
    assert f"{report['cohort']['mean_predictor_test_mae']:.2f}" in "\n".join(lines[start:end])
