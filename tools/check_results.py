"""Re-run the quick tables of the docs and report every figure that differs from them.

    python tools/check_results.py --quick              # ~5-10 min on 2 CPU cores
    python tools/check_results.py --quick --only abalone_dir --seeds 0
    python tools/check_results.py --quick --reuse runs/check_results   # report again from finished runs

Each check names a table of docs/results.md (or README.md), the `rankwise compare` command that made
it, and the figures it checks: a table cell ``m ± s`` (mean ± std over seeds) or a per-seed value.
A figure DIFFERS when the re-run is further from the docs than the stated ``±`` (for a value
printed without one, half a unit of its last printed digit: a seeded run must reproduce it); it is
CHANGED when it moved within the ``±``. The report (markdown, also OUT/check_results.md) gives the
docs value, the re-run value and the difference of every figure, with the rankwise commit and torch
version of the re-run; the exit status is 1 when a figure DIFFERS.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Figure:
    """One checked figure: where it is in the docs, and which metric of which run gives it."""

    table: str
    row: str  # the docs row, e.g. the preset name
    column: str
    docs: float
    plus_minus: float | None  # the docs' ± (None: a per-seed value printed without one)
    digits: int  # decimals printed in the docs
    metric: tuple[str, ...]  # path in metrics.json, e.g. ("test", "all", "mae")
    method: str  # the preset (compare's method key)
    seed: int | None  # a per-seed figure, or None for the mean over the seeds


@dataclass
class Check:
    name: str
    doc: str
    title: str
    command: list[str]
    seeds: list[int]
    figures: list[Figure] = field(default_factory=list)
    #: another check whose runs give these figures (the same command)
    runs_from: str | None = None


_CELL = re.compile(r"^\s*(-?[\d.]+)\s*±\s*([\d.]+)")


def _decimals(text: str) -> int:
    return len(text.split(".")[1]) if "." in text else 0


def _table_rows(doc: Path, header_start: str) -> tuple[list[str], list[list[str]]]:
    """The markdown table whose header row starts with ``header_start``: (header cells, rows of cells)."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if line.startswith(header_start):
            header = [c.strip() for c in line.strip().strip("|").split("|")]
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append([c.strip() for c in row.strip().strip("|").split("|")])
            return header, rows
    raise SystemExit(f"{doc}: no table whose header starts with {header_start!r}")


def _abalone_dir() -> Check:
    """docs/results.md section 7: the DIR methods on abalone (also the README demo's and RankSim's figures)."""
    presets = [
        "abalone_vanilla",
        "abalone_lds",
        "abalone_fds",
        "abalone_lds_fds",
        "abalone_balanced_mse",
        "abalone_ranksim",
        "abalone_ranksim_lds",
    ]
    check = Check(
        "abalone_dir",
        "docs/results.md",
        "abalone, DIR methods, seeds 0, 1, 2 (section 7)",
        [
            "compare",
            *presets,
            "--set",
            "run.plots=false",
            "--set",
            "run.tsne=false",
            "--set",
            "trainer.num_threads=1",
        ],
        [0, 1, 2],
    )
    columns = {
        "MAE all": ("test", "all", "mae"),
        "MAE many": ("test", "many", "mae"),
        "MAE medium": ("test", "medium", "mae"),
        "MAE few": ("test", "few", "mae"),
        "GM all": ("test", "all", "gmean"),
        "GM few": ("test", "few", "gmean"),
        "Pearson": ("test", "pearson"),
    }
    header, rows = _table_rows(ROOT / check.doc, "| method | seeds | MAE all")
    for cells in rows:
        m = re.search(r"\(`(\w+)`\)", cells[0])
        if m is None or m.group(1) not in presets:
            continue
        for col, path in columns.items():
            cell = _CELL.match(cells[header.index(col)])
            if cell is None:
                continue
            check.figures.append(
                Figure(
                    check.name,
                    m.group(1),
                    col,
                    float(cell.group(1)),
                    float(cell.group(2)),
                    _decimals(cell.group(1)),
                    path,
                    m.group(1),
                    None,
                )
            )
    return check


def _sort_n3() -> Check:
    """docs/results.md Table 1b: NeuralSort at n = 3, 200 steps, seed 0 (fully correct, positions)."""
    check = Check(
        "sort_n3",
        "docs/results.md",
        "Table 1b, deterministic NeuralSort, n = 3, 200 steps, seed 0",
        [
            "compare",
            "large_mnist_neuralsort",
            "--set",
            "task.n=3",
            "--set",
            "task.steps=200",
            "--set",
            "task.steps_per_epoch=25",
            "--set",
            "task.downsample=2",
            "--set",
            "trainer.num_threads=1",
            "--set",
            "task.bn_recalibration=20",
        ],
        [0],
    )
    header, rows = _table_rows(ROOT / check.doc, "| method | n = 3 (3 seeds)")
    row = next(r for r in rows if r[0] == "NeuralSort, deterministic")
    cell = row[header.index("n = 3 (3 seeds)")]
    m = re.match(r"([\d.]+) ± ([\d.]+) \(([\d.]+) / ([\d.]+) / ([\d.]+)\) \(([\d.]+)\)", cell)
    if m is None:
        raise SystemExit(f"{check.doc}: cannot read the Table 1b cell {cell!r}")
    seed0 = m.group(3)
    check.figures.append(
        Figure(
            check.name,
            "NeuralSort n = 3",
            "fully correct, seed 0",
            float(seed0),
            None,
            _decimals(seed0),
            ("test", "all_correct"),
            "large_mnist_neuralsort",
            0,
        )
    )
    return check


def _readme_demo() -> Check:
    """README.md: the demo's table (L1, +LDS, Balanced MSE over seeds 0, 1, 2): the runs of ``abalone_dir``."""
    base = _abalone_dir()
    check = Check(
        "readme_demo", "README.md", "the README demo's table", base.command, base.seeds, runs_from="abalone_dir"
    )
    rows = {
        "L1 (vanilla)": "abalone_vanilla",
        "+LDS (sqrt_inv)": "abalone_lds",
        "Balanced MSE (BMC)": "abalone_balanced_mse",
    }
    header, table = _table_rows(ROOT / check.doc, "| MAE | all | many | medium | few |")
    for cells in table:
        if cells[0] not in rows:
            continue
        for col in ("all", "many", "medium", "few"):
            cell = _CELL.match(cells[header.index(col)])
            if cell is not None:
                check.figures.append(
                    Figure(
                        check.name,
                        cells[0],
                        f"MAE {col}",
                        float(cell.group(1)),
                        float(cell.group(2)),
                        _decimals(cell.group(1)),
                        ("test", col, "mae"),
                        rows[cells[0]],
                        None,
                    )
                )
    return check


CHECKS = {"abalone_dir": _abalone_dir, "readme_demo": _readme_demo, "sort_n3": _sort_n3}


def _get(metrics: dict, path: tuple[str, ...]) -> float | None:
    node = metrics
    for k in path:
        if not isinstance(node, dict) or k not in node or node[k] is None:
            return None
        node = node[k]
    return float(node)


def _provenance() -> str:
    import torch

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "src"], cwd=ROOT, capture_output=True, text=True)
        if dirty.stdout.strip():
            commit += " + uncommitted changes in src/"
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return f"rankwise commit {commit}, torch {torch.__version__}"


def judge(fig: Figure, value: float | None) -> tuple[str, float | None]:
    """``("ok" | "CHANGED" | "DIFFERS" | "MISSING", difference)`` of a re-run value against the docs."""
    if value is None:
        return "MISSING", None
    diff = value - fig.docs
    half_unit = 0.5 * 10.0**-fig.digits
    if abs(diff) <= half_unit + 1e-12:
        return "ok", diff
    tol = fig.plus_minus if fig.plus_minus is not None else half_unit
    return ("CHANGED" if abs(diff) <= max(tol, half_unit) + 1e-12 else "DIFFERS"), diff


def run_check(check: Check, out: Path, seeds: list[int], reuse: bool) -> dict[str, list[dict]]:
    dest = out / check.name
    results = dest / "results.json"
    if not (reuse and results.is_file()):
        cmd = [
            sys.executable,
            "-m",
            "rankwise.cli",
            *check.command,
            "--seeds",
            ",".join(map(str, seeds)),
            "--out",
            str(dest),
        ]
        print("$ rankwise " + " ".join(cmd[3:]), flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True)
    return json.loads(results.read_text())["results"]


def report(checks: list[Check], results: dict[str, dict], seeds: dict[str, list[int]], provenance: str) -> str:
    lines = [f"# Results check ({provenance})", ""]
    for check in checks:
        res = results[check.name]
        lines += [
            f"## {check.title} — {check.doc}",
            "",
            f"`rankwise {' '.join(check.command)} --seeds {','.join(map(str, seeds[check.name]))}`",
            "",
        ]
        lines += ["| row | column | docs | re-run | difference | status |", "|---|---|---|---|---|---|"]
        for fig in check.figures:
            runs = res.get(fig.method, [])
            if fig.seed is not None:
                vals = [_get(r, fig.metric) for r in runs if r.get("seed") == fig.seed]
            else:
                vals = [_get(r, fig.metric) for r in runs]
            vals = [v for v in vals if v is not None]
            value = statistics.fmean(vals) if vals else None
            status, diff = judge(fig, value)
            docs = f"{fig.docs:.{fig.digits}f}" + (f" ± {fig.plus_minus:.{fig.digits}f}" if fig.plus_minus else "")
            if value is not None and fig.seed is None and len(vals) > 1:
                rerun = f"{value:.{fig.digits}f} ± {statistics.pstdev(vals):.{fig.digits}f}"
            else:
                rerun = "–" if value is None else f"{value:.{fig.digits}f}"
            delta = "–" if diff is None else f"{diff:+.{fig.digits + 1}f}"
            lines.append(f"| {fig.row} | {fig.column} | {docs} | {rerun} | {delta} | {status} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the quick tables (the only ones checked today)")
    parser.add_argument("--only", action="append", choices=sorted(CHECKS), help="check only these tables")
    parser.add_argument("--seeds", help="seeds instead of the table's own (e.g. 0: a reduced scope)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "check_results", help="run directories")
    parser.add_argument("--reuse", action="store_true", help="report from the runs already in --out")
    args = parser.parse_args(argv)
    if not args.quick:
        parser.error("only --quick is implemented: the quick tables of docs/results.md")
    checks = [CHECKS[name]() for name in (args.only or sorted(CHECKS))]
    results, seeds = {}, {}
    for check in checks:
        seeds[check.name] = [int(s) for s in args.seeds.split(",")] if args.seeds else check.seeds
        if check.runs_from is not None and check.runs_from in results:
            results[check.name] = results[check.runs_from]
            continue
        results[check.name] = run_check(check, args.out, seeds[check.name], args.reuse)
    text = report(checks, results, seeds, _provenance())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "check_results.md").write_text(text + "\n", encoding="utf-8")
    print(text)
    return 1 if "| DIFFERS |" in text else 0


if __name__ == "__main__":
    raise SystemExit(main())
