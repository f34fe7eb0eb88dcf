"""The large-MNIST table of the newer relaxations, from the comparisons' JSON (docs/results.md).

``DIR`` holds one folder per list length, each the ``results.json`` of a ``rankwise compare`` run:
``curves_n3``, ``curves_n5``, ``curves_n7`` (200 steps, best checkpoint), ``relax_n15_600`` (600 steps;
``last.json``: the test metrics of the last checkpoint, ``rankwise evaluate --checkpoint last``), and
``anchor_n3`` ... (deterministic NeuralSort at the same commit, seed 0). ``provenance.json`` records the
commit, date, machine and load. Cells: fully correct lists as mean ± std (ddof 0) over seeds with the
per-seed values, the positions' mean in brackets (n = 15: lists out of 1,000 per seed, positions at
step 600).

    python tools/sort_relaxation_table.py --markdown benchmarks/results/large_mnist_newer_relaxations
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

ROWS = {
    "large_mnist_lapsum": "LapSum soft ranks",
    "large_mnist_diffsort_odd_even_error_free": "diffsort odd-even, error-free swaps",
    "large_mnist_diffsort_bitonic_error_free": "diffsort bitonic, error-free swaps",
    "large_mnist_gumbel_sinkhorn": "Gumbel-Sinkhorn",
    "large_mnist_neuralsort": "NeuralSort, deterministic (same commit, seed 0)",
}


def _runs(path: Path, preset: str) -> list[dict]:
    if not path.exists():
        return []
    return sorted(json.loads(path.read_text())["results"].get(preset, []), key=lambda r: r["seed"])


def _short(runs: list[dict]) -> str:
    if not runs:
        return "–"
    a = [r["test"]["all_correct"] for r in runs]
    p = [r["test"]["rank_correct"] for r in runs]
    if len(a) == 1:
        return f"{a[0]:.3f} ({p[0]:.3f})"
    per = " / ".join(f"{v:.3f}" for v in a)
    return f"{statistics.fmean(a):.3f} ± {statistics.pstdev(a):.3f} ({per}) ({statistics.fmean(p):.3f})"


def _long(runs: list[dict]) -> str:
    if not runs:
        return "–"
    lists = " / ".join(str(round(r["test"]["all_correct"] * 1000)) for r in runs)
    p = [r["test"]["rank_correct"] for r in runs]
    per = " / ".join(f"{v:.3f}" for v in p)
    return f"{lists}; {statistics.fmean(p):.3f} ± {statistics.pstdev(p):.3f} ({per})"


def markdown(folder: Path) -> str:
    prov = json.loads((folder / "provenance.json").read_text())
    lines = [
        "| relaxation | n = 3 | n = 5 | n = 7 | n = 15, 600 steps: lists of 1,000; positions at step 600 |",
        "|---|---|---|---|---|",
    ]
    for preset, label in ROWS.items():
        short = "anchor_n{}" if preset == "large_mnist_neuralsort" else "curves_n{}"
        cells = [_short(_runs(folder / short.format(n) / "results.json", preset)) for n in (3, 5, 7)]
        cells.append(_long(_runs(folder / "relax_n15_600" / "last.json", preset)))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        f"*Numbers recorded in rankwise commit `{prov['commit']}` ({prov['date']}, {prov['machine']}, "
        f"{prov['threads']} thread per run, load average {prov['load']}); torch {prov['torch']}.*"
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", type=Path, required=True, metavar="DIR")
    print(markdown(ap.parse_args().markdown), end="")


if __name__ == "__main__":
    main()
